"""DataLoader workers keep causality under the virtual clock.

A batch request carries the consumer's virtual time when it was made (the
index list handed to a worker is stamped); the worker's clock moves to at
least that time before it fetches, its fetch advances its own clock (the
decoding and transforms it measures, its `time.sleep`s), and the batch
carries the worker's time when it was ready. The consumer's clock moves to
at least that time when it takes the batch: a worker slower than the
training step holds the loop back (a data stall), a fast one does not, and
workers run in parallel as processes do. Batches from a worker whose clock
differs from the consumer's are refused, naming both.

Only batched loading (a batch_sampler yielding lists, the default) stamps
requests; without them a worker's clock still moves by its own work.

A fetch's own work is its CPU time plus, with the measured host, the time
it spent blocked off the CPU (waiting for storage: a file not in the page
cache), which its CPU time does not hold; not the time it waited for a core
(runqueue), which is this machine's load.
"""

from __future__ import annotations

import time
from typing import Any

import torch.utils.data as torch_utils_data
import torch.utils.data._utils.fetch as _fetch
import torch.utils.data.dataloader as _dataloader

from ._extension import _C


class StampedIndex(list):
    """A batch's sample indices and the virtual time they were requested at."""

    ns: int

    def __reduce__(self) -> tuple[Any, ...]:
        return (_stamped_index, (list(self), self.ns))


def _stamped_index(items: list[Any], ns: int) -> StampedIndex:
    index = StampedIndex(items)
    index.ns = ns
    return index


class StampedBatch:
    """A worker's batch and its virtual time when it was ready (-1: the worker ran the real clock)."""

    __slots__ = ("data", "ns")

    def __init__(self, data: Any, ns: int) -> None:
        self.data = data
        self.ns = ns

    def pin_memory(self, device: Any = None) -> StampedBatch:  # the DataLoader's pinning thread
        from torch.utils.data._utils.pin_memory import pin_memory

        return StampedBatch(pin_memory(self.data, device), self.ns)

    def __reduce__(self) -> tuple[Any, ...]:
        return (StampedBatch, (self.data, self.ns))


def _virtual() -> bool:
    return _C is not None and _C._clock_kind() == "virtual"


def _off_cpu_ns() -> int:
    """Real time the calling thread has not been running on a CPU nor waiting for one: its blocked time,
    plus a constant (the wall clock's origin). -1 where the kernel keeps no scheduler statistics."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            on_cpu, runqueue, _ = f.read().split()
    except (OSError, ValueError):
        return -1
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) - int(on_cpu) - int(runqueue)


def _fetching(original: Any) -> Any:
    def fetch(self: Any, possibly_batched_index: Any) -> Any:
        stamped = isinstance(possibly_batched_index, StampedIndex)
        virtual = _virtual()
        if not (stamped or virtual) or torch_utils_data.get_worker_info() is None:
            return original(self, possibly_batched_index)  # the consumer's own process, or both clocks real
        if not virtual:
            return StampedBatch(original(self, possibly_batched_index), -1)
        _C._clock_read_ns()  # the worker's work since its last batch is its own
        if stamped:
            _C._clock_receive_ns(possibly_batched_index.ns)  # not before it was asked for
        off_cpu = _off_cpu_ns()
        data = original(self, possibly_batched_index)
        if off_cpu >= 0:
            _C._clock_charge_blocked_ns(max(0, _off_cpu_ns() - off_cpu))
        return StampedBatch(data, int(_C._clock_read_ns()))

    fetch.__wrapped__ = original  # type: ignore[attr-defined]
    return fetch


def _stamping(original: Any) -> Any:
    def _next_index(self: Any) -> Any:
        index = original(self)
        if type(index) is list and _virtual():
            index = _stamped_index(index, int(_C._clock_read_ns()))
        return index

    _next_index.__wrapped__ = original  # type: ignore[attr-defined]
    return _next_index


def _processing(original: Any) -> Any:
    def _process_data(self: Any, data: Any, worker_idx: int) -> Any:
        if isinstance(data, StampedBatch):
            virtual = _virtual()
            if data.ns < 0 and virtual:
                raise RuntimeError(
                    f"DataLoader worker {worker_idx} runs the real clock but this process the virtual one "
                    f"(EMUGPU_CLOCK=virtual); a worker must run the clock of the process that loads from it: "
                    f"set EMUGPU_CLOCK before the DataLoader starts its workers"
                )
            if data.ns >= 0 and not virtual:
                raise RuntimeError(
                    f"DataLoader worker {worker_idx} runs the virtual clock but this process the real one; "
                    f"a worker must run the clock of the process that loads from it: set EMUGPU_CLOCK alike"
                )
            if virtual:
                _C._clock_receive_ns(data.ns)  # not before the worker had it ready
            data = data.data
        return original(self, data, worker_idx)

    _process_data.__wrapped__ = original  # type: ignore[attr-defined]
    return _process_data


def install() -> None:
    """Wraps the DataLoader's fetchers and its multi-process iterator (idempotent)."""
    for cls in (_fetch._MapDatasetFetcher, _fetch._IterableDatasetFetcher):
        if not hasattr(cls.fetch, "__wrapped__"):
            cls.fetch = _fetching(cls.fetch)  # type: ignore[method-assign]
    it = _dataloader._MultiProcessingDataLoaderIter
    if not hasattr(it._next_index, "__wrapped__"):  # the multi-process iterator's own, not its base's
        it._next_index = _stamping(it._next_index)  # type: ignore[method-assign]
    if not hasattr(it._process_data, "__wrapped__"):
        it._process_data = _processing(it._process_data)  # type: ignore[method-assign]
