"""torch.compile on emugpu (docs/compile.md): the default backend trains and infers, the emulator's hooks
cause no graph break, a compiled graph is charged as Inductor's fused kernels, and a backend that cannot
target emugpu says so."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from conftest import run_python
from torch._dynamo.utils import counters

import torch_emugpu
from torch_emugpu import _C


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Dropout(0.1), nn.LayerNorm(1024), nn.Linear(1024, 256))


def _busy(fn, iters: int = 2) -> tuple[float, float]:
    """(kernels, busy ns) per call of `fn` on emugpu:0, after one warm-up call."""
    fn()
    torch.emugpu.synchronize()
    k0, b0 = _C._engine_stats(0)["compute"]
    for _ in range(iters):
        fn()
    torch.emugpu.synchronize()
    k1, b1 = _C._engine_stats(0)["compute"]
    return (k1 - k0) / iters, (b1 - b0) / iters


def _graph_breaks() -> int:
    return sum(counters["graph_break"].values())


def test_default_backend_trains_faster_than_eager_with_fewer_kernels():
    model = _mlp().to("emugpu")
    x = torch.randn(4096, 256, device="emugpu")
    compiled = torch.compile(model)

    def step(m):
        m(x).square().mean().backward()

    eager_kernels, eager_ns = _busy(lambda: step(model))
    compiled_kernels, compiled_ns = _busy(lambda: step(compiled))
    assert _graph_breaks() == 0
    assert torch_emugpu.compile.stats()["graphs"] >= 2  # forward and backward went through the emulator's compiler
    assert all(p.grad is not None and p.grad.device.type == "emugpu" for p in model.parameters())
    assert compiled_kernels < eager_kernels
    # The matmuls are timed as eager and dominate; fusion saves the elementwise passes only.
    assert compiled_ns < eager_ns
    assert compiled_ns > 0.5 * eager_ns


def test_a_pointwise_chain_is_one_kernel_of_its_input_and_output_bytes():
    x = torch.randn(1 << 22, device="emugpu")

    def chain(t):
        return (t.sin() * 2 + 1).relu()

    compiled = torch.compile(chain)
    with torch.no_grad():
        eager_kernels, eager_ns = _busy(lambda: chain(x))
        compiled_kernels, compiled_ns = _busy(lambda: compiled(x))
    assert eager_kernels == 4
    assert compiled_kernels == 1
    # One elementwise kernel reading x and writing the result, as the cost model times it.
    params = {k: v for k, v in _C._current_kernel_params(0).items() if k != "source"}
    one = {"family": 0, "flops": float(x.numel()), "bytes": 2.0 * x.nbytes, "dtype": 0, "kernels": 1}
    (expected,) = _C._kernel_times(_C._device_properties(0)["name"], params, [{**one, "gemms": [], "conv": (0,) * 11}])
    assert compiled_ns == pytest.approx(expected, rel=0.02)
    assert eager_ns == pytest.approx(4 * expected, rel=0.1)  # each eager op moves the same bytes


def test_compute_mode_gives_eagers_values_and_gradients():
    torch_emugpu.configure(mode="compute")
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    dev = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to("emugpu")
    x = torch.randn(32, 8)
    compiled = torch.compile(dev)
    y = compiled(x.to("emugpu"))
    y.square().sum().backward()
    cpu(x).square().sum().backward()
    assert torch.allclose(y.cpu(), cpu(x), atol=1e-5)
    for p_dev, p_cpu in zip(dev.parameters(), cpu.parameters(), strict=True):
        assert torch.allclose(p_dev.grad.cpu(), p_cpu.grad, atol=1e-4)


def test_small_real_inputs_give_real_values_in_timing_mode():
    # As eager emugpu computes small ops on real bytes (docs/execution.md), so does a compiled graph.
    t = torch.arange(4.0).to("emugpu")
    out = torch.compile(lambda v: (v * 2 + 1).sum())(t)
    assert out.item() == 16.0


def test_batch_norm_running_statistics_update_in_compute_mode():
    torch_emugpu.configure(mode="compute")
    bn = nn.BatchNorm2d(3).to("emugpu")
    x = torch.randn(4, 3, 5, 5)
    torch.compile(bn)(x.to("emugpu"))
    assert torch.allclose(bn.running_mean.cpu(), 0.1 * x.mean(dim=(0, 2, 3)), atol=1e-5)
    assert bn.num_batches_tracked.item() == 1


@pytest.mark.parametrize("how", ["module", "method", "function"])
def test_the_emulators_hooks_cause_no_graph_break(how):
    model = _mlp().to("emugpu")
    x = torch.randn(64, 256, device="emugpu")
    if how == "module":
        run = torch.compile(model, backend="aot_eager")
    elif how == "method":
        model.compile(backend="aot_eager")
        run = model
    else:
        run = torch.compile(lambda v: model(v), backend="aot_eager")
    for _ in range(2):
        run(x).sum().backward()
    assert _graph_breaks() == 0, dict(counters["graph_break"])


@pytest.mark.slow
def test_profiles_off_trains_with_the_default_backend_without_graph_breaks():
    code = """
