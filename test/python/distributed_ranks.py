"""Runs a scenario on spawned ranks of a process group (backend `emu` by default).

Ranks are spawned processes (one emugpu device each, emugpu:rank, from
EMUGPU_DEVICE_COUNT) that meet through a TCPStore the parent opens on loopback
with port 0; every wait is bounded. Each child runs one scenario and reports
"ok" and its return value, or its traceback, through a queue.

A scenario is a module-level function `(rank, world) -> picklable`, or a
functools.partial of one (spawn pickles it by reference).
"""

from __future__ import annotations

import datetime
import queue as queue_module
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import child_env

CTX = mp.get_context("spawn")
TIMEOUT = 120  # seconds for any one wait on a child
PG_TIMEOUT = datetime.timedelta(seconds=20)

Scenario = Callable[[int, int], Any]


def _init(rank: int, world: int, port: int, init: str, timeout: datetime.timedelta) -> None:
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=PG_TIMEOUT)
    kwargs: dict[str, Any] = {"store": store, "rank": rank, "world_size": world, "timeout": timeout}
    if init == "emu":
        dist.init_process_group("emu", **kwargs)
    elif init == "default":
        dist.init_process_group(**kwargs)
    elif init == "device_id":
        dist.init_process_group(device_id=torch.device("emugpu", rank), **kwargs)
    elif init == "mixed":
        dist.init_process_group("cpu:gloo,emugpu:emu", **kwargs)
    else:
        raise ValueError(init)


def _child(rank: int, world: int, port: int, scenario: Scenario, init: str, timeout: float, results: Any) -> None:
    try:
        import torch_emugpu  # noqa: F401  (registers emugpu and backend `emu`)

        torch.emugpu.set_device(rank)
        _init(rank, world, port, init, datetime.timedelta(seconds=timeout))
        outcome = scenario(rank, world)
        results.put((rank, "ok", outcome))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001  (reported to the parent, which fails the test)
        results.put((rank, "error", traceback.format_exc()))


def _name(scenario: Scenario) -> str:
    func = getattr(scenario, "func", scenario)  # a functools.partial names its function
    return getattr(func, "__name__", repr(scenario))


def run_ranks(
    scenario: Scenario,
    world: int = 2,
    mode: str = "compute",
    init: str = "emu",
    dying: tuple[int, ...] = (),
    timeout: float = PG_TIMEOUT.total_seconds(),
    env: dict[str, str] | None = None,
) -> dict[int, Any]:
    """Runs `scenario` on `world` spawned ranks; returns each rank's result.
    Ranks in `dying` exit on purpose and report nothing. `env` adds to (or
    overrides) the children's environment."""
    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, timeout=PG_TIMEOUT, wait_for_workers=False)
    results = CTX.Queue()
    procs = []
    with child_env(**{"EMUGPU_DEVICE_COUNT": str(world), "EMUGPU_MODE": mode, **(env or {})}):
        for rank in range(world):
            args = (rank, world, store.port, scenario, init, timeout, results)
            p = CTX.Process(target=_child, args=args, daemon=True)
            p.start()
            procs.append(p)
    out: dict[int, Any] = {}
    errors = []
    try:
        for _ in range(world - len(dying)):
            try:
                rank, status, value = results.get(timeout=TIMEOUT)
            except queue_module.Empty:
                pytest.fail(f"{_name(scenario)}: a rank reported nothing within {TIMEOUT} s")
            if status == "ok":
                out[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
    finally:
        for p in procs:
            p.join(TIMEOUT)
            if p.is_alive():
                p.kill()
                p.join(10)
    assert not errors, "\n".join(errors)
    return out
