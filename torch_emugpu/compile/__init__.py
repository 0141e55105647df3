"""torch.compile on emugpu (docs/compile.md).

`torch.compile(model)` (backend "inductor", the default) hands Inductor each
graph Dynamo captures. Inductor cannot generate code for emugpu (it has no
scheduling for the device), so for graphs whose tensors are on emugpu the
emulator takes Inductor's place: AOTAutograd with Inductor's decompositions
and its rematerialising partitioner gives the same forward and backward
graphs Inductor would lower, and runner.py runs them, charging each group of
ops Inductor would fuse (fusion.py) as one kernel. Graphs on other devices go
to Inductor unchanged. `backend="emugpu"` names the same compiler.

Backends that only run the captured graph (eager, aot_eager) work as they
are, timed op by op. Any other named backend compiles for its own runtime
(CUDA graphs, TensorRT, ONNX Runtime, TVM, ...): on emugpu it raises an error
naming it and the backends that work.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = ["backend", "install", "stats", "WORKING_BACKENDS"]

# Backends that work on emugpu: "inductor" and "emugpu" as Inductor's kernels, the others op by op.
WORKING_BACKENDS = ("inductor", "emugpu", "eager", "aot_eager", "aot_eager_decomp_partition")


def _on_emugpu(gm: Any, example_inputs: Any) -> bool:
    for v in pytree.tree_leaves(list(example_inputs)):
        if isinstance(v, torch.Tensor) and v.device.type == "emugpu":
            return True
    graph = getattr(gm, "graph", None)
    for node in graph.nodes if graph is not None else ():
        for v in pytree.tree_leaves(node.meta.get("example_value", node.meta.get("val"))):
            if isinstance(v, torch.Tensor) and v.device.type == "emugpu":
                return True
    return False


def backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **options: Any) -> Callable[..., Any]:
    """The torch.compile backend for emugpu graphs: Inductor's graphs, charged as Inductor's kernels.

    `options` (Inductor's mode and options) are accepted and do not change the timing."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    from torch_emugpu.compile import runner

    # Max pooling stays one op each way: Inductor generates one kernel for each, which the eager rule
    # times; its decomposition (window offsets, then scatters) would run as many small ops here.
    decompositions = {
        op: fn
        for op, fn in select_decomp_table().items()
        if "max_pool2d_with_indices" not in str(op) and "max_pool3d_with_indices" not in str(op)
    }
    compiler = aot_autograd(
        fw_compiler=runner.compile_graph,
        bw_compiler=runner.compile_graph,
        inference_compiler=runner.compile_graph,
        decompositions=decompositions,
        partition_fn=functools.partial(min_cut_rematerialization_partition, compiler="inductor"),
        keep_inference_input_mutations=True,
    )
    return compiler(gm, example_inputs)


def stats() -> dict[str, int]:
    """Graphs compiled for emugpu so far, their fused kernels, the ops fused into them and those left as
    library calls; `eager_graphs`: graphs with dynamic shapes, timed op by op."""
    from torch_emugpu.compile import runner

    return dict(runner.stats)


def _unsupported(name: str) -> Callable[..., Any]:
    """`name`'s compiler, refusing emugpu graphs with an error that says what works."""
    from torch._dynamo.backends.registry import lookup_backend

    compiler = lookup_backend(name)  # unknown names fail here, as torch.compile's own check does

    def refuse_emugpu(gm: torch.fx.GraphModule, example_inputs: list[Any], **options: Any) -> Any:
        if _on_emugpu(gm, example_inputs):
            working = ", ".join(repr(b) for b in WORKING_BACKENDS)
            raise RuntimeError(
                f"emugpu: torch.compile backend {name!r} cannot target emugpu tensors (it compiles for its "
                f"own runtime, which the emulated GPU does not have); expected one of {working}. Use "
                f"torch.compile(model) (Inductor, timed as its fused kernels) or backend='eager'/'aot_eager' "
                f"(timed op by op)"
            )
        return compiler(gm, example_inputs, **options)

    refuse_emugpu.__name__ = name
    return refuse_emugpu


_checked = functools.cache(_unsupported)


def install() -> None:
    """Routes emugpu graphs of torch.compile's default backend here, and checks the other backends; once."""
    wrapper = torch._TorchCompileInductorWrapper
    if getattr(wrapper.__call__, "_emugpu", False):
        return
    inductor_call = wrapper.__call__

    def __call__(self: Any, model_: Any, inputs_: Any, **kwargs: Any) -> Any:
        if _on_emugpu(model_, inputs_):
            return backend(model_, inputs_, **kwargs)
        return inductor_call(self, model_, inputs_, **kwargs)

    __call__._emugpu = True  # type: ignore[attr-defined]
    wrapper.__call__ = __call__  # type: ignore[method-assign]

    torch_compile = torch.compile

    # The backend is chosen by name at torch.compile: wrap the names that cannot run on emugpu there
    # (Dynamo's registry hands out its functions by value, so they cannot be wrapped where they live).
    @functools.wraps(torch_compile)
    def compile(model: Any = None, **kwargs: Any) -> Any:
        from torch_emugpu.device import as_cuda

        as_cuda.prepare_compile()  # run mode: what Dynamo and Inductor ask of torch.cuda
        name = kwargs.get("backend", "inductor")
        if name == "emugpu":
            kwargs["backend"] = backend
        elif isinstance(name, str) and name not in WORKING_BACKENDS:
            kwargs["backend"] = _checked(name)
        return torch_compile(model, **kwargs)

    compile._emugpu = True  # type: ignore[attr-defined]
    torch.compile = compile
