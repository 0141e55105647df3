"""Optimizers, gradient clipping and AMP work on emugpu."""

import pytest
import torch

import torch_emugpu


def small_model():
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    ).to("emugpu")


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


@pytest.mark.parametrize("mode", ["timing", "compute"])
def test_grad_scaler_loop_runs(mode):
    torch_emugpu.configure(mode=mode)
    torch.manual_seed(0)
    m = small_model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("emugpu", init_scale=2.0**16)
    x = torch.randn(8, 32).to("emugpu")
    y = torch.randint(0, 10, (8,)).to("emugpu")
    for _ in range(3):
        before = [p.detach().cpu().clone() for p in m.parameters()]
        torch.emugpu.synchronize()
        torch.emugpu.reset_engine_stats()
        with torch.autocast("emugpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(m(x).float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        torch.emugpu.synchronize()
        stats = torch.emugpu.engine_stats()
        # Each step runs on the emulated GPU and reads the scaler's inf check back, as on CUDA.
        assert stats["compute_launches"] > 0 and stats["compute_busy_s"] > 0 and stats["d2h_launches"] >= 1
        if mode == "compute":
            assert all(torch.isfinite(p.grad.cpu()).all() for p in m.parameters())
            assert all(not torch.equal(b, p.detach().cpu()) for b, p in zip(before, m.parameters(), strict=True))
        opt.zero_grad()
    if mode == "timing":
        return  # timing mode computes no values: the scale and the updates are not real
    assert scaler.get_scale() == 2.0**16  # finite gradients: no step skipped, the scale kept
    # An overflowing step is skipped and halves the scale, as on CUDA.
    before = [p.detach().cpu().clone() for p in m.parameters()]
    with torch.autocast("emugpu", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(m(x).float(), y) * float("inf")
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert all(torch.equal(b, p.detach().cpu()) for b, p in zip(before, m.parameters(), strict=True))
    assert scaler.get_scale() == 2.0**15


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