import torch, torch.nn as nn, torch_emugpu
from torch._dynamo.utils import counters
m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8)).to("emugpu")
m.compile()
for _ in range(2):
    m(torch.randn(16, 64, device="emugpu")).sum().backward()
print("breaks", sum(counters["graph_break"].values()), "graphs", torch_emugpu.compile.stats()["graphs"])
"""
    r = run_python(code, env={"EMUGPU_PROFILES": "off"})
    assert r.returncode == 0, r.stderr
    assert "breaks 0 graphs 2" in r.stdout


def test_a_backend_that_cannot_target_emugpu_names_itself_and_what_works():
    model = nn.Linear(8, 8).to("emugpu")
    compiled = torch.compile(model, backend="cudagraphs")
    with pytest.raises(Exception, match="cudagraphs.*cannot target emugpu") as info:
        compiled(torch.randn(4, 8, device="emugpu"))
    assert "'inductor'" in str(info.value) and "'aot_eager'" in str(info.value)


def test_other_backends_still_compile_cpu_graphs():
    # The check refuses emugpu graphs only: the same backend on the CPU compiles as before.
    model = nn.Linear(8, 8)
    out = torch.compile(model, backend="cudagraphs")(torch.randn(4, 8))
    assert out.shape == (4, 8)


def test_an_unknown_backend_fails_at_torch_compile_as_before():
    with pytest.raises(Exception, match="no_such_backend"):
        torch.compile(nn.Linear(2, 2), backend="no_such_backend")


def test_dynamic_shapes_are_timed_as_fused_kernels_per_shape():
    model = _mlp().to("emugpu")
    static = torch.compile(model, dynamic=False)
    dynamic = torch.compile(model, dynamic=True)
    x = torch.randn(96, 256, device="emugpu")
    kernels_static, ns_static = _busy(lambda: static(x).sum().backward())
    before = torch_emugpu.compile.stats()
    kernels_dynamic, ns_dynamic = _busy(lambda: dynamic(x).sum().backward())
    dynamic(torch.randn(40, 256, device="emugpu")).sum().backward()  # a second shape: traced again
    after = torch_emugpu.compile.stats()
    assert after["eager_graphs"] == before["eager_graphs"]
    assert after["graphs"] - before["graphs"] == 4  # forward and backward, for each of the two shapes
    assert kernels_dynamic == kernels_static
    assert ns_dynamic == pytest.approx(ns_static, rel=1e-6)


def test_dynamic_shapes_give_eagers_values_in_compute_mode():
    torch_emugpu.configure(mode="compute")
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16))
    dev = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16))
    dev.load_state_dict(cpu.state_dict())
    compiled = torch.compile(dev.to("emugpu"), dynamic=True)
    for batch in (3, 5):
        x = torch.randn(batch, 8)
        assert torch.allclose(compiled(x.to("emugpu")).cpu(), cpu(x), atol=1e-5)


def test_every_kernel_of_a_graph_is_charged_once_stores_included(monkeypatch):
    # BatchNorm in training mode writes its running statistics back (copy_ into graph inputs): those
    # stores belong to the kernel computing them, which must be charged like any other.
    from torch_emugpu.compile import runner

    graphs = []
    original = runner.compile_graph

    def capture(gm, example_inputs):
        compiled = original(gm, example_inputs)
        graphs.append(compiled)
        return compiled

    monkeypatch.setattr(runner, "compile_graph", capture)
    bn = nn.BatchNorm2d(64).to("emugpu")
    x = torch.randn(32, 64, 28, 28, device="emugpu")
    compiled = torch.compile(bn)
    with torch.no_grad():
        kernels, busy_ns = _busy(lambda: compiled(x))
    (graph,) = graphs
    assert any(graph.plan.kinds[n] == "store" and n in graph.plan.last_member for n in graph.nodes)
    durations = [d for d in graph.group_durations() if d > 0]
    assert kernels == len(durations)
    assert busy_ns == pytest.approx(sum(durations) * 1e9, rel=1e-3)
