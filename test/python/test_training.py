"""Optimizers, gradient clipping and AMP work on emugpu."""

import pytest
import torch


def small_model():
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 10)).to("emugpu")


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd-momentum-single-tensor": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=False),
    "sgd-foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
    "adam": lambda p: torch.optim.Adam(p),
    "adam-fused": lambda p: torch.optim.Adam(p, fused=True),
    "adamw-single-tensor": lambda p: torch.optim.AdamW(p, foreach=False),
    "adamw-foreach": lambda p: torch.optim.AdamW(p, foreach=True),
    "adamw-fused": lambda p: torch.optim.AdamW(p, fused=True),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_steps_with_clipping(name):
    m = small_model()
    opt = OPTIMIZERS[name](m.parameters())
    x = torch.empty(16, 32, device="emugpu")
    y = torch.randint(0, 10, (16,)).to("emugpu")
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
    assert norm.device.type == "emugpu" and norm.shape == ()
    assert all(p.grad is not None for p in m.parameters())
    if "adam" in name:
        state = opt.state[next(iter(m.parameters()))]
        assert state["exp_avg"].device.type == "emugpu"


def test_zero_grad_sets_grads_to_none_or_zero():
    m = small_model()
    m(torch.empty(4, 32, device="emugpu")).sum().backward()
    m.zero_grad(set_to_none=False)
    assert all(p.grad is not None for p in m.parameters())
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_runs_matmuls_in_low_precision_and_losses_in_fp32(dtype):
    m = small_model()
    x = torch.empty(8, 32, device="emugpu")
    with torch.autocast("emugpu", dtype=dtype):
        out = m(x)
        loss = torch.nn.functional.cross_entropy(out, torch.zeros(8, dtype=torch.long, device="emugpu"))
        assert torch.softmax(out, dim=1).dtype == torch.float32
    assert out.dtype == dtype
    assert loss.dtype == torch.float32
    loss.backward()
    assert m[0].weight.grad.dtype == torch.float32


def test_grad_scaler_loop_runs():
    m = small_model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("emugpu")
    x = torch.empty(8, 32, device="emugpu")
    for _ in range(3):
        with torch.autocast("emugpu", dtype=torch.float16):
            loss = m(x).float().sum()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()


def test_autocast_lowers_activation_memory():
    m = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).to("emugpu")
    x = torch.empty(2048, 1024, device="emugpu")

    def peak(enabled: bool) -> int:
        torch.emugpu.synchronize()
        torch.emugpu.reset_peak_memory_stats()
        base = torch.emugpu.memory_allocated()
        with torch.autocast("emugpu", dtype=torch.float16, enabled=enabled):
            y = m(x)
        y.float().sum().backward()
        m.zero_grad()
        return torch.emugpu.max_memory_allocated() - base

    assert peak(True) < 0.8 * peak(False)
