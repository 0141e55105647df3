"""Copies of real bytes on the device are deferred until their bytes are needed.

A cast, clone or device-to-device copy of a tensor holding real bytes is
recorded, not done: a GPU does that work on the device, so the host must not.
Whatever reads the result later (.cpu(), .item(), .tolist(), a value-dependent
op, another process) gets exactly the values the CPU gives, as they were when
the copy was launched, whatever happened to the source since.
"""

from __future__ import annotations

import copy
import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torchvision

import torch_emugpu
from torch_emugpu import _C


@pytest.fixture(autouse=True)
def counts():
    _C._reset_deferred_copy_stats()


def done() -> int:
    return _C._deferred_copy_stats()["done"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64, torch.int32, torch.uint8])
def test_a_cast_of_real_bytes_reads_back_exactly_the_cpus_cast(dtype):
    cpu = torch.randn(10_000) * 300
    src = cpu.to("emugpu")
    cast = src.to(dtype)
    assert _C._deferred_copy_stats()["pending"] >= 1 and done() == 0  # launched, not done
    assert torch.equal(cast.cpu(), cpu.to(dtype))
    assert done() == 1


def test_item_and_tolist_read_the_cast_values():
    cpu = torch.tensor([1.5, -2.25, 3.0e5, 7.1])
    src = cpu.to("emugpu")
    cast = src.to(torch.bfloat16)
    assert done() == 0
    assert cast[1].item() == cpu.to(torch.bfloat16)[1].item()
    assert cast.tolist() == cpu.to(torch.bfloat16).tolist()


def test_value_dependent_ops_on_cast_labels_use_the_cast_values():
    labels = torch.tensor([3, 0, 3, 7, 1, 3], dtype=torch.int32)
    src = labels.to("emugpu")
    cast = src.long()  # cast labels, as a loss or a sampler casts them
    assert done() == 0
    assert torch.equal(torch.bincount(cast).cpu(), torch.bincount(labels.long()))
    assert torch.equal(torch.unique(cast).cpu(), torch.unique(labels.long()))
    flags = (labels == 3).to(torch.uint8).to("emugpu")
    mask = flags.bool()
    values = torch.arange(6.0).to("emugpu")
    assert torch.equal(torch.nonzero(mask).cpu(), torch.nonzero(labels == 3))
    assert torch.equal(torch.masked_select(values, mask).cpu(), torch.arange(6.0)[labels == 3])


def test_a_source_overwritten_after_the_copy_leaves_the_copy_its_old_values():
    cpu = torch.randn(1000)
    src = cpu.to("emugpu")
    half = src.half()
    clone = src.clone()
    src.copy_(torch.zeros(1000))  # real bytes over the source
    assert torch.equal(half.cpu(), cpu.half())
    assert torch.equal(clone.cpu(), cpu)
    assert torch.equal(src.cpu(), torch.zeros(1000))


def test_a_source_written_by_an_op_or_freed_first_leaves_the_copy_its_values():
    cpu = torch.randn(1000)
    src = cpu.to("emugpu")
    by_op = src.to(torch.bfloat16)
    src.mul_(2)  # a placeholder write: the source's values are gone, the copy's stay
    assert torch.equal(by_op.cpu(), cpu.to(torch.bfloat16))
    other = cpu.to("emugpu")
    by_free = other.double()
    del other  # its memory may be reused: the copy is done first
    torch.empty(1000, device="emugpu").fill_(1)
    assert torch.equal(by_free.cpu(), cpu.double())


def test_a_copy_of_a_copy_and_pieces_of_a_buffer_read_back_exactly():
    a, b = torch.randn(100), torch.randn(100)
    chain = a.to("emugpu").to(torch.bfloat16).to(torch.float32)
    assert torch.equal(chain.cpu(), a.to(torch.bfloat16).float())
    buf = torch.empty(200, device="emugpu")
    buf[:100].copy_(a.to("emugpu"))
    buf[100:].copy_(b.to("emugpu").half())
    buf[50:60].copy_(torch.full((10,), 9.0))  # a real write over part of the pending pieces
    expected = torch.cat([a, b.half().float()])
    expected[50:60] = 9.0
    assert torch.equal(buf.cpu(), expected)


def test_a_copy_overwritten_before_anyone_reads_it_is_never_done():
    src = torch.randn(1 << 15).to("emugpu")  # 128 KiB: an op on it is not computed (test_small_real.py)
    dst = torch.empty(1 << 15, device="emugpu")
    for _ in range(5):
        dst.copy_(src)
    dst.add_(1)  # placeholders now
    del dst
    stats = _C._deferred_copy_stats()
    assert stats["done"] == 0 and stats["dropped"] == 5 and stats["pending"] == 0


def test_an_autocast_forward_with_real_weights_does_no_real_copy():
    torch.manual_seed(0)
    cpu_model = torchvision.models.resnet18(num_classes=10).eval()
    model = copy.deepcopy(cpu_model).to("emugpu")  # real weights
    x = torch.randn(2, 3, 64, 64).to("emugpu")
    for _ in range(2):
        with torch.no_grad(), torch.autocast("emugpu", dtype=torch.bfloat16):
            model(x)
    stats = _C._deferred_copy_stats()
    assert stats["recorded"] >= 2 * 21  # the 20 convolution and linear weights and the input, twice
    assert stats["done"] == 0 and stats["pending"] == 0  # the casts were freed, never read
    assert torch.equal(model.fc.weight.to(torch.bfloat16).cpu(), cpu_model.fc.weight.to(torch.bfloat16))


def test_memory_another_process_maps_holds_the_copied_bytes():
    cpu = torch.randn(1000)
    src = cpu.to("emugpu")
    cast = src.half()
    assert done() == 0
    received = pickle.loads(ForkingPickler.dumps(cast))  # the bytes another process would map
    assert torch.equal(received.cpu(), cpu.half())
    cast.copy_((cpu + 1).to("emugpu"))  # into shared memory: done at once, as the other process may look
    assert _C._deferred_copy_stats()["pending"] == 0
    assert torch.equal(received.cpu(), (cpu + 1).half())


def test_compute_mode_copies_at_once():
    torch_emugpu.configure(mode="compute")
    cpu = torch.randn(100)
    cast = cpu.to("emugpu").half()
    assert _C._deferred_copy_stats()["recorded"] == 0
    assert torch.equal(cast.cpu(), cpu.half())
