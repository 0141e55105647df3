"""The region planner: measured profiles drive the emulated clock.

When a model running on emugpu matches a profile for the emulated GPU (by
name, given with `use_profile`/`profiled_as`, or by its parameter count; the
lookup is profiles.py's), its forward pass is charged the profiled forward
time for the observed batch size, and everything from the end of the forward
to the next forward (loss, backward, optimizer step) the profiled
backward+update time. An nn.DataParallel over N emugpu devices is timed as
one model by the profile's N-GPU table (its `data_parallel` entry for N) at
the batch it is given: its regions open on every device it runs on, so the
replicas' work is budgeted within the step, which ends on device_ids[0]
(where the gradients are reduced and the optimizer steps). Without an N-GPU
table it keeps the 1-GPU time of the whole batch on device_ids[0], and says
so once. Models that match no profile get regions too, timed by their ops'
cost-model times, so that region_report() lists every model.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from torch_emugpu import _C
from torch_emugpu.device import device_module
from torch_emugpu.distributed import _parallel
from torch_emugpu.timing import profiles

__all__ = ["activate", "use_profile", "profiled_as", "region_report"]


_COST_MODEL = -1.0  # a region target: no profile, the ops' cost-model times stand


@dataclass
class _Plan:
    device: int  # its regions end the iteration: the model's device (DataParallel: device_ids[0])
    label: str
    forward_key: str
    backward_key: str
    forward_s: float
    backward_s: float
    entry: dict[str, Any]
    # nn.DataParallel over several devices: its gradients are reduced onto `device`
    replicated: bool = False
    # with an N-GPU table, its other devices: regions with the same targets
    # budget the replicas' work there, so it cannot hold the step up past its time
    others: tuple[int, ...] = ()
    batch: int = 0
    # an unprofiled batch size: its regions' targets follow the cost model's curve once each key
    # completed an occurrence (until then the straight line between the profiled points)
    forward_bent: bool = False
    backward_bent: bool = False

    @property
    def devices(self) -> tuple[int, ...]:
        return (self.device, *self.others)


def _grad_tensors(output: Any, limit: int = 16) -> list[torch.Tensor]:
    """Tensors of a module's output that autograd will flow back through."""
    found: list[torch.Tensor] = []
    stack = [output]
    while stack and len(found) < limit:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            if item.requires_grad:
                found.append(item)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif hasattr(item, "values") and callable(item.values):  # e.g. transformers' ModelOutput
            stack.extend(item.values())
    return found


# torch.nn's frames and the package's own (all of it: DataParallel's scatter and gather call modules too)
_INTERNAL = (
    os.path.dirname(torch.nn.modules.module.__file__),
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
)


