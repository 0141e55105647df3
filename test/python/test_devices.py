"""Devices, streams and mixed-device ops (issue 6): ops mixing emugpu:0,
emugpu:1 and the CPU fail as on CUDA; bad indices raise IndexError; streams
come from a fixed pool; tied parameters stay tied when moved."""

from __future__ import annotations

import pytest
import torch

import torch_emugpu

MIXED = {
    "mm": lambda a, b: torch.mm(a, b),
    "addmm": lambda a, b: torch.addmm(a, a, b),
    "bmm": lambda a, b: torch.bmm(a.unsqueeze(0), b.unsqueeze(0)),
    "linear": lambda a, b: torch.nn.functional.linear(a, b),
    "conv2d": lambda a, b: torch.nn.functional.conv2d(a.view(1, 1, 4, 4), b.view(1, 1, 4, 4)),
    "cat": lambda a, b: torch.cat([a, b]),
    "stack": lambda a, b: torch.stack([a, b]),
    "where": lambda a, b: torch.where(a > 0, a, b),
    "add": lambda a, b: a + b,
    "cross_entropy": lambda a, b: torch.nn.functional.cross_entropy(a, b.argmax(1)),
    "embedding": lambda a, b: torch.nn.functional.embedding(b.long().view(-1)[:2], a),
    "index_select": lambda a, b: torch.index_select(a, 0, b.long().view(-1)[:2]),
    "gather": lambda a, b: torch.gather(a, 1, b.long()),
}


@pytest.mark.parametrize("op", sorted(MIXED))
@pytest.mark.parametrize("other", ["emugpu:1", "cpu"])
def test_ops_mixing_devices_are_rejected_as_on_cuda(op, other):
    a = torch.zeros(4, 4, device="emugpu:0")
    b = torch.zeros(4, 4, device=other)
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device.*emugpu:0"):
        MIXED[op](a, b)


def test_cpu_scalars_and_cpu_indices_are_accepted_as_on_cuda():
    a = torch.zeros(4, 4, device="emugpu")
    assert (a + torch.tensor(2.0)).device.type == "emugpu"
    assert a[torch.tensor([0, 2])].shape == (2, 4)
    a[torch.tensor([1])] = 1.0


def test_stream_and_event_handlers_reject_bad_device_indices_with_index_error():
    with pytest.raises(IndexError, match="out of range"):
        torch.emugpu.current_stream(7)
    with pytest.raises(IndexError):
        torch.Stream(device="emugpu:9")
    with pytest.raises(IndexError):
        torch.emugpu.default_stream(70)


def test_streams_come_from_a_fixed_pool_so_synchronize_stays_cheap():
    ids = {torch.emugpu.Stream().stream_id for _ in range(100)}
    assert len(ids) <= 32
    for _ in range(2000):
        with torch.emugpu.stream(torch.emugpu.Stream()):
            torch.empty(1, device="emugpu").add_(1)
    torch.emugpu.synchronize()


def test_events_are_usable_from_several_threads():
    import threading

    event = torch.emugpu.Event(enable_timing=True)
    errors: list[BaseException] = []

    def record() -> None:
        try:
            for _ in range(200):
                event.record()
                event.query()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=record) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    event.synchronize()
    assert not errors


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 16)
        self.head = torch.nn.Linear(16, 100, bias=False)
        self.head.weight = self.embed.weight


def test_tied_parameters_stay_tied_when_moved_without_doubling_memory():
    torch_emugpu.configure()
    model = Tied()
    before = torch.emugpu.memory_allocated()
    model.to("emugpu")
    assert model.head.weight is model.embed.weight
    assert len(list(model.parameters())) == 1
    assert torch.emugpu.memory_allocated() - before == pytest.approx(100 * 16 * 4, abs=512)
    assert torch.emugpu.max_memory_allocated() - before < 2 * 100 * 16 * 4
    model.to(torch.float16)
    assert model.head.weight is model.embed.weight and model.head.weight.dtype == torch.float16
    model.cpu()
    assert model.head.weight is model.embed.weight and model.head.weight.device.type == "cpu"
