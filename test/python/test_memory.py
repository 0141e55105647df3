"""The emulated CUDA caching allocator: CUDA's statistics, OOM, no host RAM."""

import traceback

import pytest
import torch
from conftest import run_python

import torch_emugpu

MiB = 2**20


def stats():
    return torch.emugpu.memory_stats()


def fresh():
    torch.emugpu.synchronize()
    torch.emugpu.empty_cache()
    torch.emugpu.reset_peak_memory_stats()
    torch.emugpu.reset_accumulated_memory_stats()


def test_small_requests_round_to_512_bytes_in_2_mib_segments():
    fresh()
    base = torch.emugpu.memory_allocated()
    a = torch.empty(1, dtype=torch.uint8, device="emugpu")
    b = torch.empty(600, dtype=torch.uint8, device="emugpu")
    s = stats()
    assert s["allocated_bytes.all.current"] - base == 512 + 1024
    assert s["requested_bytes.all.current"] >= 601
    assert s["segment.small_pool.allocated"] == 1
    assert s["reserved_bytes.small_pool.current"] >= 2 * MiB
    del a, b


def test_large_requests_get_20_mib_or_rounded_segments():
    fresh()
    a = torch.empty(3 * MiB, dtype=torch.uint8, device="emugpu")
    assert stats()["reserved_bytes.large_pool.current"] == 20 * MiB
    b = torch.empty(3 * MiB, dtype=torch.uint8, device="emugpu")  # split from the same segment
    assert stats()["segment.large_pool.current"] == 1
    c = torch.empty(11 * MiB, dtype=torch.uint8, device="emugpu")  # best fit: the 14 MiB left
    assert stats()["reserved_bytes.large_pool.current"] == 20 * MiB
    d = torch.empty(15 * MiB, dtype=torch.uint8, device="emugpu")  # fits nowhere: a 16 MiB segment
    assert stats()["reserved_bytes.large_pool.current"] == 36 * MiB
    del a, b, c, d
    assert stats()["allocated_bytes.large_pool.current"] == 0
    assert torch.emugpu.memory_reserved() >= 36 * MiB  # cached, as CUDA keeps it
    torch.emugpu.empty_cache()
    assert stats()["reserved_bytes.large_pool.current"] == 0


def test_peak_persistent_and_activations_of_a_training_step():
    fresh()
    base = torch.emugpu.memory_allocated()
    m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to("emugpu")
    weights = torch.emugpu.memory_allocated() - base
    assert weights >= 4 * (1024 * 4096 * 2 + 4096 + 1024)
    x = torch.empty(256, 1024, device="emugpu")
    m(x).sum().backward()
    activations = 4 * 256 * 4096  # the ReLU output, saved for backward
    assert torch.emugpu.max_memory_allocated() - base >= 2 * weights + activations
    assert torch.emugpu.memory_allocated() - base >= 2 * weights  # gradients stay


@pytest.mark.slow
def test_out_of_memory_is_torch_out_of_memory_error_with_a_cuda_style_message():
    import torchvision

    torch_emugpu.configure(gpu="Tesla V100-SXM2-16GB", device_count=1)
    model = torchvision.models.resnet152().to("emugpu")
    x = torch.empty(512, 3, 224, 224, device="emugpu")
    with pytest.raises(torch.OutOfMemoryError) as e:
        model(x).sum().backward()
    msg = str(e.value)
    assert "emugpu out of memory. Tried to allocate" in msg
    assert "Tesla V100-SXM2-16GB" in msg and "total capacity of 15.78 GiB" in msg
    assert "reserved by PyTorch but unallocated" in msg
    assert stats()["num_ooms"] >= 1
    traceback.clear_frames(e.value.__traceback__)  # release the activations it holds
    del model, x, e


@pytest.mark.slow
def test_twenty_gib_of_device_tensors_cost_no_host_ram():
    code = """
import torch, resource
import torch_emugpu
torch_emugpu.configure(gpu="a100-80gb")
x = torch.empty(5 * 2**30, device="emugpu")   # 20 GiB
y = x.relu()                                   # 20 GiB more, computed shape-only
z = y * 2                                      # and 20 more
torch.emugpu.synchronize()
rss = int(open('/proc/self/statm').read().split()[1]) * 4096
print(torch.emugpu.memory_allocated() // 2**30, rss // 2**20)
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    held_gib, rss_mib = map(int, r.stdout.split())
    assert held_gib == 60
    assert rss_mib < 1024


def test_freed_blocks_are_reused_across_iterations():
    fresh()
    m = torch.nn.Linear(512, 512).to("emugpu")
    x = torch.empty(64, 512, device="emugpu")
    for _ in range(3):
        m(x).sum().backward()
    segments = stats()["segment.all.allocated"]
    for _ in range(5):
        m(x).sum().backward()
    assert stats()["segment.all.allocated"] == segments
