"""Runs one AOTAutograd graph on emugpu, charged as the kernels Inductor would generate.

Every node that stays a library call in Inductor (matmuls, convolutions,
attention, gathers, copies between devices, anything that mutates) runs as
the aten op it is, so the eager cost rules time it and the allocator sees its
output. A fused group (fusion.py) runs no op at all: the values it returns to
other kernels are allocated as device tensors (placeholders, like any
computed value in timing mode), its intermediates are never allocated, and
its time is one kernel of the group's bytes, timed by the C++ cost model
(`_C._kernel_times`, the bandwidth rule of its family) and charged with
`_C._emulate_kernel` when its last member is reached.

Values are computed where eager emugpu computes them, on the host: in compute
mode always, in timing mode for ops whose inputs all hold real bytes and are
small (docs/execution.md, "Small ops on real bytes are computed"), so that
control paths see what they would eagerly.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import torch
import torch.fx

from torch_emugpu import _C
from torch_emugpu.compile import fusion

# The same bound as eager emugpu's small real ops (torch_emugpu.distributed.DATA_THRESHOLD_BYTES).
SMALL_REAL_BYTES = 64 * 1024

_DTYPE_CLASS = {torch.float32: 0, torch.float16: 2, torch.bfloat16: 3, torch.float64: 4}
_ELEMENTWISE, _REDUCTION = 0, 1  # csrc/core/op_cost.h OpFamily


_SKIP, _CALL, _VIEW, _ALLOCATE, _FUSED, _STORE, _PLACEHOLDER, _GET_ATTR, _OUTPUT = range(9)
_OPS = {"placeholder": _PLACEHOLDER, "get_attr": _GET_ATTR, "output": _OUTPUT}


class _Virtual:
    """A fused intermediate that no kernel outside its group reads: never allocated nor computed."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<fused intermediate>"


VIRTUAL = _Virtual()

_lock = threading.Lock()
stats = {"graphs": 0, "groups": 0, "fused_ops": 0, "extern_ops": 0, "eager_graphs": 0}  # graphs: static ones


def _device_index(node: torch.fx.Node) -> int:
    for t in fusion._tensors(node.meta.get("val")):
        if t.device.type == "emugpu":
            return t.device.index or 0
    return torch.emugpu.current_device()  # type: ignore[attr-defined]


