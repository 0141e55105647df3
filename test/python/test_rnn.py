"""Recurrent layers take cuDNN's path on emugpu, as on CUDA: one _cudnn_rnn
call per forward and one _cudnn_rnn_backward per backward, timed as a whole
by the cost model's RNN rule, with cuDNN's reserve space kept for the
backward in training only."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

import torch_emugpu


def by_family(rows: list[dict]) -> dict[str, dict]:
    return {r["family"]: r for r in rows}


FORWARD = "recurrent layers forward (cuDNN RNN)"
BACKWARD = "recurrent layers backward (cuDNN RNN)"


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN])
def test_a_stack_is_one_call_each_way_and_gradients_reach_every_weight(cls: type) -> None:
    rnn = cls(32, 64, num_layers=2, batch_first=True).to("emugpu")
    x = torch.randn(4, 50, 32, device="emugpu", requires_grad=True)
    torch.emugpu.synchronize()
    torch_emugpu.reset_cost_report()
    out, _ = rnn(x)
    assert out.shape == (4, 50, 64)
    out.sum().backward()
    torch.emugpu.synchronize()
    rows = by_family(torch_emugpu.cost_report(reset=True))
    assert rows[FORWARD]["ops"] == 1 and rows[BACKWARD]["ops"] == 1
    # cuDNN launches kernels per timestep and layer; the op counts them.
    assert rows[FORWARD]["kernels"] >= 2 * 50 * 2
    assert "matmul (mm)" not in rows and "matmul + bias (addmm)" not in rows  # no per-step decomposition
    assert x.grad is not None and x.grad.shape == x.shape
    assert all(p.grad is not None and p.grad.shape == p.shape for p in rnn.parameters())


def test_the_time_follows_the_timesteps() -> None:
    rnn = torch.nn.LSTM(64, 64).to("emugpu")
    times = []
    for steps in (100, 200):
        x = torch.randn(steps, 8, 64, device="emugpu")
        torch.emugpu.synchronize()
        torch_emugpu.reset_cost_report()
        rnn(x)
        torch.emugpu.synchronize()
        times.append(by_family(torch_emugpu.cost_report(reset=True))[FORWARD]["time_s"])
    assert times[1] / times[0] == pytest.approx(2, rel=0.1)


def test_reserve_space_is_kept_for_the_backward_in_training_only() -> None:
    rnn = torch.nn.LSTM(256, 256, num_layers=2).to("emugpu")
    x = torch.randn(128, 16, 256, device="emugpu")
    torch.emugpu.synchronize()
    before = torch.emugpu.memory_allocated()
    out, _ = rnn(x)
    held_training = torch.emugpu.memory_allocated() - before
    del out
    rnn.eval()
    with torch.no_grad():
        out, _ = rnn(x)
    held_eval = torch.emugpu.memory_allocated() - before
    del out
    # Training keeps the reserve space: per layer and row six hidden widths of float32.
    reserve = 2 * 128 * 16 * 6 * 256 * 4
    assert held_training - held_eval == pytest.approx(reserve, rel=0.05)


@pytest.mark.parametrize(
    "kwargs", [{"bidirectional": True}, {"proj_size": 16}, {"dropout": 0.5}, {"bidirectional": True, "dropout": 0.2}]
)
def test_configurations_with_their_own_rules_run_and_are_charged(kwargs: dict) -> None:
    rnn = torch.nn.LSTM(32, 64, num_layers=2, **kwargs).to("emugpu")
    x = torch.randn(20, 4, 32, device="emugpu", requires_grad=True)
    torch_emugpu.reset_cost_report()
    out, (h, c) = rnn(x)
    width = kwargs.get("proj_size", 0) or 64
    directions = 2 if kwargs.get("bidirectional") else 1
    assert out.shape == (20, 4, width * directions)
    assert h.shape == (2 * directions, 4, width) and c.shape == (2 * directions, 4, 64)
    out.sum().backward()
    torch.emugpu.synchronize()
    rows = by_family(torch_emugpu.cost_report(reset=True))
    assert rows[FORWARD]["time_s"] > 0 and rows[BACKWARD]["time_s"] > 0


def test_packed_sequences_take_the_same_path() -> None:
    rnn = torch.nn.GRU(16, 32).to("emugpu")
    x = torch.randn(10, 3, 16, device="emugpu")
    packed = pack_padded_sequence(x, torch.tensor([10, 7, 4]))
    torch_emugpu.reset_cost_report()
    out, h = rnn(packed)
    assert out.data.shape == (21, 32) and h.shape == (1, 3, 32)
    torch.emugpu.synchronize()
    assert by_family(torch_emugpu.cost_report(reset=True))[FORWARD]["ops"] == 1


def test_float64_runs_pytorchs_decomposition_and_says_so_once() -> None:
    rnn = torch.nn.RNN(8, 8).to("emugpu", torch.float64)
    x = torch.randn(5, 2, 8, device="emugpu", dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, _ = rnn(x)
        rnn(x)
    assert out.shape == (5, 2, 8)
    said = [w for w in caught if "aten::rnn_tanh" in str(w.message) and "decomposition" in str(w.message)]
    assert len(said) == 1
