"""Sharing emugpu tensors between processes, as CUDA IPC shares CUDA tensors.

Device memory is a memfd per emulated GPU (csrc/core/caching_allocator.*), so
a tensor sent through torch.multiprocessing (a Queue, a spawned Process's
arguments) travels as a duplicated file descriptor plus its place in the file;
the receiver maps the same pages. Reducers for every other tensor and storage
stay torch's own: ours wrap them and only take emugpu objects.

Under the virtual clock a storage carries its sender's virtual time, and the
receiver's clock moves to at least that time when it opens the storage (the
clock protocol of docs/virtual-time.md): a receiver never acts on a tensor
before it was sent. Processes on different clocks are refused, naming both.
"""

from __future__ import annotations

import multiprocessing.context
import os
import pickle
import weakref
from collections.abc import Callable
from multiprocessing.reduction import DupFd, ForkingPickler
from typing import Any

import torch
import torch.multiprocessing  # registers torch's reducers, which ours wrap
from torch.multiprocessing.reductions import SharedCache, StorageWeakRef

from torch_emugpu import _C

# (file device, inode, data offset in the file, bytes) -> the storage open
# here, so that several tensors over one storage arrive as one storage, and a
# storage sent back to its owner comes home as itself (torch's shared_cache).
_open_storages = SharedCache()

# Per spawn-started child: the descriptors already listed for it to inherit.
_fds_for_child: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()

Reducer = Callable[[Any], tuple[Any, ...]]


def _send_fd(fd: int) -> tuple[Any, bool]:
    """A picklable handle on `fd`, and whether the receiver closes what it detaches."""
    popen = multiprocessing.context.get_spawning_popen()
    if popen is None or getattr(popen, "method", None) != "spawn":
        return DupFd(fd), True  # a queue (resource sharer) or forkserver: the receiver gets its own duplicate
    # A spawned child inherits descriptors by number, each listed once (one
    # memfd backs many storages), so it keeps them open instead of closing.
    listed = _fds_for_child.setdefault(popen, set())
    if fd in listed:
        return popen.DupFd(fd), False
    listed.add(fd)
    return DupFd(fd), False


def _key(fd: int, file_offset: int, nbytes: int) -> tuple[int, int, int, int]:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino, file_offset, nbytes)


def _cached(key: tuple[int, int, int, int]) -> torch.UntypedStorage | None:
    ref = _open_storages.get(key)
    return None if ref is None else torch.UntypedStorage._new_with_weak_ptr(ref.cdata)


def _clock_stamp() -> int:
    """The sender's virtual time, or -1 on the real clock."""
    return int(_C._clock_read_ns()) if _C._clock_kind() == "virtual" else -1


def _receive(sent_ns: int) -> None:
    """Moves this process's virtual clock to at least the sender's time."""
    virtual = _C._clock_kind() == "virtual"
    if (sent_ns >= 0) != virtual:
        sender, here = ("virtual", "real") if sent_ns >= 0 else ("real", "virtual")
        raise RuntimeError(
            f"emugpu sharing: a tensor from a process on the {sender} clock reached this process, which runs "
            f"the {here} clock; processes that share emugpu tensors must run the same clock: set EMUGPU_CLOCK "
            f"alike in both before they start"
        )
    if virtual:
        _C._clock_receive_ns(sent_ns)


def _rebuild_empty_storage(device: int, sent_ns: int = -1) -> torch.UntypedStorage:
    _receive(sent_ns)
    return torch.UntypedStorage(0, device=torch.device("emugpu", device))


def _rebuild_storage(
    dup_fd: Any,
    owned: bool,
    map_offset: int,
    map_length: int,
    data_offset: int,
    nbytes: int,
    device: int,
    materialized: bool,
    ready_ns: int,
    sent_ns: int,
) -> torch.UntypedStorage:
    fd = dup_fd.detach()
    try:
        _receive(sent_ns)  # before the stream waits for `ready_ns`, a time of the sender's clock
        key = _key(fd, map_offset + data_offset, nbytes)
        storage = _cached(key)
        if storage is not None:
            _C._refresh_shared_storage(storage, materialized, ready_ns)
            return storage
        storage = _C._open_shared_storage(
            fd, map_offset, map_length, data_offset, nbytes, device, materialized, ready_ns
        )
        _open_storages[key] = StorageWeakRef(storage)
        return storage
    finally:
        if owned:
            os.close(fd)  # the mapping keeps the file alive


def _reduce_emugpu_storage(storage: torch.UntypedStorage) -> tuple[Any, ...]:
    if storage.nbytes() == 0:
        return (_rebuild_empty_storage, (storage.device.index, _clock_stamp()))
    fd, map_offset, map_length, data_offset, nbytes, device, materialized, ready_ns = _C._share_storage(storage)
    _open_storages[_key(fd, map_offset + data_offset, nbytes)] = StorageWeakRef(storage)
    return (
        _rebuild_storage,
        (*_send_fd(fd), map_offset, map_length, data_offset, nbytes, device, materialized, ready_ns, _clock_stamp()),
    )


def _rebuild_tensor(
    cls: type,
    storage: torch.UntypedStorage,
    dtype: torch.dtype,
    storage_offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool,
) -> torch.Tensor:
    t = torch.empty(0, dtype=dtype, device=storage.device).set_(storage, storage_offset, size, stride)
    if cls is torch.nn.parameter.Parameter:
        # Integer parameters must get requires_grad=False in the constructor.
        return torch.nn.parameter.Parameter(t, requires_grad=requires_grad)
    t.requires_grad = requires_grad
    return t


def _reduce_emugpu_tensor(tensor: torch.Tensor) -> tuple[Any, ...]:
    if tensor.requires_grad and not tensor.is_leaf:  # torch's reduce_tensor's words
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which requires_grad, "
            "since autograd does not support crossing process boundaries.  "
            "If you just want to transfer the data, call detach() on the tensor "
            "before serializing (e.g., putting it on the queue)."
        )
    torch.utils.hooks.warn_if_has_hooks(tensor)
    # The storage is pickled on its own (by _reduce_emugpu_storage), once per message.
    return (
        _rebuild_tensor,
        (
            type(tensor),
            tensor.untyped_storage(),
            tensor.dtype,
            tensor.storage_offset(),
            tuple(tensor.size()),
            tuple(tensor.stride()),
            tensor.requires_grad,
        ),
    )


def _default_reduce(obj: Any) -> tuple[Any, ...]:
    return obj.__reduce_ex__(pickle.DEFAULT_PROTOCOL)


def _wrap(cls: type, emugpu_reduce: Reducer) -> None:
    # _extra_reducers (what ForkingPickler.register fills) is private, so typeshed leaves it out.
    previous = ForkingPickler._extra_reducers.get(cls, _default_reduce)  # type: ignore[attr-defined]
    if getattr(previous, "_emugpu", False):
        return  # installed already

    def reduce(obj: Any) -> tuple[Any, ...]:
        return emugpu_reduce(obj) if obj.device.type == "emugpu" else previous(obj)

    reduce._emugpu = True  # type: ignore[attr-defined]
    ForkingPickler.register(cls, reduce)


def install() -> None:
    """Registers the emugpu reducers with multiprocessing's ForkingPickler."""
    classes: set[type] = {torch.Tensor, torch.nn.parameter.Parameter, *torch._tensor_classes}
    for cls in classes:
        _wrap(cls, _reduce_emugpu_tensor)
    # TypedStorage and its legacy subclasses reduce to their UntypedStorage in
    # torch's own reducers, so they reach this one too.
    _wrap(torch.UntypedStorage, _reduce_emugpu_storage)