class CompiledGraph:
    """The callable AOTAutograd gets back for one forward, backward or inference graph (boxed: one list)."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        # On the instance: AOTAutograd wraps the backward in torch._dynamo.disable, whose functools.wraps
        # copies the instance's attributes only.
        self._boxed_call = True
        self.gm = gm
        self.nodes = list(gm.graph.nodes)
        self.plan = fusion.plan(gm.graph)
        self.position = {n: i for i, n in enumerate(self.nodes)}
        # Values die after their last reader, as eager tensors do, so that peak memory is eager's less
        # the fused intermediates.
        last_use: dict[torch.fx.Node, int] = {}
        for i, n in enumerate(self.nodes):
            for j in n.all_input_nodes:
                last_use[j] = i
        self.free_after: list[list[torch.fx.Node]] = [[] for _ in self.nodes]
        for n, i in last_use.items():
            self.free_after[i].append(n)
        for i, n in enumerate(self.nodes):
            if n not in last_use and n.op != "output":
                self.free_after[i].append(n)
        self.devices = [_device_index(g.nodes[-1]) for g in self.plan.groups]
        # Static per node, so that a call does little per fused op: only ops with small outputs can
        # compute real values in timing mode, and a value written to memory needs its layout.
        self.small = {n for n in self.nodes if fusion.tensor_bytes(n.meta.get("val")) <= SMALL_REAL_BYTES}
        self.layout: dict[torch.fx.Node, tuple[Any, ...]] = {}
        self._steps: dict[bool, list[tuple[int, torch.fx.Node, int, int]]] = {}
        self.inputs_of = {n: list(n.all_input_nodes) for n in self.nodes}
        for n in self.plan.needed:
            meta = n.meta.get("val")
            if isinstance(meta, torch.Tensor):
                self.layout[n] = (tuple(meta.shape), meta.stride(), meta.dtype, meta.device)
        self.durations: list[float] = []
        self.generation = -1
        with _lock:
            stats["graphs"] += 1
            stats["groups"] += len(self.plan.groups)
            stats["fused_ops"] += sum(1 for k in self.plan.kinds.values() if k in ("pointwise", "reduction"))
            stats["extern_ops"] += sum(1 for k in self.plan.kinds.values() if k == "extern")

    def group_durations(self) -> list[float]:
        """Seconds of each group's kernel on the emulated GPU; again after every (re)configuration."""
        generation = _C._profiles_generation()
        if generation != self.generation:
            durations: list[float] = []
            for device in sorted(set(self.devices)):
                params = {k: v for k, v in _C._current_kernel_params(device).items() if k != "source"}
                gpu = _C._device_properties(device)["name"]
                indices = [i for i, d in enumerate(self.devices) if d == device]
                ops = [self.kernel(self.plan.groups[i]) for i in indices]
                times = _C._kernel_times(gpu, params, ops) if ops else []
                durations.extend([0.0] * (len(self.devices) - len(durations)))
                for i, ns in zip(indices, times, strict=True):
                    # A group whose values all went into other kernels (inlined there) launches nothing.
                    durations[i] = ns * 1e-9 if self.plan.groups[i].outputs else 0.0
            self.durations = durations
            self.generation = generation
        return self.durations

    def kernel(self, group: fusion.Group) -> dict[str, Any]:
        """The cost model's view of a fused kernel: one launch, the group's bytes, its family's bandwidth rule."""
        dtype = torch.float32
        for n in group.nodes:
            out = fusion._tensors(n.meta.get("val"))
            if out and out[0].is_floating_point():
                dtype = out[0].dtype
                break
        return {
            "family": _REDUCTION if group.reductions else _ELEMENTWISE,
            "flops": float(group.total),
            "bytes": float(group.bytes()),
            "dtype": _DTYPE_CLASS.get(dtype, 5),
            "kernels": 1,
            "gemms": [],
            "conv": (0.0,) * 11,
        }

    def steps(self, compute: bool) -> list[tuple[int, torch.fx.Node, int, int]]:
        """(position, node, what to do, group charged after it or -1) per node, decided once per mode: in
        timing mode a large fused value nobody outside its kernel reads costs no work at all."""
        cached = self._steps.get(compute)
        if cached is not None:
            return cached
        steps = []
        for i, n in enumerate(self.nodes):
            kind = self.plan.kinds[n]
            if n.op in _OPS:
                code = _OPS[n.op]
            elif kind in ("extern", "getitem"):
                code = _CALL
            elif kind == "view":
                code = _VIEW
            elif kind == "store":
                code = _STORE
            elif compute or n in self.small:
                code = _FUSED
            else:
                code = _ALLOCATE if n in self.layout else _SKIP
            steps.append((i, n, code, self.plan.last_member.get(n, -1)))
        self._steps[compute] = steps
        return steps

    def __call__(self, *call_args: Any) -> Any:
        # Boxed (one list, which it empties) as AOTAutograd's forward calls it; unboxed from some of its
        # backward wrappers. A graph's inputs are tensors and numbers, never a list.
        args = call_args[0] if len(call_args) == 1 and type(call_args[0]) is list else list(call_args)
        compute = _C._mode() == "compute"
        durations = self.group_durations()
        env: dict[torch.fx.Node, Any] = {}
        inputs = iter(args)
        result: Any = None
        free_after = self.free_after
        for i, n, code, group in self.steps(compute):
            if code == _SKIP:
                env[n] = VIRTUAL
            elif code == _CALL:
                a, kw = _resolve(n, env)
                env[n] = n.target(*a, **kw)  # type: ignore[operator]
            elif code == _VIEW:
                if env[n.args[0]] is VIRTUAL:  # type: ignore[index]
                    env[n] = VIRTUAL
                else:
                    a, kw = _resolve(n, env)
                    env[n] = n.target(*a, **kw)  # type: ignore[operator]
            elif code == _ALLOCATE:
                shape, stride, dtype, device = self.layout[n]
                env[n] = torch.empty_strided(shape, stride, dtype=dtype, device=device)
            elif code == _FUSED:
                env[n] = self.fused(n, env, compute)
            elif code == _STORE:
                env[n] = _store(env[n.args[0]], env[n.args[1]])  # type: ignore[index]
            elif code == _PLACEHOLDER:
                env[n] = next(inputs)
            elif code == _GET_ATTR:
                env[n] = _fetch_attr(self.gm, str(n.target))
            else:
                result = torch.fx.node.map_arg(n.args[0], lambda a: env[a])
            if group >= 0 and durations[group] > 0:
                _C._emulate_kernel(self.devices[group], durations[group])
            for dead in free_after[i]:
                env.pop(dead, None)
        args.clear()  # the inputs die with the graph's own references, as in Inductor's boxed calls
        return result

    def fused(self, n: torch.fx.Node, env: dict[torch.fx.Node, Any], compute: bool) -> Any:
        """A fused op's value: computed on the host where eager emugpu would compute it, else none."""
        value: Any = VIRTUAL
        # Cheap test first: an input that is a fused intermediate means no value here.
        if not any(env[j] is VIRTUAL for j in self.inputs_of[n]):
            a, kw = _resolve(n, env)
            if compute or all(_real_and_small(t) for t in _leaves(a, kw) if isinstance(t, torch.Tensor)):
                value = _on_host(n, a, kw)
        layout = self.layout.get(n)
        if layout is None:
            return value
        shape, stride, dtype, device = layout
        out = torch.empty_strided(shape, stride, dtype=dtype, device=device)
        if isinstance(value, torch.Tensor):
            _C._host_view(out).copy_(value)
            _C._set_materialized(out, True)
        return out


