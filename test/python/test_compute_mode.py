"""Compute mode: emugpu also computes real values on the host, equal to the
CPU's, while time is still charged to the emulated GPU."""

import copy

import pytest
import torch
import torchvision
from test_models import TORCHVISION

import torch_emugpu
from torch_emugpu import _C
from torch_emugpu.measure.models import GPT, GPTConfig, gpt_loss


@pytest.fixture(autouse=True)
def compute_mode():
    torch_emugpu.configure(mode="compute")
    yield
    torch_emugpu.configure(mode="timing")


def to_emu(*ts):
    return [t.to("emugpu") for t in ts]


OPS = {
    "matmul": lambda a, b: a @ b.t(),
    "add_broadcast": lambda a, b: a + b[0],
    "views": lambda a, b: a.t()[1:4].contiguous() * 2,
    "inplace": lambda a, b: a.clone().mul_(3).add_(b),
    "reductions": lambda a, b: torch.stack([a.sum(), a.mean(), a.amax(), a.std()]),
    "softmax": lambda a, b: torch.log_softmax(a, dim=1),
    "cat_split": lambda a, b: torch.cat(torch.split(a, 3, dim=1)[::-1], dim=1),
    "where": lambda a, b: torch.where(a > 0, a, b),
    "nonzero": lambda a, b: torch.nonzero(a > 0.5),
    "masked_select": lambda a, b: a[a > 0],
    "unique": lambda a, b: torch.unique((a * 3).round(), return_counts=True)[1],
    "index_put": lambda a, b: a.clone().index_put_((a > 0,), torch.tensor(7.0).to(a.device)),
    "gather": lambda a, b: a.gather(1, (b.abs() * 3).long().clamp(max=7)),
    "layer_norm": lambda a, b: torch.nn.functional.layer_norm(a, (8,)),
    "gelu": lambda a, b: torch.nn.functional.gelu(a),
    "sdpa": lambda a, b: torch.nn.functional.scaled_dot_product_attention(
        a.view(1, 2, 6, 4), b.view(1, 2, 6, 4), a.view(1, 2, 6, 4), is_causal=True
    ),
    "cross_entropy": lambda a, b: torch.nn.functional.cross_entropy(a, torch.arange(6).to(a.device)),
    "item": lambda a, b: torch.tensor(a.sum().item()),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_matches_cpu(name):
    torch.manual_seed(0)
    a, b = torch.randn(6, 8), torch.randn(6, 8)
    expected = OPS[name](a, b)
    got = OPS[name](*to_emu(a, b))
    if isinstance(got, torch.Tensor) and got.device.type == "emugpu":
        got = got.cpu()
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("name", [*TORCHVISION, "mobilenet_v3_small"])
@pytest.mark.slow
def test_model_forward_and_gradients_match_cpu(name):
    torch.manual_seed(0)
    kwargs = {"aux_logits": False, "init_weights": False} if name in ("googlenet", "inception_v3") else {}
    model = torchvision.models.get_model(name, **kwargs).eval()  # eval: no dropout, fixed BN statistics
    size = {"vit_b_16": 224, "swin_t": 224, "inception_v3": 96}.get(name, 64)
    x, y = torch.randn(1, 3, size, size), torch.tensor([3])
    emu_model = copy.deepcopy(model).to("emugpu")
    torch.nn.functional.cross_entropy(model(x), y).backward()
    _C._reset_engine_stats(0)
    torch.nn.functional.cross_entropy(emu_model(x.to("emugpu")), y.to("emugpu")).backward()
    assert _C._engine_stats(0)["compute"][1] > 0  # still timed on the emulated GPU
    for (pname, p), q in zip(model.named_parameters(), emu_model.parameters(), strict=True):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5, msg=pname)


def test_training_steps_match_cpu_for_a_small_gpt():
    # SGD, not Adam: Adam divides by tiny second moments and magnifies the last-bit
    # differences between CPU's flash attention and the math path compute mode runs.
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, context=32, layers=2, heads=2, width=32)
    model = GPT(cfg)
    emu_model = copy.deepcopy(model).to("emugpu")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, emu_model)]
    idx = torch.randint(0, 64, (2, 32))
    for _ in range(3):
        for m, opt, inp in ((model, opts[0], idx), (emu_model, opts[1], idx.to("emugpu"))):
            opt.zero_grad()
            gpt_loss(m, inp, inp).backward()
            opt.step()
    for p, q in zip(model.parameters(), emu_model.parameters(), strict=True):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5)


def test_resnet_training_step_with_sgd_matches_cpu():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    emu_model = copy.deepcopy(model).to("emugpu")
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    for m, inp, tgt in ((model, x, y), (emu_model, x.to("emugpu"), y.to("emugpu"))):
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        for _ in range(2):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(inp), tgt).backward()
            opt.step()
    for p, q in zip(model.state_dict().values(), emu_model.state_dict().values(), strict=True):
        torch.testing.assert_close(q.cpu(), p, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("loss", ["mse_loss", "smooth_l1_loss"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_losses_match_cpu_without_resize_warnings(loss: str, reduction: str) -> None:
    import warnings

    x = torch.randn(4, 3)
    y = torch.randn(4, 3)
    fn = getattr(torch.nn.functional, loss)
    xe = x.to("emugpu").requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PyTorch's "output ... was resized" deprecation warning
        warnings.filterwarnings("ignore", message=r".*is host-bound")  # drawn by a loaded host, not the subject
        out = fn(xe, y.to("emugpu"), reduction=reduction)
        out.sum().backward()
    xc = x.clone().requires_grad_()
    want = fn(xc, y, reduction=reduction)
    want.sum().backward()
    assert out.shape == want.shape
    torch.testing.assert_close(out.cpu(), want.detach())
    torch.testing.assert_close(xe.grad.cpu(), xc.grad)


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU])
@pytest.mark.parametrize("kwargs", [{}, {"bias": False, "batch_first": True, "bidirectional": True}])
def test_lstm_and_gru_compute_the_cpus_values_and_gradients(cls: type, kwargs: dict) -> None:
    # PyTorch's per-timestep decomposition calls the fused cells on every accelerator; they have
    # no CPU kernel to compute with, so emugpu makes them of device ops.
    torch.manual_seed(0)
    rnn = cls(8, 16, num_layers=2, **kwargs).double()
    x = torch.randn(5, 3, 8, dtype=torch.double, requires_grad=True)
    out, state = rnn(x)
    hidden = state[0] if isinstance(state, tuple) else state
    (out.sum() + hidden.square().sum()).backward()
    expected = [x.grad] + [p.grad for p in rnn.parameters()]

    emu = copy.deepcopy(rnn).to("emugpu")
    emu.zero_grad()
    xe = x.detach().to("emugpu").requires_grad_()
    out_e, state_e = emu(xe)
    hidden_e = state_e[0] if isinstance(state_e, tuple) else state_e
    (out_e.sum() + hidden_e.square().sum()).backward()
    torch.testing.assert_close(out_e.cpu(), out)
    for got, want in zip([xe.grad] + [p.grad for p in emu.parameters()], expected, strict=True):
        torch.testing.assert_close(got.cpu(), want)
