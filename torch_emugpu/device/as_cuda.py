"""Run mode: a script written for CUDA gets the emulated GPUs, unmodified.

`torch-emugpu run -- CMD` (or EMUGPU_AS_CUDA=1 in the environment, which
child processes inherit) installs this at `import torch`. Only the places
where a script *names* a device are translated, so an op costs what it costs
on emugpu (no TorchFunctionMode or dispatch mode sees every op):

- `torch.cuda.*` becomes torch.emugpu's functions (availability, devices,
  streams, events, memory statistics, RNG), with CUDA's device count under
  CUDA_VISIBLE_DEVICES and CUDA's error for an ordinal beyond it;
- the factory functions and Tensor methods that take a `device` (every aten
  op with a device argument: `FACTORIES`, `TENSOR_METHODS`), `Tensor.to`,
  `Tensor.cuda` (and so `Module.cuda`/`Module.to`), `torch.Generator`,
  `torch.set_default_device`, `with torch.device("cuda")`, autocast and
  GradScaler, `torch.load`'s CUDA locations, and backend `nccl` of
  torch.distributed translate "cuda", "cuda:N" and torch.device("cuda", N)
  to the emugpu device of the same index;
- at the first `torch.compile`, what Dynamo and Inductor ask of `torch.cuda`
  (`prepare_compile`: docs/compile.md, "Under torch-emugpu run").

`torch.device("cuda")` itself stays a CUDA device: it is a C type that
isinstance checks, pickling and TorchScript rely on, and scripts compare its
`.type` with "cuda". What it names is translated where it is used.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from torch_emugpu.device._launcher import is_launcher

ENV = "EMUGPU_AS_CUDA"
# The emulated GPU count before CUDA_VISIBLE_DEVICES narrowed it, kept for child processes.
PHYSICAL_ENV = "EMUGPU_AS_CUDA_GPUS"

# torch functions with a `device` argument (the public aten ops whose schema has one, plus
# torch.asarray's Python binding); test_run_mode checks that the list covers torch's schemas.
FACTORIES = (
    "arange", "as_tensor", "asarray", "bartlett_window", "blackman_window", "empty", "empty_like",
    "empty_permuted", "empty_quantized", "empty_strided", "eye", "from_file", "full", "full_like",
    "hamming_window", "hann_window", "kaiser_window", "linspace", "logspace", "normal", "ones",
    "ones_like", "rand", "rand_like", "randint", "randint_like", "randn", "randn_like", "randperm",
    "range", "scalar_tensor", "sparse_bsc_tensor", "sparse_bsr_tensor", "sparse_compressed_tensor",
    "sparse_coo_tensor", "sparse_csc_tensor", "sparse_csr_tensor", "tensor", "tril_indices",
    "triu_indices", "zeros", "zeros_like",
)  # fmt: skip
FFT_FACTORIES = ("fftfreq", "rfftfreq")
# Tensor methods whose `device` is keyword-only; `to` and `cuda` have wrappers of their own.
TENSOR_METHODS = ("new_empty", "new_empty_strided", "new_full", "new_ones", "new_tensor", "new_zeros")

_installed = False
_visible: int | None = None  # GPUs the script may see (CUDA_VISIBLE_DEVICES applied); None: not known yet
_MISSING = object()
_replaced: list[tuple[Any, str, Any]] = []  # (owner, name, what was there) for uninstall()


def requested(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether EMUGPU_AS_CUDA asks for run mode ("1", "true", "yes"; "0" or unset: no)."""
    return environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def active() -> bool:
    return _installed


# --- device translation ------------------------------------------------------


def visible_count(physical: int, spec: str | None) -> int:
    """How many of `physical` GPUs CUDA shows under CUDA_VISIBLE_DEVICES=`spec`:
    ordinals are read as strtoul does, up to the first negative one or one
    beyond `physical`; a repeated ordinal shows none; GPU- UUIDs name no
    emulated GPU, so they show none (MIG- UUIDs go to the core: narrow_to_visible_devices)."""
    if spec is None:
        return physical
    spec = spec.strip()
    if spec.startswith(("GPU-", "MIG-")):
        return 0
    seen: list[int] = []
    for item in spec.split(","):
        digits = ""
        for i, c in enumerate(item.strip()):
            if c.isdigit() or (i == 0 and c in "+-"):
                digits += c
            else:
                break
        try:
            ordinal = int(digits)
        except ValueError:
            break
        if ordinal in seen:
            return 0
        if ordinal < 0 or ordinal >= physical:
            break
        seen.append(ordinal)
    return len(seen)


