"""pin_memory() and DataLoader(pin_memory=True) get page-locked, cached host
memory; non-blocking copies from it do not block the host."""

import time

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
    t0 = time.perf_counter()
    with torch.emugpu.stream(side):
        dev = host.to("emugpu", non_blocking=True)
    assert time.perf_counter() - t0 < 0.05
    side.synchronize()
    assert torch.equal(dev.cpu(), host)


def test_pageable_copy_waits_for_the_stream_it_is_ordered_on():
    host = torch.randn(1 << 10)
    _C._emulate_kernel(0, 0.05)
    t0 = time.perf_counter()
    host.to("emugpu")
    assert time.perf_counter() - t0 >= 0.045


def test_freed_pinned_blocks_are_reused():
    a = torch.empty(3000).pin_memory()
    ptr = a.data_ptr()
    del a
    b = torch.empty(3000).pin_memory()
    assert b.data_ptr() == ptr
