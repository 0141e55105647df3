"""pin_memory() and DataLoader(pin_memory=True) get page-locked, cached host
memory; non-blocking copies from it do not block the host."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from torch_emugpu import _C


def test_pin_memory_returns_pinned_tensors_with_the_same_values():
    t = torch.randn(1000)
    p = t.pin_memory()
    assert p.is_pinned() and not t.is_pinned()
    assert torch.equal(p, t)


def test_dataloader_pins_batches():
    ds = torch.utils.data.TensorDataset(torch.randn(16, 3), torch.arange(16))
    batches = list(torch.utils.data.DataLoader(ds, batch_size=4, pin_memory=True))
    assert all(x.is_pinned() and y.is_pinned() for x, y in batches)


def test_non_blocking_copy_from_pinned_memory_does_not_wait_for_the_gpu():
    host = torch.randn(1 << 20).pin_memory()
    side = torch.emugpu.Stream()
    _C._emulate_kernel(0, 0.1)  # the default stream is busy for 100 ms
    blocked = torch.emugpu.engine_stats()["host_blocked_s"]
    with torch.emugpu.stream(side):
        dev = host.to("emugpu", non_blocking=True)
    # The core counts every wait of the host for the device: none here, however slow the host.
    assert torch.emugpu.engine_stats()["host_blocked_s"] == blocked
    side.synchronize()
    assert torch.equal(dev.cpu(), host)


def test_pageable_copy_waits_for_the_stream_it_is_ordered_on():
    host = torch.randn(1 << 10)
    kernel_end = _C._emulate_kernel(0, 0.05)
    host.to("emugpu")
    assert _C._host_now_ns() >= kernel_end  # the core's clock: the copy returned after the kernel's end


def test_freed_pinned_blocks_are_reused():
    a = torch.empty(3000).pin_memory()
    ptr = a.data_ptr()
    del a
    b = torch.empty(3000).pin_memory()
    assert b.data_ptr() == ptr


def test_host_memory_stats_count_pinned_blocks_like_torch_cuda():
    torch.emugpu.reset_accumulated_host_memory_stats()
    before = torch.emugpu.host_memory_stats()
    a = torch.empty(300_000).pin_memory()  # 1.2 MB: a 2 MiB block
    del a
    b = torch.empty(300_000).pin_memory()  # the same block again, from the cache
    s = torch.emugpu.host_memory_stats()
    assert s["requests"] == 2 and s["cache_hits"] >= 1
    assert s["active_bytes.current"] - before["active_bytes.current"] == 2 << 20
    assert s["allocated_bytes.current"] >= s["active_bytes.current"]
    assert s["locked_bytes"] == s["allocated_bytes.current"] or not s["locked"]
    del b
    torch.emugpu.reset_peak_host_memory_stats()
    s = torch.emugpu.host_memory_stats()
    assert s["active_bytes.peak"] == s["active_bytes.current"]
    assert s["cached_bytes"] >= 2 << 20


@pytest.mark.skipif(
    os.geteuid() == 0 and shutil.which("setpriv") is None,
    reason="root locks any amount of memory; dropping CAP_IPC_LOCK needs setpriv (util-linux)",
)
@pytest.mark.slow
def test_beyond_the_lockable_limit_pinned_memory_falls_back_with_one_warning():
    code = (
        "import torch, torch_emugpu\n"
        "a = torch.empty(1 << 20).pin_memory()\n"
        "b = torch.empty(1 << 20).pin_memory()\n"
        "print(a.is_pinned(), b.is_pinned(), torch.emugpu.host_memory_stats()['locked'])\n"
    )
    drop = "setpriv --bounding-set=-ipc_lock --inh-caps=-ipc_lock " if os.geteuid() == 0 else ""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_")}
    r = subprocess.run(
        ["bash", "-c", f'ulimit -l 64 && {drop}{sys.executable} -W always -c "$CODE"'],
        env={**env, "CODE": code},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "False"]  # still pinned tensors (copies time as pinned), not locked
    assert r.stderr.count("could not lock pinned host memory") == 1