def _visible_now() -> int:
    global _visible
    if _visible is None:
        from torch_emugpu import _C

        _C._ensure_configured()
        _visible = int(_C._device_count())
    return _visible


def invalid_ordinal(index: int) -> RuntimeError:
    """CUDA's error for a device ordinal the process cannot see."""
    n = _visible_now()
    hint = (
        "CUDA_VISIBLE_DEVICES hides every emulated GPU"
        if n == 0
        else f"{n} emulated GPU{'s' if n != 1 else ''} visible; ask for more with "
        f"`torch-emugpu run --gpus N` (EMUGPU_DEVICE_COUNT) or widen CUDA_VISIBLE_DEVICES"
    )
    cls: type[RuntimeError] = getattr(torch, "AcceleratorError", RuntimeError)
    try:
        return cls(f"CUDA error: invalid device ordinal (cuda:{index} asked for; torch-emugpu run: {hint})")
    except TypeError:  # AcceleratorError's constructor may want more arguments
        return RuntimeError(f"CUDA error: invalid device ordinal (cuda:{index} asked for; torch-emugpu run: {hint})")


@functools.lru_cache(maxsize=128)
def _emugpu_device(index: int | None) -> torch.device:
    if index is None:
        if _visible_now() == 0:
            raise RuntimeError(
                "CUDA error: no CUDA-capable device is detected (torch-emugpu run: CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')!r} hides every emulated GPU)"
            )
        return torch.device("emugpu")
    if not 0 <= index < _visible_now():
        raise invalid_ordinal(index)
    return torch.device("emugpu", index)


def to_emugpu(device: Any) -> Any:
    """`device` with CUDA named as emugpu ("cuda:1" -> emugpu:1); anything else unchanged."""
    kind = type(device)
    if kind is str:
        if device.startswith("cuda"):
            return _emugpu_device(torch.device(device).index)
        return device
    if kind is torch.device and device.type == "cuda":
        return _emugpu_device(device.index)
    return device


def _device_kwarg(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with its `device=` keyword translated."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs:
            kwargs["device"] = to_emugpu(kwargs["device"])
        return fn(*args, **kwargs)

    return wrapper


def _as_builtin(wrapper: Callable[..., Any], op: str) -> Callable[..., Any]:
    """TorchScript compiles calls of `wrapper` as the aten op `op`, as it did the function it wraps."""
    from torch.jit import _builtins

    if _builtins._builtin_table is None:  # built at the first scripting, from this list among others
        _builtins._builtin_ops.append((wrapper, op))
    else:
        _builtins._register_builtin(wrapper, op)
    return wrapper


def _tensor_to(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args:
            first = args[0]
            kind = type(first)
            if (kind is str and first.startswith("cuda")) or (kind is torch.device and first.type == "cuda"):
                args = (to_emugpu(first), *args[1:])
        if "device" in kwargs:
            kwargs["device"] = to_emugpu(kwargs["device"])
        return original(self, *args, **kwargs)

    return to


def _tensor_cuda(
    self: torch.Tensor,
    device: Any = None,
    non_blocking: bool = False,
    memory_format: torch.memory_format = torch.preserve_format,
) -> torch.Tensor:
    """Tensor.cuda(): a copy on the current (or the given) emulated GPU."""
    if device is None:
        from torch_emugpu.device import _devices

        target = _emugpu_device(_devices.current())
    elif isinstance(device, int):
        target = _emugpu_device(device)
    else:
        target = to_emugpu(device)
        if not (isinstance(target, torch.device) and target.type == "emugpu"):
            raise ValueError(f"Tensor.cuda(device=...): expected a CUDA device, got {device!r}")
    return self.to(target, non_blocking=non_blocking, memory_format=memory_format)


class _GeneratorType(type):
    """isinstance(g, torch.Generator) and attribute reads keep answering for torch's own Generator type."""

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, torch._C.Generator)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, torch._C.Generator)

    def __getattr__(cls, name: str) -> Any:
        return getattr(torch._C.Generator, name)


