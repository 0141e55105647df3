"""torch.emugpu mirrors the torch.cuda API that training scripts use."""

import time

import pytest
import torch

from torch_emugpu import _C


def test_device_queries():
    assert torch.emugpu.is_available()
    assert torch.emugpu.device_count() == 2
    torch.emugpu.set_device(1)
    assert torch.emugpu.current_device() == 1
    torch.emugpu.set_device("emugpu:0")
    assert torch.emugpu.current_device() == 0


def test_device_properties_come_from_the_catalog():
    p = torch.emugpu.get_device_properties(0)
    assert p.name == "NVIDIA A100-SXM4-40GB"
    assert p.multi_processor_count == 108
    assert (p.major, p.minor) == (8, 0)
    assert 39 * 2**30 < p.total_memory < 41 * 2**30
    assert torch.emugpu.get_device_capability() == (8, 0)
    free, total = torch.emugpu.mem_get_info()
    assert total == p.total_memory and 0 < free < total


def test_streams_have_their_own_timeline_position():
    s = torch.emugpu.Stream()
    assert isinstance(s, torch.emugpu.Stream) and isinstance(s, torch.Stream)
    assert s != torch.emugpu.default_stream()
    assert torch.emugpu.current_stream() == torch.emugpu.default_stream()
    with torch.emugpu.stream(s):
        assert torch.emugpu.current_stream() == s
        _C._emulate_kernel(0, 0.03)
        assert not s.query()
    assert torch.emugpu.default_stream().query()  # the work went to `s`
    s.synchronize()
    assert s.query()


def test_event_elapsed_time_is_emulated_time():
    start = torch.emugpu.Event(enable_timing=True)
    end = torch.emugpu.Event(enable_timing=True)
    start.record()
    for _ in range(4):
        _C._emulate_kernel(0, 0.010)
    end.record()
    assert not end.query()
    end.synchronize()
    assert end.query()
    assert start.elapsed_time(end) == pytest.approx(40.0, rel=0.01)


def test_stream_waits_for_an_event_on_another_stream():
    side = torch.emugpu.Stream()
    with torch.emugpu.stream(side):
        _C._emulate_kernel(0, 0.03)
        done = side.record_event()
    torch.emugpu.current_stream().wait_event(done)
    after = torch.emugpu.Event(enable_timing=True)
    t0 = time.perf_counter()
    after.record()
    after.synchronize()
    assert time.perf_counter() - t0 >= 0.025


def test_synchronize_blocks_until_the_timeline_is_done():
    t0 = time.perf_counter()
    _C._emulate_kernel(0, 0.05)
    launched = time.perf_counter() - t0
    torch.emugpu.synchronize()
    waited = time.perf_counter() - t0
    assert launched < 0.01
    assert 0.05 <= waited < 0.07


def test_memory_functions_track_allocations():
    torch.emugpu.empty_cache()
    torch.emugpu.reset_peak_memory_stats()
    base = torch.emugpu.memory_allocated()
    x = torch.empty(25 * 2**20, dtype=torch.uint8, device="emugpu")
    assert torch.emugpu.memory_allocated() - base == 26 * 2**20  # rounded up to 2 MiB
    assert torch.emugpu.memory_reserved() >= 26 * 2**20
    del x
    assert torch.emugpu.memory_allocated() == base
    assert torch.emugpu.max_memory_allocated() - base == 26 * 2**20
    torch.emugpu.reset_peak_memory_stats()
    assert torch.emugpu.max_memory_allocated() == base
    torch.emugpu.empty_cache()
    stats = torch.emugpu.memory_stats()
    assert stats["segment.all.freed"] >= 1
    assert "allocated_bytes.all.current" in stats and "num_ooms" in stats
    summary = torch.emugpu.memory_summary()
    assert "Allocated memory" in summary and "GPU reserved segments" in summary


def test_manual_seed_all_and_rng_state_roundtrip():
    torch.emugpu.manual_seed_all(7)
    states = torch.emugpu.get_rng_state_all()
    assert len(states) == 2
    torch.emugpu.set_rng_state_all(states)
    torch.emugpu.seed()
    assert isinstance(torch.emugpu.initial_seed(), int)


def test_amp_dtypes_follow_the_gpu():
    assert torch.bfloat16 in torch.emugpu.get_amp_supported_dtype()
    assert torch.emugpu.is_bf16_supported()
