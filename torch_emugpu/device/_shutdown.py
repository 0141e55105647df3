"""A clean exit after backward passes on emugpu.

PyTorch's autograd engine runs an accelerator's backward work on one thread
per device, and that thread can drop the last reference to a finished graph
task just after the main thread returned from ``backward()``. The task holds
Python objects (the context ``_engine_run_backward`` stashes), so if the
interpreter is already finalizing, releasing them kills the thread inside
C++ frames that may not unwind, and the process aborts ("terminate called
without an active exception"). At exit we therefore push one tiny,
Python-free backward through every device thread and wait for it: by then
each thread has released what it held, and the last task holds nothing that
needs the interpreter.
"""

from __future__ import annotations

import atexit
import os

import torch

_THREAD_PREFIX = "pt_autograd_"


def _autograd_device_threads() -> bool:
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return True  # cannot tell: flush anyway
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().startswith(_THREAD_PREFIX):
                    return True
        except OSError:
            continue
    return False


def _flush_device_threads() -> None:
    from torch_emugpu import _C
    from torch_emugpu.device import device_module

    if _C._in_bad_fork() or not _C._configured() or not _autograd_device_threads():
        return
    engine = torch.autograd.Variable._execution_engine
    for index in range(device_module.device_count()):
        # A device that never allocated ran no backward on its thread: nothing to flush, and a tensor
        # made there would make it look used (run mode's CPU warning, --report).
        if int(_C._memory_stats(index)["allocation"]["all"]["allocated"]) == 0:
            continue
        x = torch.zeros((), device=torch.device("emugpu", index), requires_grad=True)
        y = x * 1
        # The engine directly: no Python context is stashed in the task.
        engine.run_backward((y,), (torch.ones_like(y),), False, False, (), True, True)


def _at_exit() -> None:
    try:
        _flush_device_threads()
    except Exception:  # noqa: BLE001 - exiting anyway; never turn a clean exit into a traceback
        pass


def install() -> None:
    atexit.register(_at_exit)
