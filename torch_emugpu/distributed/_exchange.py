"""The ranks' exchange for backend `emu`: one all-gather of a few int64 words
per rank per collective (emulated start times, flags, a signature of the
tensors), and the real bytes of small (or compute-mode) tensors.

The transport is an internal gloo group over loopback/TCP, bootstrapped from
the process group's Store under its own prefix, so no port is fixed and the
rendezvous is the one the user already configured. It knows nothing of the
timeline: a later mode that does not sleep at all reuses it as is.
"""

from __future__ import annotations

import datetime
import pickle
from collections.abc import Sequence

import torch
import torch.distributed as dist


class ExchangeError(dist.DistBackendError):
    """A rank left, or did not arrive within the timeout, during an exchange."""


class Exchange:
    """All-gathers words and objects, and runs gloo collectives on CPU tensors,
    among the `size` ranks of one process group."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> None:
        self.rank = rank
        self.size = size
        self.timeout = timeout
        # The prefix keeps gloo's rendezvous keys apart from c10d's own.
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("emu_exchange/", store), rank, size, timeout)

    def _wait(self, work: dist.Work, what: str) -> None:
        try:
            work.wait()
        except RuntimeError as e:
            raise ExchangeError(
                f"emu backend: rank {self.rank} of {self.size}: {what} failed: another rank exited or did not "
                f"arrive within the process group's timeout ({self.timeout.total_seconds():g} s). "
                f"Check the other ranks' output for their error. Transport said: {e}"
            ) from e

    def gather_words(self, words: Sequence[int], what: str) -> torch.Tensor:
        """Every rank's `words` (same count on every rank), as a [size, len(words)] int64 tensor."""
        mine = torch.tensor(list(words), dtype=torch.int64)
        out = torch.empty(self.size * mine.numel(), dtype=torch.int64)
        self._wait(self._gloo._allgather_base(out, mine), what)
        return out.view(self.size, mine.numel())

    def gather_objects(self, obj: object, what: str) -> list[object]:
        """Every rank's picklable `obj` (rare paths only: error reports)."""
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        lengths = self.gather_words([data.numel()], what)[:, 0].tolist()
        padded = torch.zeros(max(lengths), dtype=torch.uint8)
        padded[: data.numel()] = data
        out = torch.empty(self.size * padded.numel(), dtype=torch.uint8)
        self._wait(self._gloo._allgather_base(out, padded), what)
        rows = out.view(self.size, -1)
        return [pickle.loads(rows[i, :n].numpy().tobytes()) for i, n in enumerate(lengths)]

    def swap_words(self, words: Sequence[int], peer: int, tag: int, what: str) -> torch.Tensor:
        """Sends `words` to `peer` and returns the peer's (send/recv pairs,
        matched in order per peer and tag, as NCCL matches them)."""
        mine = torch.tensor(list(words), dtype=torch.int64)
        theirs = torch.empty_like(mine)
        sent = self._gloo.send([mine], peer, 2 * tag)
        self._wait(self._gloo.recv([theirs], peer, 2 * tag), what)
        self._wait(sent, what)
        return theirs

    def send_bytes(self, host: torch.Tensor, peer: int, tag: int) -> dist.Work:
        """Starts sending a CPU tensor's bytes; wait with run()."""
        return self._gloo.send([host], peer, 2 * tag + 1)

    def recv_bytes(self, host: torch.Tensor, peer: int, tag: int, what: str) -> None:
        self._wait(self._gloo.recv([host], peer, 2 * tag + 1), what)

    def run(self, work: dist.Work, what: str) -> None:
        """Waits for a gloo collective started on `self.gloo`, with the exchange's error."""
        self._wait(work, what)

    @property
    def gloo(self) -> dist.ProcessGroupGloo:
        return self._gloo