class Generator(metaclass=_GeneratorType):
    """torch.Generator in run mode: device "cuda" makes an emugpu generator."""

    def __new__(cls, device: Any = "cpu") -> torch._C.Generator:  # type: ignore[misc]
        return torch._C.Generator(to_emugpu(device))


def _generator_annotation(original: Callable[..., Any]) -> Callable[..., Any]:
    """TorchScript knows a Generator annotation by identity with torch.Generator: annotations
    evaluated before run mode (torch's own) name torch._C.Generator."""

    @functools.wraps(original)
    def try_ann_to_type(ann: Any, *args: Any, **kwargs: Any) -> Any:
        return original(Generator if ann is torch._C.Generator else ann, *args, **kwargs)

    return try_ann_to_type


# --- torch.cuda ------------------------------------------------------------------


def _cuda_functions() -> dict[str, Any]:
    """What replaces each torch.cuda name in run mode."""
    from torch_emugpu.device import device_module as emu

    names = {name: getattr(emu, name) for name in emu.__all__ if not name.startswith("_")}
    names.update(
        {
            "is_available": lambda: _visible_now() > 0,
            "device_count": _visible_now,
            "is_initialized": emu.is_initialized,
            "init": emu.init,
            "_lazy_init": emu._lazy_init,
            "_is_in_bad_fork": emu._is_in_bad_fork,
            "ipc_collect": lambda: None,
            "reset_max_memory_allocated": emu.reset_peak_memory_stats,
            "reset_max_memory_cached": emu.reset_peak_memory_stats,
            "memory_cached": emu.memory_reserved,
            "max_memory_cached": emu.max_memory_reserved,
            "get_arch_list": _arch_list,
            "get_device_properties": emu.get_device_properties,
            # No CUDA graph capture is emulated; Dynamo asks before tracing each frame.
            "is_current_stream_capturing": lambda: False,
        }
    )
    return names


def _arch_list() -> list[str]:
    from torch_emugpu.device import device_module as emu

    major, minor = emu.get_device_capability()
    return [f"sm_{major}{minor}"]


def _replace(owner: Any, name: str, value: Any) -> None:
    _replaced.append((owner, name, owner.__dict__.get(name, _MISSING)))
    setattr(owner, name, value)


# --- autocast, GradScaler, distributed, serialization ----------------------------


def _translate_device_type(device_type: Any) -> Any:
    return "emugpu" if device_type == "cuda" else device_type


def _patch_init(cls: type, parameter: str, position: int, translate: Callable[[Any], Any]) -> None:
    """cls.__init__ with its device argument (keyword `parameter`, or positional
    `position` after self) passed through `translate`."""
    original = cls.__dict__["__init__"]

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        if len(args) > position:
            args = (*args[:position], translate(args[position]), *args[position + 1 :])
        elif parameter in kwargs:
            kwargs[parameter] = translate(kwargs[parameter])
        elif parameter == "device" and cls is torch.amp.GradScaler:
            kwargs[parameter] = "emugpu"  # GradScaler's default is "cuda"
        original(self, *args, **kwargs)

    _replace(cls, "__init__", __init__)


_SERIALIZATION_PRIORITY = 15  # before torch's own "cuda" entry (20), which needs a CUDA driver


def _cuda_deserialize(obj: Any, location: str) -> Any:
    """torch.load: storages saved on cuda:N load onto emugpu:N."""
    if location.startswith("cuda"):
        return obj.to(device=to_emugpu(location))
    return None


def _cuda_tag(obj: Any) -> str | None:
    """torch.save: an emugpu storage is tagged cuda:N, so that a run-mode script's checkpoints are CUDA's
    (they load on a real GPU machine without map_location, and here through _cuda_deserialize)."""
    device = getattr(obj, "device", None)
    if device is not None and device.type == "emugpu":
        return f"cuda:{device.index or 0}"
    return None


def _translate_backend(backend: Any) -> Any:
    """Backend names: nccl -> emu, and cpu:gloo,cuda:nccl -> cpu:gloo,emugpu:emu."""
    if not isinstance(backend, str):
        return backend
    if backend.lower() == "nccl":
        return "emu"
    if ":" in backend:
        parts = []
        for part in backend.split(","):
            device, _, name = part.partition(":")
            device = "emugpu" if device.strip() == "cuda" else device
            name = "emu" if name.strip().lower() == "nccl" else name
            parts.append(f"{device}:{name}")
        return ",".join(parts)
    return backend