def _leaves(a: tuple[Any, ...], kw: dict[str, Any]) -> list[Any]:
    """An aten op's arguments, lists opened (pytree's general walk costs more than the op's bookkeeping)."""
    out: list[Any] = []
    for v in (*a, *kw.values()):
        if isinstance(v, list | tuple):
            out.extend(v)
        else:
            out.append(v)
    return out


def _store(dst: torch.Tensor, value: Any) -> torch.Tensor:
    """A fused kernel writes `value` into a graph input: real bytes where it has them, else a placeholder."""
    view = _C._host_view(dst)  # a write: copies deferred from `dst` are done first (docs/execution.md)
    if isinstance(value, torch.Tensor) and value.device.type == "emugpu" and _C._is_materialized(value):
        value = _C._host_view(value)
    if isinstance(value, torch.Tensor) and value.device.type == "cpu":
        view.copy_(value)
        _C._set_materialized(dst, True)
    else:
        _C._set_materialized(dst, False)
    return dst


def _real_and_small(t: torch.Tensor) -> bool:
    if t.device.type != "emugpu":
        return True  # a host value computed earlier in this graph, or a CPU scalar
    return t.untyped_storage().nbytes() <= SMALL_REAL_BYTES and _C._is_materialized(t)


def _on_host(n: torch.fx.Node, a: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    def host(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.device.type == "emugpu":
            return _C._host_view(v)
        if isinstance(v, torch.device) and v.type == "emugpu":
            return torch.device("cpu")
        if isinstance(v, list | tuple):
            return type(v)(host(x) for x in v)
        return v

    host_args = tuple(host(v) for v in a)
    host_kw = {k: host(v) for k, v in kw.items()}
    if "device" in host_kw:
        host_kw["device"] = torch.device("cpu")
    return n.target(*host_args, **host_kw)  # type: ignore[operator]


def _resolve(n: torch.fx.Node, env: dict[torch.fx.Node, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    a = torch.fx.node.map_arg(n.args, lambda x: env[x])
    kw = torch.fx.node.map_arg(n.kwargs, lambda x: env[x])
    return a, kw


def _fetch_attr(gm: torch.fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


class SpecializingGraph:
    """A graph with symbolic shapes (dynamic=True, or a recompile after a new shape): the groups' sizes
    are only known at a call. So each new set of input shapes gets the graph traced again with them
    (make_fx on fake tensors: no kernel runs, nothing is charged), grouped and run as a static graph;
    where that tracing fails, the ops run and are timed one by one, as eager, with a warning."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self._boxed_call = True
        self.gm = gm
        self.static: dict[tuple[Any, ...], CompiledGraph | None] = {}

    def __call__(self, *call_args: Any) -> Any:
        args = call_args[0] if len(call_args) == 1 and type(call_args[0]) is list else list(call_args)
        values = list(args)
        args.clear()
        key = tuple(
            (tuple(v.shape), v.stride(), v.dtype, v.device) if isinstance(v, torch.Tensor) else v for v in values
        )
        if key not in self.static:
            self.static[key] = self.specialize(values)
        compiled = self.static[key]
        if compiled is None:
            return self.gm(*values)
        return compiled(values)

    def specialize(self, values: list[Any]) -> CompiledGraph | None:
        from torch.fx.experimental.proxy_tensor import make_fx

        try:
            with torch._C._DisableAutocast():
                static = make_fx(self.gm, tracing_mode="fake")(*values)
        except Exception as e:  # noqa: BLE001 - any tracing failure: fall back to eager timing, said once
            with _lock:
                stats["eager_graphs"] += 1
            warnings.warn(
                f"emugpu: a torch.compile graph with dynamic shapes could not be specialised to its inputs' "
                f"shapes ({type(e).__name__}: {e}); its ops are timed one by one, as eager. Pass dynamic=False "
                f"to torch.compile to have it timed as Inductor's kernels",
                stacklevel=3,
            )
            return None
        return CompiledGraph(static)


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
    """AOTAutograd's compiler for one graph."""
    if fusion.has_symbolic_shapes(gm.graph):
        return SpecializingGraph(gm)
    return CompiledGraph(gm)