def _user_stacklevel() -> int:
    """The stacklevel, seen from the caller, of the first frame outside torch.nn and this package."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    return level


# A root module's plans by (batch size, profile name, (autocast?, dtype)).
_PlanKey = tuple[int, str | None, tuple[bool, str]]


class _Planner:
    """Owns the model-level regions: which root module runs under which
    profile, and the forward / backward + update regions it opens on its
    device (csrc/core/device.h decides their timing)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.plans: weakref.WeakKeyDictionary[torch.nn.Module, dict[_PlanKey, _Plan | None]] = (
            weakref.WeakKeyDictionary()
        )
        self.module_info: weakref.WeakKeyDictionary[torch.nn.Module, tuple[int, int] | None] = (
            weakref.WeakKeyDictionary()
        )
        self.explicit: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
        self.scoped = threading.local()
        # thread -> the root module inside its forward, its plan (None: cost model) and its own hooks
        self.active: dict[int, tuple[torch.nn.Module, _Plan | None, tuple[Any, Any]]] = {}
        self.sources: dict[str, dict[str, Any]] = {}
        self.warned: set[str] = set()
        self.hooks_installed = False
        self.discovery: Any = None  # the global pre-hook's handle while it is registered
        self.generation = -1  # of the profiles the plans were made from (_C._profiles_generation)
        # the module inside a DataParallel -> its parameters' gradient hooks from the last forward
        self.reduction_hooks: weakref.WeakKeyDictionary[torch.nn.Module, list[Any]] = weakref.WeakKeyDictionary()

    def forget(self) -> None:
        with self.lock:
            self.plans.clear()
            self.module_info.clear()
            self.sources.clear()
            self.warned.clear()

    def follow_reloads(self) -> None:
        """Plans made from profiles read before the last configuration or reload go."""
        generation = _C._profiles_generation()
        if generation != self.generation:
            self.forget()
            self.generation = generation

    def reloaded(self, summaries: list[dict[str, Any]]) -> None:
        """The profiles were read again (configure(), profiles.reload()): hooks once there are any."""
        self.follow_reloads()
        if summaries:
            self.install()

    def warn_once(self, key: str, message: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            warnings.warn(message, stacklevel=_user_stacklevel())

    def device_and_parameters(self, module: torch.nn.Module) -> tuple[int, int] | None:
        if module.__dict__.get("_is_replica", False):
            # nn.DataParallel's copy of its module for one device (under no_grad,
            # the first one holds the parameters themselves): its forward is
            # part of the DataParallel step, which is timed as a whole.
            return None
        if module in self.module_info:
            return self.module_info[module]
        info = None
        try:
            params = list(module.parameters())
        except Exception:  # noqa: BLE001 - the hook must not break what runs natively
            # A module that cannot list its parameters (a RemoteModule inside it) is not timed as a
            # root; its local submodules are.
            params = []
        if params and params[0].device.type == "emugpu":
            info = (params[0].device.index or 0, sum(p.numel() for p in params))
        self.module_info[module] = info
        return info

    def name_of(self, module: torch.nn.Module) -> str | None:
        """The profile name given for `module`, if any."""
        name = self.explicit.get(module)
        if name is None and isinstance(module, torch.nn.DataParallel):
            name = self.explicit.get(module.module)  # use_profile(model, ...) before wrapping it
        inner = module.__dict__.get("_modules", {}).get("_orig_mod")
        if name is None and type(module).__name__ == "OptimizedModule" and inner is not None:
            name = self.explicit.get(inner)  # use_profile(model, ...) before torch.compile(model)
        return name or getattr(self.scoped, "model", None)

    def plan_for(self, module: torch.nn.Module, info: tuple[int, int], args: tuple[Any, ...]) -> _Plan | None:
        """The plan of a root module on emugpu (`info`: its device and parameter count)."""
        self.follow_reloads()
        batch = _batch_size(args, _parallel.batch_dim(module))
        if batch is None or batch < 1:
            return None
        device, parameters = info
        name = self.name_of(module)
        precision = _precision(module)
        cached = self.plans.setdefault(module, {})
        if (batch, name, precision) in cached:
            return cached[(batch, name, precision)]
        gpu = device_module.get_device_name(device)
        shown = module.__dict__.get("_modules", {}).get("_orig_mod", module)  # torch.compile's wrapper: its model
        label = name or f"{type(shown).__name__}({parameters} parameters)"
        fingerprint = None if name else parameters
        span = _parallel.data_parallel_span(module, batch)
        gpus = span.gpu_count if span is not None else 1
        # A MIG instance or an MPS client capped below its GPU's SMs (a parent_name) runs on fewer SMs
        # than the GPU's profiles were measured on: the cost model times it.
        partition = bool(device_module.get_device_properties(device).parent_name)
        entry = (
            None
            if partition
            else profiles.lookup(model=name, batch_size=batch, gpu=gpu, parameters=fingerprint, gpu_count=gpus)
        )
        if entry is None and span is not None and not partition:
            entry = profiles.lookup(model=name, batch_size=batch, gpu=gpu, parameters=fingerprint)
            if entry is not None:
                gpus = 1
                self.warn_once(
                    f"data parallel fallback:{entry['path']}:{span.gpu_count}",
                    f"emugpu: {entry['path']} has no {span.gpu_count}-GPU table, so nn.DataParallel over "
                    f"emugpu devices {[span.primary, *span.others]} takes the 1-GPU time of its whole "
                    f"batch ({batch}) on device {span.primary}, and its other replicas the cost model. "
                    f"Add a 'data_parallel' entry with gpu_count {span.gpu_count} to that profile "
                    f"(profiles/README.md) to time the step as measured on {span.gpu_count} GPUs",
                )
        if entry is not None and (entry["amp"], entry["dtype"]) != precision:
            # A profile times the model as measured: another precision runs other kernels.
            self.warn_once(
                f"precision:{entry['path']}:{precision}",
                f"emugpu: {entry['path']} was measured {_describe_precision(entry['amp'], entry['dtype'])}"
                f", but {label} runs {_describe_precision(*precision)}; its time comes from the cost "
                f"model instead",
            )
            entry = None
        plan = None
        if entry is None:
            # Cost-model regions: timed by their ops alone, reported beside the profiled ones.
            at = f"{label}@{batch}"
            plan = _Plan(
                device, label, f"{at}:forward", f"{at}:backward", _COST_MODEL, _COST_MODEL, {}, span is not None
            )
            source = {"source": "cost model", "batch_size": batch, "target_from": "cost model"}
            self.sources[plan.forward_key] = self.sources[plan.backward_key] = source
            why = f"no profile for model '{name}'" if name else f"no profile matched {label} (by parameter count)"
            self.warn_once(
                f"cost model:{label}:{gpu}",
                f"emugpu: {why} on {gpu}; its time comes from the per-op cost model "
                f"({_C._current_kernel_params(device)['source']}). "
                f"Name its profile with torch_emugpu.use_profile(model, NAME), or measure one with "
                f"`torch-emugpu profile` (`torch-emugpu profiles` lists what exists)",
            )
        else:
            model = entry["model"]
            if entry["kind"] == "extrapolated":
                sizes = next(s for count, s in entry["tables"] if count == gpus)
                table = f"the {gpus}-GPU table of " if gpus > 1 else ""
                self.warn_once(
                    f"extrapolated:{entry['path']}:{gpus}",
                    f"emugpu: batch size {batch} lies outside the profiled range {sizes[0]}-{sizes[-1]} "
                    f"of {table}{entry['path']}; extrapolating along the cost model's curve through its "
                    f"nearest profiled points",
                )
            at = f"{model}@{batch}" if gpus == 1 else f"{model}@{batch}:dp{gpus}"
            plan = _Plan(
                device,
                label,
                f"{at}:forward",
                f"{at}:backward",
                entry["forward_s"],
                entry["backward_s"],
                entry,
                span is not None,
                span.others if gpus > 1 and span is not None else (),
                batch,
            )
            source = {"source": entry["path"], "kind": entry["kind"], "batch_size": batch, "gpu_count": gpus}
            source.update(_linear_origin(entry, batch))
            if gpus > 1:
                source["devices"] = list(plan.devices)
            elif span is not None:
                source["note"] = (
                    f"nn.DataParallel over {span.gpu_count} GPUs without a {span.gpu_count}-GPU "
                    f"table: the 1-GPU time of the whole batch"
                )
            for region in (plan.forward_key, plan.backward_key):
                self.sources[region] = dict(source)
        cached[(batch, name, precision)] = plan
        return plan

    # Root modules are found by one global forward pre-hook. Any global hook
    # puts every module call on nn.Module's slow path (about 3 us each), so
    # it is registered only while no root's forward runs: a running root
    # carries two hooks of its own instead (one for its end, one for a call
    # of it that comes while its last forward never returned), removed when
    # its forward returns. The cost: a root called by another thread while
    # one thread's root runs is timed by the cost model alone.

    def update_discovery(self) -> None:
        with self.lock:
            wanted = self.hooks_installed and not self.active
            if wanted and self.discovery is None:
                self.discovery = torch.nn.modules.module.register_module_forward_pre_hook(_discover_root)
            elif not wanted and self.discovery is not None:
                self.discovery.remove()
                self.discovery = None

    def pre_hook(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        thread = threading.get_ident()
        running = self.active.get(thread)
        if running is not None and running[0] is not module:
            return  # a submodule of the running root
        called_at = _C._host_now_ns()  # this hook's own work belongs to the forward, as in a profile
        if running is not None:  # its last forward never returned (KeyboardInterrupt), or it calls itself
            self.leave(thread)
            if running[1] is not None:
                for device in running[1].devices:
                    _C._region_abort(device)
        info = self.device_and_parameters(module)
        if info is None:
            return  # not on emugpu
        plan = self.plan_for(module, info, args)
        # Submodules return at once; the post-hook is found after the forward (nn.Module reads them then).
        hooks = (
            module.register_forward_pre_hook(_root_called_again, prepend=True),
            module.register_forward_hook(_root_returned, prepend=True, always_call=True),
        )
        self.active[thread] = (module, plan, hooks)
        self.update_discovery()
        if plan is None:
            return
        if not plan.forward_bent:
            self.bend(plan, backward=False)
        _use_measured_transfer(plan, args)
        host_bound = 0
        for device in plan.devices:
            if device != plan.device:
                # The loop waits on device_ids[0] only; the other devices reach a
                # sync point here, so their last backward region closes now and
                # their forward starts with device_ids[0]'s, not where that one ended.
                torch.Event(device=torch.device("emugpu", device)).record(device_module.current_stream(device))
            host_bound += _C._forward_begin(device, plan.forward_key, plan.forward_s, called_at)
        if host_bound > 0:
            self.warn_once(
                "host-bound",
                "emugpu: the host launched a profiled region's work later than the "
                "profiled time allows (host-bound), so that region took longer than its profile; "
                "torch_emugpu.region_report() lists which ('host_bound')",
            )

    def bend(self, plan: _Plan, backward: bool) -> None:
        """A batch size between or beyond a profile's points: once its region completed an occurrence,
        the cost model's curve through that occurrence bends its target (csrc/core/batch_curve.h)."""
        if not plan.entry or plan.entry["kind"] == "exact":
            plan.forward_bent = plan.backward_bent = True  # nothing to bend
            return
        key = plan.backward_key if backward else plan.forward_key
        column = 2 if backward else 1
        points = [(int(p[0]), float(p[column])) for p in plan.entry["points"]]
        bent = _C._region_curve_target(plan.device, key, plan.batch, points)
        if bent is None:
            return  # no complete occurrence yet: the straight line stands
        if backward:
            plan.backward_s, plan.backward_bent = bent["target_s"], True
        else:
            plan.forward_s, plan.forward_bent = bent["target_s"], True
        lo, hi = bent["between"]
        source = self.sources.setdefault(key, {})
        source["target_from"] = "cost-model curve" if bent["method"] != "scaled" else "cost-model scaled"
        source["between"] = [lo, hi]
        source["cost_model_s"] = bent["cost_model_s"]

    def leave(self, thread: int) -> None:
        """The root running in `thread` returned: its own hooks go, discovery may come back."""
        _, _, hooks = self.active.pop(thread)
        for handle in hooks:
            handle.remove()
        self.update_discovery()

    def post_hook(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        thread = threading.get_ident()
        running = self.active.get(thread)
        if running is None or running[0] is not module:
            return
        self.leave(thread)
        plan = running[1]
        if plan is None:
            return
        if sys.exc_info()[0] is not None:  # the forward raised (e.g. out of memory): close, charge nothing more
            for device in plan.devices:
                _C._region_abort(device)
            return
        # Loss, backward and the optimizer step run until the next forward, or
        # until the loop waits for the device; only if autograd will run.
        # DataParallel's other devices close after the gather was launched, so
        # their pads come after the copies it waits for.
        outputs = _grad_tensors(output) if torch.is_grad_enabled() else []
        if not plan.backward_bent:  # its last backward region closed when this forward began
            self.bend(plan, backward=True)
        for device in plan.devices:
            _C._forward_end(device, plan.backward_key, plan.backward_s, bool(outputs))
        self.watch_backward(module, plan, outputs)

    def watch_backward(self, module: torch.nn.Module, plan: _Plan, outputs: list[torch.Tensor]) -> None:
        """Gradient hooks that say when autograd reached the model, so its backward + update is under way."""
        if not plan.replicated:
            if outputs:
                reached = _BackwardReached(plan)
                for t in outputs:
                    t.register_hook(reached)
            return
        # Autograd records events on every device while DataParallel's
        # backward crosses devices, and a recorded event closes a started
        # backward region (csrc/core/device.h). So its regions start when the
        # reduced gradients reach the parameters, once the replicas' backward
        # and the reduction onto device_ids[0] were launched. Parameter hooks
        # outlive the forward: the last forward's go first, fired or not.
        inner = module.module
        assert isinstance(inner, torch.nn.Module), f"a replicated plan's module wraps a Module, got {type(inner)}"
        for handle in self.reduction_hooks.pop(inner, []):
            handle.remove()
        if not outputs:
            return
        reached = _BackwardReached(plan)
        params = [p for p in inner.parameters() if p.requires_grad]
        self.reduction_hooks[inner] = [t.register_hook(reached) for t in params or outputs]

    def install(self) -> None:
        with self.lock:
            self.hooks_installed = True
            self.update_discovery()


class _BackwardReached:
    """Gradient hook on a root module's outputs (a DataParallel's: on its
    parameters): autograd reached the model, so its backward + update regions
    are under way (once per backward pass)."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan
        self.fired = False

    def __call__(self, grad: torch.Tensor) -> None:
        if not self.fired:
            self.fired = True
            for device in self.plan.devices:
                _C._backward_reached(device, self.plan.backward_key, self.plan.backward_s)


_planner = _Planner()


# The hooks are module-level functions, not the planner's bound methods: a
# root deep-copied or pickled inside its forward copies them by reference.
# Each returns at once while Dynamo traces (torch.compile): a traced hook is a no-op, not a graph break.
# A module compiled with torch.compile(module) still runs them, around the compiled call, at run time.
def _discover_root(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
    if torch.compiler.is_compiling():
        return
    if threading.get_ident() not in _planner.active:  # else another thread's root brought discovery back
        _planner.pre_hook(module, args)


def _root_called_again(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
    if torch.compiler.is_compiling():
        return
    _planner.pre_hook(module, args)


def _root_returned(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
    if torch.compiler.is_compiling():
        return
    _planner.post_hook(module, args, output)


def _has_profile_files() -> bool:
    for directory in profiles.search_path():
        try:
            if any(p.name not in ("gpus.json", "schema.json") for p in directory.rglob("*.json")):
                return True
        except OSError:
            continue
    return False


class _CostModelNotice:
    """Where no profile exists at all, the planner's hooks would only slow
    every module call down; one hook says once that times come from the cost
    model, at the first forward on emugpu, and removes itself."""

    def __init__(self) -> None:
        self.handle: Any = None

    def __call__(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if torch.compiler.is_compiling():
            return
        if _planner.hooks_installed:
            self.remove()
            return
        if _planner.device_and_parameters(module) is None:
            return
        self.remove()
        if _C._profile_summaries():  # the first configuration found profiles the import did not see
            _planner.install()
            _planner.pre_hook(module, args)
            return
        dirs = ", ".join(str(p) for p in profiles.search_path())
        warnings.warn(
            f"emugpu: no measured profiles on the search path ({dirs}), so every model's time comes "
            f"from the per-op cost model. Measure profiles with `torch-emugpu profile` on a CUDA "
            f"machine or import some with `torch-emugpu import gpemu`",
            stacklevel=_user_stacklevel(),
        )

    def remove(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


_notice = _CostModelNotice()


def activate() -> None:
    """At the package's import: the planner's hooks when profiles exist, else
    the one-shot cost-model notice; the hooks follow once a reload finds some."""
    # torch.compile(module) warns at every OptimizedModule call while any global hook exists, that the
    # hook fires for the wrapper too. The planner's do so on purpose (the wrapper is the root it times,
    # and they are no-ops inside the compiled call), so the warning would only alarm users.
    warnings.filterwarnings(
        "ignore", message=r"Using `torch.compile\(module\)` when there are global hooks", category=UserWarning
    )
    profiles.on_reload(_planner.reloaded)
    if _has_profile_files():
        _planner.install()
    elif _notice.handle is None and not _planner.hooks_installed:
        _notice.handle = torch.nn.modules.module.register_module_forward_pre_hook(_notice)


def profiles_reloaded() -> None:
    """configure() read the profiles again: hooks once there are any."""
    _planner.reloaded(_C._profile_summaries())


def use_profile(module: torch.nn.Module, model: str) -> torch.nn.Module:
    """Names the profile `module` runs under (e.g. "resnet50"); returns `module`."""
    _planner.explicit[module] = model
    _planner.install()
    return module


@contextlib.contextmanager
def profiled_as(model: str) -> Iterator[None]:
    """Root modules run inside the block use the profile named `model`."""
    previous = getattr(_planner.scoped, "model", None)
    _planner.scoped.model = model
    _planner.install()
    try:
        yield
    finally:
        _planner.scoped.model = previous


def _precision(module: torch.nn.Module) -> tuple[bool, str]:
    """(autocast on emugpu?, the dtype it computes in) for a forward about to run."""
    if torch.is_autocast_enabled("emugpu"):
        return True, str(torch.get_autocast_dtype("emugpu")).removeprefix("torch.")
    param = next(module.parameters(), None)
    return False, str(param.dtype if param is not None else torch.float32).removeprefix("torch.")


def _describe_precision(amp: bool, dtype: str) -> str:
    return f"under {dtype} autocast" if amp else f"in {dtype}"


def _batch_size(args: tuple[Any, ...], dim: int = 0) -> int | None:
    for a in args:
        if isinstance(a, torch.Tensor):
            return int(a.shape[dim]) if -a.dim() <= dim < a.dim() else None
    return None


def _linear_origin(entry: dict[str, Any], batch: int) -> dict[str, Any]:
    """How a lookup's target was made before any occurrence gave the cost model's curve."""
    sizes = [int(p[0]) for p in entry.get("points", [])]
    if entry["kind"] == "exact" or not sizes:
        return {"target_from": "profile point", "between": [batch, batch]}
    if len(sizes) == 1:
        return {"target_from": "straight line", "between": [sizes[0], sizes[0]]}
    upper = next((i for i, b in enumerate(sizes) if b > batch), len(sizes) - 1)
    upper = min(max(upper, 1), len(sizes) - 1)
    return {"target_from": "straight line", "between": [sizes[upper - 1], sizes[upper]]}


def _use_measured_transfer(plan: _Plan, args: tuple[Any, ...]) -> None:
    entry = plan.entry
    pageable = entry.get("transfer_pageable_s")
    if not pageable:
        return
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if first is None:
        return
    nbytes = first.numel() * first.element_size()
    pinned = entry.get("transfer_pinned_s")
    _C._set_measured_transfer(plan.device, 0.0, nbytes / pageable, nbytes / pinned if pinned else 0.0)


def region_report(device: int | None = None) -> list[dict[str, Any]]:
    """Per region: its source (profile file and whether exact, interpolated or
    extrapolated), the profiled target and how it was made (`target_from`: "profile
    point"; "straight line" between the profiled batch sizes `between`, for a batch
    size's first occurrence; "cost-model curve" through `between` once an occurrence
    gave the cost model's time, `cost_model_s`; "cost model"), the device time of its last complete
    occurrence, how often it was host-bound (took longer because the host
    launched its work too late), cancelled or aborted. Models that matched no
    profile have regions too, with source "cost model" and target_s None: their
    ops keep the cost model's times, and last_s says what their forward and
    backward + update took on the device."""
    index = device_module.current_device() if device is None else device
    _planner.follow_reloads()
    return [{**r, **_planner.sources.get(r["key"], {"source": "unknown"})} for r in _C._region_report(index)]
