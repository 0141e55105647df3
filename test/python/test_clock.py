"""The emulated timeline: asynchrony, host blocking points and per-op durations."""

import time

import torch

import torch_emugpu
from torch_emugpu import _C


def busy_s() -> float:
    return _C._engine_stats(0)["compute"][1] / 1e9


def test_compute_ops_do_not_block_the_host():
    torch_emugpu.configure(gpu="k80")
    a = torch.empty(4096, 4096, device="emugpu")
    a @ a  # the first call computes the shape rule; later ones reuse it
    torch.emugpu.synchronize()
    _C._reset_engine_stats(0)
    t0 = time.perf_counter()
    for _ in range(5):
        a = a @ a  # 137 GFLOP each: ~45 ms on an emulated K80
    emulated = busy_s()
    assert emulated > 0.15
    # The core counts every wait of the host for the device: launching waited for none, however slow the host.
    assert _C._engine_stats(0)["host_blocked_ns"] == 0
    torch.emugpu.synchronize()
    assert _C._host_now_ns() >= _C._device_ready_ns(0)
    assert time.perf_counter() - t0 >= emulated * 0.99  # a lower bound: a slow host only adds to it


def test_item_and_cpu_are_sync_points():
    x = torch.ones(8, device="emugpu")
    # The core's clock: each read returns after the kernel queued before it ends, however slow the host.
    kernel_end = _C._emulate_kernel(0, 0.04)
    x.sum().item()
    assert _C._host_now_ns() >= kernel_end
    kernel_end = _C._emulate_kernel(0, 0.04)
    x.cpu()
    assert _C._host_now_ns() >= kernel_end


def test_pageable_copies_block_and_take_link_time():
    torch_emugpu.configure(gpu="v100")  # PCIe 3.0 x16: ~6.3 GB/s pageable
    host = torch.empty(256 * 2**20, dtype=torch.uint8)
    t0 = time.perf_counter()
    host.to("emugpu")
    took = time.perf_counter() - t0
    stats = _C._engine_stats(0)
    assert stats["h2d"][0] == 1
    assert 0.03 < stats["h2d"][1] / 1e9 < 0.06
    assert took >= stats["h2d"][1] / 1e9


def test_matmul_duration_follows_the_tile_model():
    torch_emugpu.configure(gpu="v100")  # SXM2: 80 SMs, 15.7 TFLOP/s
    p = torch_emugpu.kernel_params()
    a = torch.empty(8192, 8192, device="emugpu")
    _C._reset_engine_stats(0)
    a @ a
    flops = 2 * 8192**3
    # 4096 tiles of 128x128 in waves of 80: 52 waves for 51.2 waves' work; the
    # reduction's pipeline fill; one launch.
    expected = (
        flops / (15.7e12 * p["simt_efficiency"]) * 52 / 51.2 * (1 + p["gemm_k_half"] / 8192) + p["launch_ns"] * 1e-9
    )
    assert abs(busy_s() - expected) / expected < 0.01


def test_fp16_matmul_uses_tensor_core_rate():
    torch_emugpu.configure(gpu="v100")
    a = torch.empty(8192, 8192, device="emugpu")
    h = torch.empty(8192, 8192, device="emugpu", dtype=torch.float16)
    _C._reset_engine_stats(0)
    a @ a
    fp32 = busy_s()
    _C._reset_engine_stats(0)
    h @ h
    assert busy_s() < fp32 / 5


def test_elementwise_ops_are_bandwidth_bound_and_views_are_free():
    torch_emugpu.configure(gpu="a100")
    x = torch.empty(64 * 2**20, device="emugpu")  # 256 MiB
    _C._reset_engine_stats(0)
    x.view(-1, 2).t()
    assert _C._engine_stats(0)["compute"][0] == 0
    x.add_(1)
    p = torch_emugpu.kernel_params()
    expected = 2 * x.nbytes / (1555e9 * p["memory_efficiency"]) + p["launch_ns"] * 1e-9
    assert abs(busy_s() - expected) / expected < 0.01


def test_backward_runs_on_autograd_threads_and_is_charged():
    m = torch.nn.Linear(1024, 1024).to("emugpu")
    x = torch.empty(512, 1024, device="emugpu")
    _C._reset_engine_stats(0)
    m(x).sum().backward()
    launches = _C._engine_stats(0)["compute"][0]
    assert launches >= 5  # addmm, sum, and the backward mm's
    assert m.weight.grad is not None and m.weight.grad.device.type == "emugpu"
