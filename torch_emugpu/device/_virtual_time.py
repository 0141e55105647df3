"""What a script reads as time under the virtual clock (EMUGPU_CLOCK=virtual).

While the virtual clock runs, `time.time`, `time.perf_counter`,
`time.monotonic` (and their `_ns` forms), `time.sleep` and
`datetime.datetime.now`/`utcnow`/`today` read and move the process's virtual
time (csrc/core/virtual_clock.h): a read charges the host work done since
the last one, a sleep advances time without sleeping. Modules that bound
these functions by name before (`from time import perf_counter`, as tqdm
does) are rebound too, except the runtime's own: threading, queue,
multiprocessing, selectors, subprocess, socket, asyncio, concurrent and
torch keep the real clock, so that the timeouts that detect hangs (c10d's,
DataLoader workers', `queue.get(timeout=)`) stay real.

Each function continues from the value it had when the clock was
installed, so time never jumps back at the switch; switching back to the
real clock (configure(clock="real")) restores the real functions, and time
jumps to the host's.
"""

from __future__ import annotations

import copyreg
import datetime as _datetime
import math
import operator
import sys
import time as _time
from collections.abc import Callable
from typing import Any

from ._extension import _C

# The runtime's modules keep the real clock: their timeouts detect hangs.
_REAL_TIME_MODULES = (
    "threading",
    "queue",
    "multiprocessing",
    "selectors",
    "subprocess",
    "socket",
    "asyncio",
    "concurrent",
    "torch",
    "torch_emugpu",
)
_NAMES = ("time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "sleep")

_originals: dict[str, Callable[..., Any]] = {}
_original_datetime: type[_datetime.datetime] | None = None
_rebound: list[tuple[Any, str, Any]] = []  # (module, attribute, original value)


def _virtual_ns() -> int:
    return int(_C._clock_read_ns())


def _sleep(seconds: float) -> None:
    # As CPython's time.sleep: a float or an integer, not negative, not NaN, not beyond its clock.
    seconds = seconds if isinstance(seconds, float) else float(operator.index(seconds))
    if math.isnan(seconds):
        raise ValueError("Invalid value NaN (not a number)")
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    if seconds * 1e9 >= 2**63:
        raise OverflowError("timestamp out of range for platform time_t")
    _C._clock_sleep_ns(round(seconds * 1e9))
    _originals["sleep"](0)  # other threads run, as they would while this one slept


def _make(base_ns: int, start_ns: int) -> tuple[Callable[[], float], Callable[[], int]]:
    def seconds() -> float:
        return (base_ns + _virtual_ns() - start_ns) / 1e9

    def nanoseconds() -> int:
        return base_ns + _virtual_ns() - start_ns

    return seconds, nanoseconds


def _virtual_datetime(real: type[_datetime.datetime]) -> type[_datetime.datetime]:
    class _Kind(type):
        # Datetimes made by the real class (C code, modules that kept it) are datetime.datetime too.
        def __instancecheck__(cls, obj: object) -> bool:
            return isinstance(obj, real)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, real)

    class datetime(real, metaclass=_Kind):  # type: ignore[valid-type,misc]
        """datetime.datetime whose now(), utcnow() and today() read the virtual clock."""

        @classmethod
        def now(cls, tz: _datetime.tzinfo | None = None) -> Any:
            return real.fromtimestamp(_time.time(), tz)

        @classmethod
        def utcnow(cls) -> Any:
            return real.fromtimestamp(_time.time(), _datetime.timezone.utc).replace(tzinfo=None)

        @classmethod
        def today(cls) -> Any:
            return real.fromtimestamp(_time.time())

    datetime.__qualname__ = real.__qualname__
    datetime.__module__ = real.__module__
    return datetime


def _reduce_datetime(value: _datetime.datetime) -> tuple[Any, ...]:
    # (class, state args): datetime's own reduction, with the class pickle can find.
    reduced = value.__reduce__()
    assert isinstance(reduced, tuple)
    return (_datetime.datetime, reduced[1])


def installed() -> bool:
    return bool(_originals)


def install() -> None:
    """Points Python's clocks at the virtual clock (idempotent)."""
    global _original_datetime
    if _originals:
        return
    start = _virtual_ns()
    for name in _NAMES:
        _originals[name] = getattr(_time, name)
    replacements: dict[str, Callable[..., Any]] = {"sleep": _sleep}
    pairs = (("time", "time_ns"), ("perf_counter", "perf_counter_ns"), ("monotonic", "monotonic_ns"))
    for seconds_name, ns_name in pairs:
        seconds, nanoseconds = _make(_originals[ns_name](), start)
        replacements[seconds_name] = seconds
        replacements[ns_name] = nanoseconds
    for name, fn in replacements.items():
        fn.__name__ = name
        setattr(_time, name, fn)
    _original_datetime = _datetime.datetime
    virtual_datetime = _virtual_datetime(_original_datetime)
    _datetime.datetime = virtual_datetime  # type: ignore[misc]
    # Pickle finds a class by its module and name, which now give the virtual
    # class: datetimes of the real one pickle as the virtual class's (the
    # same bytes; any process unpickles them as its datetime.datetime).
    copyreg.pickle(_original_datetime, _reduce_datetime)
    by_identity = {id(original): replacements[name] for name, original in _originals.items()}
    by_identity[id(_original_datetime)] = virtual_datetime
    for module_name, module in list(sys.modules.items()):
        if module is None or module is _time or module is _datetime:
            continue
        if module_name.split(".")[0] in _REAL_TIME_MODULES or module_name == __name__:
            continue
        for attribute, value in list(getattr(module, "__dict__", {}).items()):
            replacement = by_identity.get(id(value))
            if replacement is not None:
                _rebound.append((module, attribute, value))
                setattr(module, attribute, replacement)


def uninstall() -> None:
    """Gives Python's clocks back to the host."""
    global _original_datetime
    if not _originals:
        return
    for name, fn in _originals.items():
        setattr(_time, name, fn)
    if _original_datetime is not None:
        _datetime.datetime = _original_datetime  # type: ignore[misc]
        copyreg.dispatch_table.pop(_original_datetime, None)
    for module, attribute, value in _rebound:
        setattr(module, attribute, value)
    _rebound.clear()
    _originals.clear()
    _original_datetime = None


def follow_configuration() -> None:
    """Installs or uninstalls to match the clock the configuration chose."""
    if _C._clock_kind() == "virtual":
        install()
    else:
        uninstall()


def clock_report() -> dict[str, Any]:
    """Which clock runs and, under the virtual one, how fast: emulated seconds
    per wall second (speedup) and where the virtual time went (host work,
    waits for the device or other processes, sleeps) since the last reset."""
    return dict(_C._clock_stats())
