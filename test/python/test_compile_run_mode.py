"""torch.compile under run mode (docs/compile.md): a script written for CUDA compiles its model as it would on
a GPU, without graph breaks of the emulator's making, and is charged as on native emugpu; graphs on the CPU
still go to Inductor. Run mode changes torch process-wide, so every case runs in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
from conftest import run_python

# A training step (AdamW) and a bf16 autocast inference, eager then compiled, on DEVICE ("cuda" in run mode,
# "emugpu" natively): kernels and busy ns per call from the compute engine's statistics.
TRAIN_AND_INFER = """
import json, torch, torch.nn as nn, torch_emugpu
from torch._dynamo.utils import counters
from torch_emugpu import _C

DEVICE = {device!r}
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Dropout(0.1), nn.LayerNorm(1024), nn.Linear(1024, 256))
model = model.cuda() if DEVICE == "cuda" else model.to(DEVICE)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(4096, 256, device=DEVICE)
compiled = torch.compile(model)

def train(m):
    loss = m(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()

def infer(m):
    with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
        return m(x)

def per_call(fn, iters=2):
    fn()
    torch.emugpu.synchronize()
    k0, b0 = _C._engine_stats(0)["compute"]
    for _ in range(iters):
        fn()
    torch.emugpu.synchronize()
    k1, b1 = _C._engine_stats(0)["compute"]
    return [(k1 - k0) / iters, (b1 - b0) / iters]

before = model[0].weight.detach().cpu().clone()
out = {{
    "train_eager": per_call(lambda: train(model)),
    "train_compiled": per_call(lambda: train(compiled)),
    "infer_eager": per_call(lambda: infer(model)),
    "infer_compiled": per_call(lambda: infer(compiled)),
}}
y = infer(compiled)
out.update(
    graph_breaks=sum(counters["graph_break"].values()),
    graphs=torch_emugpu.compile.stats()["graphs"],
    out=[str(y.device), str(y.dtype)],
    weights_moved=bool((model[0].weight.detach().cpu() != before).any()),
    param_device=str(next(model.parameters()).device),
)
print(json.dumps(out))
"""


def _last_json(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_dynamos_checks_see_the_emulated_gpu_and_the_script_still_sees_cuda():
    # What Dynamo asks before and while running a compiled frame, answered without real CUDA.
    code = """
    import json, torch
    import torch.utils._triton as triton_utils
    torch.compile(lambda t: t)  # prepares run mode for Dynamo; nothing is traced before a call
    seen = {}
    seen["capturing"] = torch.cuda.is_current_stream_capturing()
    seen["stream"] = str(torch.accelerator.current_stream(torch.device("emugpu", 0)).device)
    seen["script"] = str(torch.accelerator.current_accelerator())
    seen["through_disable"] = str(torch.compiler.disable(torch.accelerator.current_accelerator)())
    seen["has_triton"] = triton_utils.has_triton()
    from torch_emugpu.device import as_cuda
    as_cuda.uninstall()  # puts Inductor's setting and torch.cuda's function back
    seen["after_uninstall"] = [torch._inductor.config.triton_disable_device_detection,
                               torch.cuda.is_current_stream_capturing.__module__]
    print(json.dumps(seen))
    """
    r = run_python(textwrap.dedent(code), env={"EMUGPU_AS_CUDA": "1"})
    seen = _last_json(r)
    assert seen["capturing"] is False
    assert seen["stream"] == "emugpu:0"
    assert seen["script"] == "cuda"
    assert seen["through_disable"] == "cuda"
    assert seen["has_triton"] is False
    assert seen["after_uninstall"] == [False, "torch.cuda.graphs"]


@pytest.mark.slow
def test_compiled_training_and_inference_are_charged_as_on_native_emugpu():
    run = _last_json(
        run_python(TRAIN_AND_INFER.format(device="cuda"), env={"EMUGPU_AS_CUDA": "1", "EMUGPU_PROFILES": "off"})
    )
    native = _last_json(run_python(TRAIN_AND_INFER.format(device="emugpu"), env={"EMUGPU_PROFILES": "off"}))
    assert run["param_device"] == "emugpu:0"
    assert run["graph_breaks"] == 0
    assert run["graphs"] == 3  # training forward and backward, and the inference graph
    assert run["out"] == ["emugpu:0", "torch.bfloat16"]
    assert run["weights_moved"] is True
    for case in ("train", "infer"):
        eager_kernels, eager_ns = run[f"{case}_eager"]
        compiled_kernels, compiled_ns = run[f"{case}_compiled"]
        assert compiled_kernels < eager_kernels, case
        assert compiled_ns < eager_ns, case
        # The same program on native emugpu: the same kernels, the same time.
        for key in (f"{case}_eager", f"{case}_compiled"):
            assert run[key][0] == native[key][0], key
            assert run[key][1] == pytest.approx(native[key][1], rel=1e-6), key
    assert native["graph_breaks"] == 0 and native["graphs"] == 3


@pytest.mark.slow
def test_cpu_graphs_still_compile_with_inductor_under_run_mode():
    code = """
    import json, torch, torch_emugpu
    from torch._inductor.utils import run_and_get_code
    x = torch.randn(1000)
    fn = torch.compile(lambda t: (t.sin() * 2 + 1).relu().sum())
    result, sources = run_and_get_code(fn, x)
    print(json.dumps({"equal": torch.allclose(result, (x.sin() * 2 + 1).relu().sum()),
                      "cpp": any("extern \\"C\\"" in s for s in sources),
                      "emugpu_graphs": torch_emugpu.compile.stats()["graphs"]}))
    """
    r = run_python(textwrap.dedent(code), env={"EMUGPU_AS_CUDA": "1", "EMUGPU_AS_CUDA_QUIET": "1"})
    seen = _last_json(r)
    assert seen == {"equal": True, "cpp": True, "emugpu_graphs": 0}


@pytest.mark.slow
def test_where_a_script_names_cuda_inside_a_compiled_function_is_no_graph_break():
    code = """
    import json, torch, torch_emugpu
    from torch._dynamo.utils import counters

    def f(x):
        y = x + torch.zeros(16, device="cuda") + torch.ones(16).to("cuda") + torch.ones(16).cuda()
        y = y + x.new_zeros(16, device=torch.device("cuda", 0)) + torch.arange(16, device=x.device)
        if torch.cuda.is_available() and torch.cuda.current_device() == 0:
            y = y * 2
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return y @ y.T

    out = torch.compile(f)(torch.randn(8, 16, device="cuda"))
    print(json.dumps({"breaks": sum(counters["graph_break"].values()), "graphs": counters["stats"]["unique_graphs"],
                      "out": [str(out.device), str(out.dtype)]}))
    """
    r = run_python(textwrap.dedent(code), env={"EMUGPU_AS_CUDA": "1", "EMUGPU_PROFILES": "off"})
    assert _last_json(r) == {"breaks": 0, "graphs": 1, "out": ["emugpu:0", "torch.bfloat16"]}