def _distributed_wrapper(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if args:
            args = (_translate_backend(args[0]), *args[1:])
        if "backend" in kwargs:
            kwargs["backend"] = _translate_backend(kwargs["backend"])
        if "device_id" in kwargs:
            device_id = kwargs["device_id"]
            kwargs["device_id"] = _emugpu_device(device_id) if isinstance(device_id, int) else to_emugpu(device_id)
        return fn(*args, **kwargs)

    return wrapper


def _device_type_first(fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn(device_type, ...) with device_type "cuda" made "emugpu" (init_device_mesh, DeviceMesh)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if args:
            args = (_translate_device_type(args[0]), *args[1:])
        if "device_type" in kwargs:
            kwargs["device_type"] = _translate_device_type(kwargs["device_type"])
        return fn(*args, **kwargs)

    return wrapper


# Frames between current_accelerator's caller and the test below: torch.compiler.disable's wrapper (prepare_compile).
_pass_through: set[Any] = set()


def _called_from_torch() -> bool:
    """Whether the code asking for the accelerator is torch's own (not a script's or another library's):
    the first frame outside this module and the wrappers around it."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_globals is globals() or frame.f_code in _pass_through):
        frame = frame.f_back  # type: ignore[assignment]
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name == "torch" or name.startswith("torch.")


def _current_accelerator(original: Callable[..., Any]) -> Callable[..., Any]:
    """torch.accelerator.current_accelerator() is "cuda" to scripts and libraries, which then take
    their CUDA paths (`if device.type == "cuda": torch.cuda.set_device(...)`); torch's own callers
    go on getting emugpu, which they hand to C++ (pinned memory, streams) where "cuda" would fail."""

    @functools.wraps(original)
    def current_accelerator(*args: Any, **kwargs: Any) -> Any:
        device = original(*args, **kwargs)
        if device is not None and device.type == "emugpu" and not _called_from_torch():
            return torch.device("cuda", device.index) if device.index is not None else torch.device("cuda")
        return device

    return current_accelerator


def _available_device_type(original: Callable[[], Any]) -> Callable[[], Any]:
    """torch._utils._get_available_device_type() answers "cuda" (torch.cuda.is_available() is True),
    which DataParallel turns into its source device, cuda:0, where the parameters the script moved
    with `.cuda()` are on emugpu:0: torch's own callers get emugpu, as they would without run mode."""

    @functools.wraps(original)
    def _get_available_device_type() -> Any:
        device_type = original()
        return "emugpu" if device_type == "cuda" and _called_from_torch() else device_type

    return _get_available_device_type


_compile_prepared = False


def prepare_compile() -> None:
    """What torch.compile needs of run mode, done at its first call (torch_emugpu.compile's torch.compile):
    at install, importing Dynamo would add seconds to every `import torch`."""
    global _compile_prepared
    if not _installed or _compile_prepared:
        return
    # Compiled code calls current_accelerator at run time (its stream guard, through
    # torch.accelerator.current_stream): Dynamo would compile the wrapper as a frame of its own and break
    # it at sys._getframe, which then sees the wrong caller.
    disabled = torch.compiler.disable(torch.accelerator.current_accelerator)
    _pass_through.add(disabled.__code__)
    _replace(torch.accelerator, "current_accelerator", disabled)

    # Inductor finds Triton's devices through torch.cuda, here the emulated GPUs': it would set Triton's
    # CUDA driver up (no libcuda: every compile fails, CPU graphs' too). Emulated graphs never reach Triton
    # (torch_emugpu.compile), and run mode leaves no real CUDA device to a script.
    from torch._inductor import config as inductor_config

    detection = "triton_disable_device_detection"
    _replaced.append((inductor_config, detection, getattr(inductor_config, detection)))
    setattr(inductor_config, detection, True)
    _compile_prepared = True


# --- install ---------------------------------------------------------------------


def narrow_to_visible_devices(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Applies CUDA_VISIBLE_DEVICES to the emulated GPU count before the device is configured:
    the script sees as many GPUs as CUDA would, numbered from 0. The count before narrowing is
    kept in EMUGPU_AS_CUDA_GPUS, so a child with a CUDA_VISIBLE_DEVICES of its own narrows the
    same GPUs. Launchers (torchrun) leave it to their workers, whose default count they set."""
    global _visible
    if environ.get("CUDA_VISIBLE_DEVICES") is None or is_launcher():
        return
    spec = environ["CUDA_VISIBLE_DEVICES"]
    if "MIG-" in spec or environ.get("EMUGPU_MIG") or environ.get("EMUGPU_DAEMON"):
        # MIG instances, or a daemon's GPUs: the core selects them as CUDA does (visible_devices.h),
        # so that "1" is the daemon's GPU 1 and a MIG UUID its instance.
        environ.setdefault("EMUGPU_VISIBLE_DEVICES", spec)
        return
    physical_text = environ.get(PHYSICAL_ENV) or environ.get("EMUGPU_DEVICE_COUNT") or environ.get("LOCAL_WORLD_SIZE")
    try:
        physical = int(physical_text) if physical_text else 1
    except ValueError:
        return  # the core's configuration reports the malformed count
    environ[PHYSICAL_ENV] = str(physical)
    visible = visible_count(physical, environ.get("CUDA_VISIBLE_DEVICES"))
    if visible == 0:
        _visible = 0  # torch.cuda.is_available() is False; emugpu itself keeps its count
        return
    environ["EMUGPU_DEVICE_COUNT"] = str(visible)


def install() -> None:
    """Run mode: makes torch.cuda, "cuda" device arguments and backend nccl the emulated GPUs'."""
    global _installed, _cpu_at_install
    if _installed:
        return
    narrow_to_visible_devices()
    from torch.utils import _device as device_context

    # `with torch.device(...)` recognises factories by identity, in a set it builds once: build it
    # from torch's own functions before they are wrapped (the mode sees those, not the wrappers).
    device_context._device_constructors()

    for name in FACTORIES:
        if hasattr(torch, name):
            _replace(torch, name, _as_builtin(_device_kwarg(getattr(torch, name)), f"aten::{name}"))
    for name in FFT_FACTORIES:
        _replace(torch.fft, name, _as_builtin(_device_kwarg(getattr(torch.fft, name)), f"aten::fft_{name}"))
    for name in TENSOR_METHODS:
        _replace(torch.Tensor, name, _device_kwarg(getattr(torch._C.TensorBase, name)))
    _replace(torch.Tensor, "to", _tensor_to(torch._C.TensorBase.to))
    _replace(torch.Tensor, "cuda", _tensor_cuda)
    _replace(torch, "Generator", Generator)
    from torch.jit import annotations

    _replace(annotations, "try_ann_to_type", _generator_annotation(annotations.try_ann_to_type))
    _replace(torch, "set_default_device", _device_kwarg_first(torch.set_default_device))
    _patch_init(device_context.DeviceContext, "device", 0, to_emugpu)

    functions = _cuda_functions()
    for name, value in functions.items():
        _replace(torch.cuda, name, value)
    # torch.cuda.random's functions bound torch.cuda's originals (device_count, _lazy_init) at import:
    # Hugging Face's Trainer saves its RNG state through torch.cuda.random.get_rng_state.
    for name in torch.cuda.random.__all__:
        if name in functions:
            _replace(torch.cuda.random, name, functions[name])
    _replace(torch.accelerator, "current_accelerator", _current_accelerator(torch.accelerator.current_accelerator))
    # DataParallel (and torch._utils' device helpers) bound the name at import; modules imported later
    # (distributed checkpointing) take torch._utils' wrapped one.
    data_parallel = importlib.import_module("torch.nn.parallel.data_parallel")  # the attribute is a function

    available = _available_device_type(torch._utils._get_available_device_type)
    _replace(torch._utils, "_get_available_device_type", available)
    _replace(data_parallel, "_get_available_device_type", available)

    _patch_init(torch.amp.autocast_mode.autocast, "device_type", 0, _translate_device_type)
    _patch_init(torch.amp.GradScaler, "device", 0, _translate_device_type)
    for name in ("custom_fwd", "custom_bwd"):
        _replace(torch.amp, name, _device_type_keyword(getattr(torch.amp, name)))

    torch.serialization.register_package(_SERIALIZATION_PRIORITY, _cuda_tag, _cuda_deserialize)

    if torch.distributed.is_available():
        import torch.distributed as dist
        import torch.distributed.device_mesh as device_mesh

        for name in ("init_process_group", "new_group"):
            _replace(dist, name, _distributed_wrapper(getattr(dist, name)))
        _replace(device_mesh, "init_device_mesh", _device_type_first(device_mesh.init_device_mesh))
    from torch_emugpu.device import _devices

    _devices.cuda_ordinal_error = invalid_ordinal
    _installed = True
    _cpu_at_install = _cpu_s()
    atexit.register(_check_gpu_used)


def uninstall() -> None:
    """Puts back everything install() replaced: the benchmark alternates run mode and native emugpu in one process."""
    global _installed, _visible, _compile_prepared
    while _replaced:
        owner, name, previous = _replaced.pop()
        if previous is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, previous)
    registry = torch.serialization._package_registry
    registry[:] = [entry for entry in registry if entry[2] is not _cuda_deserialize]
    atexit.unregister(_check_gpu_used)
    from torch_emugpu.device import _devices

    _devices.cuda_ordinal_error = None
    _emugpu_device.cache_clear()
    _installed = False
    _compile_prepared = False
    _visible = None


def _device_kwarg_first(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(device: Any) -> Any:
        return fn(to_emugpu(device))

    return wrapper


def _device_type_keyword(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if "device_type" in kwargs:
            kwargs["device_type"] = _translate_device_type(kwargs["device_type"])
        return fn(*args, **kwargs)

    return wrapper


# --- the CPU warning -------------------------------------------------------------

# A process that used this much CPU time after `import torch` without ever allocating on an emulated
# GPU did its work on the CPU (importing torch and the emulator alone takes seconds on a small host).
CPU_WORK_THRESHOLD_S = 3.0
_cpu_at_install = 0.0


def _cpu_s() -> float:
    times = os.times()  # not time.process_time: the virtual clock may stand in for Python's clocks
    return times.user + times.system


def _report() -> None:
    """EMUGPU_AS_CUDA_REPORT=1 (`torch-emugpu run --report`): one line per emulated GPU this process used."""
    from torch_emugpu import _C

    if not _C._configured():
        return
    name = _C._device_properties(0)["name"]
    for index in range(int(_C._device_count())):
        stats = _C._memory_stats(index)
        if int(stats["allocation"]["all"]["allocated"]) == 0:
            continue
        busy_s = _C._engine_stats(index)["compute"][1] / 1e9
        print(
            f"torch-emugpu run: pid {os.getpid()} cuda:{index} = emulated {name}: "
            f"peak allocated {int(stats['allocated_bytes']['all']['peak']) / 2**20:.1f} MiB, "
            f"peak reserved {int(stats['reserved_bytes']['all']['peak']) / 2**20:.1f} MiB, "
            f"compute busy {busy_s:.3f} s",
            file=sys.stderr,
        )


def _check_gpu_used() -> None:
    if not _installed:
        return
    if os.environ.get("EMUGPU_AS_CUDA_REPORT", "") == "1":
        _report()
    if os.environ.get("EMUGPU_AS_CUDA_QUIET", "") == "1":
        return
    from torch.utils.data import get_worker_info

    if get_worker_info() is not None:
        return  # DataLoader workers work on the CPU by design
    from torch_emugpu import _C

    if is_launcher():
        return
    cpu_s = _cpu_s() - _cpu_at_install
    if cpu_s < CPU_WORK_THRESHOLD_S:
        return
    if _C._configured():
        for index in range(int(_C._device_count())):
            if int(_C._memory_stats(index)["allocation"]["all"]["allocated"]) > 0:
                return
    print(
        f"torch-emugpu run: warning: this process ({' '.join(sys.argv)[:120]}) worked {cpu_s:.1f} s on the CPU "
        "and never allocated on an emulated GPU: the script ran on the CPU. Check how it picks its device "
        "(e.g. a --cuda flag, `device.type == 'cuda'` against a tensor's device, or a `.cpu()` of the model); "
        "set EMUGPU_AS_CUDA_QUIET=1 to silence this.",
        file=sys.stderr,
    )
