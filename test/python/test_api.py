"""torch.emugpu mirrors the torch.cuda API that training scripts use."""

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
    host_start = _C._host_now_ns()
    start.record()
    for _ in range(4):
        _C._emulate_kernel(0, 0.010)
    host_launched = _C._host_now_ns()
    end.record()
    assert not end.query()
    end.synchronize()
    assert end.query()
    # The 40 ms of kernels, plus at most the host's own time launching them (the device idles only
    # while it waits for a launch): bounds a loaded host cannot break.
    assert 40.0 * (1 - 1e-6) <= start.elapsed_time(end) <= 40.0 + (host_launched - host_start) / 1e6 + 1e-3


def test_stream_waits_for_an_event_on_another_stream():
    side = torch.emugpu.Stream()
    start = torch.emugpu.Event(enable_timing=True)
    with torch.emugpu.stream(side):
        start.record()
        kernel_end = _C._emulate_kernel(0, 0.03)
        done = side.record_event()
    torch.emugpu.current_stream().wait_event(done)
    after = torch.emugpu.Event(enable_timing=True)
    after.record()
    after.synchronize()
    # Emulated times: `after` ends no earlier than the side kernel, however slow the host.
    assert start.elapsed_time(after) >= 30.0 * (1 - 1e-6)
    assert _C._host_now_ns() >= kernel_end  # and synchronizing on it waited for that kernel


def test_synchronize_blocks_until_the_timeline_is_done():
    blocked = torch.emugpu.engine_stats()["host_blocked_s"]
    before = _C._host_now_ns()
    end = _C._emulate_kernel(0, 0.05)
    after = _C._host_now_ns()
    # The core's clocks, not wall-time bounds: the kernel ends 50 ms after its launch, which lies
    # between `before` and `after`, and launching it did not block the host.
    assert before + 50_000_000 <= end <= after + 50_000_000
    assert torch.emugpu.engine_stats()["host_blocked_s"] == blocked
    torch.emugpu.synchronize()
    assert _C._host_now_ns() >= end


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


def test_is_initialized_has_cudas_meaning():
    """False until a context exists (not after device_count), as torch.cuda's: init_device_mesh sets each rank's
    device only while it is False."""
    from conftest import run_python

    r = run_python(
        "import torch\n"
        "e = torch.emugpu\n"
        "seen = [e.is_initialized(), e.device_count() > 0, e.is_available(), e.is_initialized()]\n"
        "torch.zeros(1, device='emugpu')\n"
        "seen.append(e.is_initialized())\n"
        "print(seen)\n"
        "import subprocess, sys\n"
        "code = 'import torch; e = torch.emugpu; e.device_count(); e.set_device(0); print(e.is_initialized())'\n"
        "print(subprocess.run([sys.executable, '-c', code], capture_output=True, text=True).stdout.strip())\n",
        env={"EMUGPU_DEVICE_COUNT": "2"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["[False, True, True, False, True]", "True"]
