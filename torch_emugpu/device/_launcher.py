"""Whether this process is a launcher (torchrun) rather than a worker that uses the device."""

from __future__ import annotations

import os
import sys

# Launchers that only start and watch the processes that use the device: their heartbeats,
# restarts and monitor loops (time.sleep) run in real time, and their workers, not they, get
# the device count that run mode narrows.
LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")


def is_launcher() -> bool:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name in LAUNCHERS:
        return True
    return os.path.basename(sys.argv[0] if sys.argv else "") == "torchrun"
