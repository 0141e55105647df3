"""Image datasets: make folders of JPEGs locally, and read image folders robustly.

Making (`torch-emugpu dataset make KIND DIR --images N`): ``DIR/<class>/<index>.JPEG``
(the layout torchvision's ``ImageFolder`` reads) plus ``DIR/dataset.json``, written
last, so a directory without it is an interrupted run. ``imagenet-like`` draws
each image's size from a mixture resembling ImageNet-1k's training set
(`imagenet_like_size`); ``fixed`` makes every image ``--size WxH``. Each image
is rendered from its own generator seeded by (seed, index): the same seed gives
the same bytes whatever the number of processes (with the same numpy and Pillow
versions, whose random streams and JPEG encoder could change).

Reading: ``scan(root)`` lists ``root/<class>/**/<image>`` in ``ImageFolder``'s
order (so class indices agree with it) and ``ImageFiles(scan)`` is a map-style
``torch.utils.data.Dataset`` of ``(image, class index)``. Bad input:

- ``root`` missing: ``FileNotFoundError`` naming it; ``root`` holding no usable
  image: ``ValueError`` naming it and the expected layout.
- At scan time (cheap: the first and last bytes of each file), a file is left
  out and listed in ``Scan.skipped`` with the reason when its extension is not
  an image extension, it is empty, its first bytes match no image format, or it
  is a JPEG (PNG) that does not end with the end-of-image marker FF D9 (the
  IEND chunk): a truncated file. Images directly under ``root`` (no class)
  are listed there too; other files there (``dataset.json``) are ignored.
- At load time, a file that fails to decode is replaced by the next decodable
  file (in index order), so batches keep their size and the default collate
  works; the substitute is a duplicate sample of its own class. The failure is
  recorded in a byte per file in shared memory, which DataLoader worker
  processes inherit (fork) or receive when they start (spawn), so
  ``ImageFiles.failed()`` in the main process lists the files that failed in
  any worker, and later epochs skip them without decoding. Each process also
  warns once per failed file.
- ``ImageFiles(..., strict=True)`` raises ``CorruptImageError`` naming the
  file instead: at construction for files the scan skipped, at load time for a
  file that fails to decode.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import pickle
import queue
import random
import re
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
from PIL import Image

from torch_emugpu.data import WorkerDiedError, death_hint, exit_description
from torch_emugpu.measure.common import atomic_output, write_json_atomic
from torch_emugpu.measure.images import jpeg_header
from torch_emugpu.measure.images import render as _render

KINDS = ("imagenet-like", "fixed")
GENERATOR_VERSION = 1  # bump when the same seed would give other bytes
MANIFEST = "dataset.json"
DEFAULT_CLASSES = 100
# torchvision.datasets.folder.IMG_EXTENSIONS, which ImageFolder accepts (case-insensitive)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
LAYOUT = "ROOT/<class name>/<image>.JPEG (one directory per class, as torchvision's ImageFolder reads)"
MAX_SIDE = 65500  # JPEG's limit is 65535


class CorruptImageError(ValueError):
    """A file that should be an image cannot be used (strict mode)."""


# --- making ---------------------------------------------------------------

# ImageNet-1k's training set, in figures widely repeated in dataset summaries and
# Q&A threads (not measured here; we had no copy): 1.28 M JPEGs, about 140 GB (so
# about 110 KB per file), mean size about 400x350 pixels; most images have a 500-pixel long side
# (500x375, 375x500, 500x333), a minority are smaller or larger. This mixture has
# those properties (mean about 410x346 pixels, 60% with a 500-pixel long side, and
# with `_render` at quality 90 about 110 KB per file); it is not a fit to the real
# distribution.
_COMMON_SIZES = ((0.37, (500, 375)), (0.09, (375, 500)), (0.11, (500, 333)), (0.03, (333, 500)))
_SMALLER = 0.37  # long side uniform in [80, 500), short/long in [0.55, 1], 3 in 4 landscape
# the remaining 3%: long side log-uniform in (500, 1600], short/long 3/4 or 2/3


def imagenet_like_size(rng: np.random.Generator) -> tuple[int, int]:
    """One (width, height) drawn from the ImageNet-like mixture above."""
    u = rng.random()
    for p, wh in _COMMON_SIZES:
        if u < p:
            return wh
        u -= p
    if u < _SMALLER:
        long = int(rng.integers(80, 500))
        short = max(1, round(long * rng.uniform(0.55, 1.0)))
    else:
        long = round(math.exp(rng.uniform(math.log(501), math.log(1600))))
        short = round(long * (0.75 if rng.random() < 0.5 else 2 / 3))
    return (long, short) if rng.random() < 0.75 else (short, long)


@dataclass(frozen=True)
class _Job:
    root: str
    class_names: tuple[str, ...]
    seed: int
    quality: int
    size: tuple[int, int] | None
    digits: int


def _image_path(job: _Job, index: int) -> str:
    name = job.class_names[index % len(job.class_names)]
    return os.path.join(job.root, name, f"{index:0{job.digits}d}.JPEG")


def _make_range(job: _Job, start: int, stop: int) -> tuple[int, int, int, int]:
    """Writes images start..stop-1; returns (count, sum of widths, of heights, of bytes)."""
    widths = heights = total = 0
    for index in range(start, stop):
        rng = np.random.default_rng([job.seed, index])
        w, h = job.size if job.size else imagenet_like_size(rng)
        path = _image_path(job, index)
        # A killed run leaves no half-written .JPEG. No fsync per image: it would slow
        # making many-fold, and only a power loss could then leave an image truncated,
        # which `dataset check` (the end-of-image marker) finds.
        with atomic_output(path, fsync=False) as f:
            _render(rng, w, h).save(f, "JPEG", quality=job.quality)
        widths, heights, total = widths + w, heights + h, total + os.path.getsize(path)
    return stop - start, widths, heights, total


# --- worker processes -----------------------------------------------------

# A worker's peak memory while it renders and encodes one image: about 22 bytes per
# pixel measured (ru_maxrss, 1000x1000 to 6000x6000: the colour field, grain and
# chroma layers, their numpy sums and the encoder's buffers), plus its own pages.
_BYTES_PER_PIXEL = 24
_WORKER_BYTES = 64 << 20
_LARGEST_DRAWN = (1600, 1200)  # the largest size imagenet_like_size draws
_POLL_S = 0.2  # how often the parent checks that every worker is alive


def _peak_bytes(width: int, height: int) -> int:
    """What one process making `width`x`height` images needs at its peak (see _BYTES_PER_PIXEL)."""
    return _BYTES_PER_PIXEL * width * height + _WORKER_BYTES


def _read_int(path: str, key: str | None = None) -> int | None:
    """An integer file of /sys or /proc, or the `key` line of a `key value` file; None if unreadable or unlimited."""
    try:
        with open(path) as f:
            for line in f:
                words = line.split()
                if key is None or (len(words) > 1 and words[0] == key):
                    value = words[1] if key else words[0] if words else ""
                    return int(value) if value.isdigit() and int(value) < 1 << 60 else None
    except OSError:
        pass
    return None


def _cgroup_available() -> int | None:
    """Memory the process's cgroup (and its ancestors) still allows, counting
    reclaimable page cache as available; None without a limit. A container's
    /proc/meminfo shows the host's memory, not the container's limit."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):  # v2, unified
        mount, rel = "/sys/fs/cgroup", next((p for h, c, p in lines if h == "0"), None)
        files = ("memory.max", "memory.current", "inactive_file")
    else:  # v1: the memory controller's own hierarchy
        mount, rel = "/sys/fs/cgroup/memory", next((p for _, c, p in lines if "memory" in c.split(",")), None)
        files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    if rel is None:
        return None
    folder = os.path.join(mount, rel.lstrip("/"))
    while not os.path.isdir(folder) and folder != mount:  # a cgroup namespace shows a shorter path
        folder = os.path.dirname(folder)
    best = None
    while True:
        limit = _read_int(os.path.join(folder, files[0]))
        used = _read_int(os.path.join(folder, files[1]))
        if limit is not None and used is not None:
            free = max(0, limit - used) + (_read_int(os.path.join(folder, "memory.stat"), files[2]) or 0)
            best = free if best is None else min(best, free)
        if folder == mount or len(folder) <= len(mount):
            return best
        folder = os.path.dirname(folder)


def available_memory() -> int | None:
    """Bytes this process may still use without swapping or the OOM killer:
    MemAvailable, or less where a cgroup limits it; None if unknown."""
    meminfo = _read_int("/proc/meminfo", "MemAvailable:")
    host = meminfo * 1024 if meminfo is not None else None
    if host is None and hasattr(os, "sysconf"):
        try:
            host = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            host = None
    group = _cgroup_available()
    return min(x for x in (host, group) if x is not None) if host is not None or group is not None else None


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _check_memory(jobs: int, jobs_given: bool, size: tuple[int, int] | None) -> int:
    """The number of processes to make images with: `jobs`, or fewer when
    `jobs` was the default and that many would not fit in memory. An image
    size that one process cannot make, or an explicit --jobs that does not
    fit, is a ValueError saying what would."""
    available = available_memory()
    if available is None:
        return jobs
    w, h = size or _LARGEST_DRAWN
    each = _peak_bytes(w, h)
    fit = available // each
    what = f"--size {w}x{h}" if size else "imagenet-like images (up to 1600x1200)"
    if fit < 1:
        side = math.isqrt(max(0, available - _WORKER_BYTES) // _BYTES_PER_PIXEL)
        raise ValueError(
            f"{what}: making one image needs about {_gib(each)} of memory (about {_BYTES_PER_PIXEL} bytes "
            f"per pixel while it is rendered and encoded), and {_gib(available)} is available; choose a "
            f"smaller --size, of at most about {side * side / 1e6:.0f} million pixels here (e.g. {side}x{side})"
        )
    if jobs <= fit:
        return jobs
    if not jobs_given:  # the default, the number of CPUs: use as many as fit
        return int(fit)
    raise ValueError(
        f"--jobs {jobs} with {what}: each process needs about {_gib(each)} of memory (about "
        f"{_BYTES_PER_PIXEL} bytes per pixel while it renders and encodes an image), {_gib(jobs * each)} in "
        f"all, and {_gib(available)} is available; use --jobs {fit} or fewer, or a smaller --size"
    )


def _worker(job: _Job, tasks: Any, results: Any, parent: int) -> None:
    """Makes the image ranges it takes from `tasks` until a None; puts each
    one's totals, or its exception (pickled, with the traceback as text), on `results`."""
    # Ctrl-C reaches the whole process group; the parent alone handles it, and stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while (task := tasks.get()) is not None:
        if os.getppid() != parent:  # the parent was killed: nobody will read the results
            return
        try:
            results.put(("done", _make_range(job, *task)))
        except BaseException as e:  # noqa: BLE001  (the parent raises it)
            text = "".join(traceback.format_exception(e))
            try:
                blob = pickle.dumps(e)
            except Exception:  # noqa: BLE001  (not every exception pickles)
                blob = pickle.dumps(RuntimeError(f"{type(e).__name__}: {e}"))
            results.put(("error", (blob, text, os.getpid())))
            return


def _raise_worker_error(blob: bytes, text: str, pid: int) -> NoReturn:
    try:
        error = pickle.loads(blob)
    except Exception:  # noqa: BLE001  (an exception whose __init__ takes other arguments)
        error = RuntimeError(text.strip().splitlines()[-1])
    error.add_note(f"in `dataset make`'s worker process {pid}:\n{text}")
    raise error


def _in_workers(job: _Job, tasks: list[tuple[int, int]], jobs: int, out: Path) -> Iterator[tuple[int, int, int, int]]:
    """The totals of each task, made by `jobs` worker processes, in the order they finish.

    Not multiprocessing.Pool: when a worker dies (the OOM killer's SIGKILL),
    Pool starts another and the lost task never returns, so the parent would
    wait forever. Here the parent checks the workers every _POLL_S seconds
    and raises WorkerDiedError naming how one ended.
    """
    # fork: the workers need numpy and PIL only, and skip importing torch again. Each context by its
    # literal name: typeshed types get_context(<a str>) as BaseContext, which lacks Process.
    fork = "fork" in multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork") if fork else multiprocessing.get_context("spawn")
    todo, results = ctx.Queue(), ctx.Queue()
    todo.cancel_join_thread()  # after a failure nobody reads the rest: exit without flushing it
    for task in tasks:
        todo.put(task)
    for _ in range(jobs):
        todo.put(None)
    procs = [ctx.Process(target=_worker, args=(job, todo, results, os.getpid()), daemon=True) for _ in range(jobs)]
    try:
        for p in procs:
            p.start()
        for _ in tasks:
            while True:
                try:
                    kind, value = results.get(timeout=_POLL_S)
                    break
                except queue.Empty:
                    pass
                dead = next((p for p in procs if p.exitcode not in (None, 0)), None)
                if dead is None and all(p.exitcode == 0 for p in procs) and results.empty():
                    raise RuntimeError(
                        f"dataset make: every worker process exited, but some images of {out} were never made"
                    )
                if dead is not None:
                    raise WorkerDiedError(
                        f"dataset make: worker process {dead.pid} {exit_description(dead.exitcode)} while "
                        f"writing images to {out}; {death_hint(dead.exitcode)}. Use fewer --jobs or a smaller "
                        f"--size if memory ran out. {out} holds the images written so far and no {MANIFEST}: "
                        "empty it or choose a new directory, then run again"
                    )
            if kind == "error":
                _raise_worker_error(*value)
            yield value
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
        todo.close()


def parse_size(text: str) -> tuple[int, int]:
    """'WxH' -> (W, H)."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not m or not (1 <= int(m[1]) <= MAX_SIDE and 1 <= int(m[2]) <= MAX_SIDE):
        raise ValueError(f"--size must be WIDTHxHEIGHT with both in 1..{MAX_SIDE} (e.g. 224x224), got {text!r}")
    return int(m[1]), int(m[2])


def class_names(count: int) -> list[str]:
    """Zero-padded, so that sorting them (as ImageFolder does) keeps their order."""
    digits = max(3, len(str(count - 1)))
    return [f"class{k:0{digits}d}" for k in range(count)]


def make(
    kind: str,
    root: str | os.PathLike[str],
    images: int,
    classes: int | None = None,
    seed: int = 0,
    jobs: int | None = None,
    size: str | tuple[int, int] | None = None,
    quality: int = 90,
    progress: bool = True,
) -> dict[str, Any]:
    """Writes a dataset of `images` JPEGs under `root`; returns its manifest (dataset.json) and elapsed_s."""
    if kind not in KINDS:
        raise ValueError(f"unknown dataset kind {kind!r}; choose one of: {', '.join(KINDS)}")
    if images < 1:
        raise ValueError(f"--images must be at least 1, got {images}")
    if classes is None:
        classes = min(DEFAULT_CLASSES, images)
    elif classes < 1 or classes > images:
        raise ValueError(f"--classes must be in 1..--images ({images}), got {classes}")
    if not 1 <= quality <= 100:
        raise ValueError(f"--quality must be in 1..100 (JPEG quality), got {quality}")
    if seed < 0:
        raise ValueError(f"--seed must be a non-negative integer, got {seed}")
    jobs_given = jobs is not None
    if jobs is None:  # the CPUs this process may run on, which a container can limit
        jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {jobs}")
    if kind == "fixed":
        if size is None:
            raise ValueError("the fixed kind needs --size WIDTHxHEIGHT (e.g. --size 224x224)")
        size = parse_size(size if isinstance(size, str) else f"{size[0]}x{size[1]}")
    elif size is not None:
        raise ValueError(f"--size applies to the fixed kind only; {kind} draws each image's size")
    jobs = _check_memory(min(jobs, images), jobs_given, size)
    out = Path(root)
    if out.exists():
        if not out.is_dir():
            raise ValueError(f"{out} is a file; expected a new or empty directory for the dataset")
        entries = sorted(p.name for p in out.iterdir())
        if entries:
            raise ValueError(
                f"{out} exists and is not empty ({len(entries)} entries, e.g. {entries[0]}); "
                "choose a new directory or empty this one"
            )
    names = class_names(classes)
    for name in names:
        (out / name).mkdir(parents=True, exist_ok=True)
    job = _Job(str(out), tuple(names), seed, quality, size, max(6, len(str(images - 1))))
    chunk = max(1, min(64, images // (jobs * 8)))
    tasks = [(start, min(start + chunk, images)) for start in range(0, images, chunk)]

    from tqdm import tqdm

    count = widths = heights = total = 0
    started = time.perf_counter()
    with tqdm(total=images, desc=f"making {kind} images", unit="img", disable=not progress) as bar:
        if jobs == 1:
            results: Iterable[tuple[int, int, int, int]] = (_make_range(job, *task) for task in tasks)
        else:
            results = _in_workers(job, tasks, jobs, out)
        for n, w, h, b in results:
            count, widths, heights, total = count + n, widths + w, heights + h, total + b
            bar.update(n)
    elapsed = time.perf_counter() - started
    from torch_emugpu import __version__

    manifest = {
        "format": "torch-emugpu image folder",
        "layout": "<class name>/<index>.JPEG",
        "kind": kind,
        "count": count,
        "classes": classes,
        "seed": seed,
        "quality": quality,
        "size": list(size) if size else None,
        "total_bytes": total,
        "mean_width": round(widths / count, 1),
        "mean_height": round(heights / count, 1),
        "mean_bytes": round(total / count, 1),
        "generator_version": GENERATOR_VERSION,
        "torch_emugpu": __version__,
    }
    write_json_atomic(out / MANIFEST, manifest)  # last: its presence marks a complete dataset
    return {**manifest, "elapsed_s": elapsed}


# --- reading --------------------------------------------------------------

_JPEG_END = b"\xff\xd9"
_PNG_END = b"IEND\xaeB`\x82"


def _format(head: bytes) -> str | None:
    """The image format the first bytes announce, if any."""
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head.startswith(b"BM"):
        return "BMP"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "TIFF"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    if len(head) > 2 and head[0:1] == b"P" and head[1:2] in b"123456" and head[2:3].isspace():
        return "PNM"
    return None


def _check_file(path: str, size: int) -> str | None:
    """Why the file is not a usable image, from its extension and first and last bytes; None if it looks fine."""
    ext = os.path.splitext(path)[1]
    if ext.lower() not in IMAGE_EXTENSIONS:
        return f"extension {ext or '(none)'!r} is not an image extension ({' '.join(IMAGE_EXTENSIONS)})"
    if size == 0:
        return "empty file (0 bytes)"
    try:
        with open(path, "rb") as f:
            head = f.read(16)
            f.seek(max(0, size - 64))
            tail = f.read(64).rstrip(b"\x00")  # some writers pad after the end marker
    except OSError as e:
        return f"unreadable: {e}"
    kind = _format(head)
    if kind is None:
        return f"not an image: starts with {head[:8].hex(' ')}, which matches no image format"
    if kind == "JPEG" and not tail.endswith(_JPEG_END):
        return "truncated JPEG: does not end with the end-of-image marker FF D9"
    if kind == "PNG" and not tail.endswith(_PNG_END):
        return "truncated PNG: does not end with the IEND chunk"
    return None


@dataclass
class Scan:
    """What `scan` found under `root`."""

    root: Path
    files: list[tuple[Path, int]]  # (path, class index), in ImageFolder's order
    class_names: list[str]
    skipped: list[tuple[Path, str]]  # (path, reason)
    total_bytes: int = 0  # of `files`
    manifest: dict[str, Any] | None = None  # dataset.json, where present and readable
    manifest_error: str | None = None
    empty_classes: list[str] = field(default_factory=list)


def scan(root: str | os.PathLike[str]) -> Scan:
    """Lists the usable images under ``root/<class>/`` (see the module docstring)."""
    top = Path(root)
    if not top.exists():
        raise FileNotFoundError(
            f"dataset directory {top} does not exist; expected {LAYOUT}; make one with "
            f"`torch-emugpu dataset make imagenet-like {top} --images N`"
        )
    if not top.is_dir():
        raise ValueError(f"{top} is a file; expected a dataset directory: {LAYOUT}")
    files: list[tuple[Path, int]] = []
    skipped: list[tuple[Path, str]] = []
    total = 0
    with os.scandir(top) as it:
        entries = sorted(it, key=lambda e: e.name)
    names = [e.name for e in entries if e.is_dir()]  # as ImageFolder.find_classes
    for e in entries:
        if not e.is_dir() and os.path.splitext(e.name)[1].lower() in IMAGE_EXTENSIONS:
            skipped.append((Path(e.path), f"not in a class directory (expected {LAYOUT})"))
    empty: list[str] = []
    for index, name in enumerate(names):
        before = len(files)
        # ImageFolder's make_dataset walks in this order
        for dirpath, _, fnames in sorted(os.walk(top / name, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(dirpath, fname)
                try:
                    size = os.stat(path).st_size
                except OSError as err:
                    skipped.append((Path(path), f"unreadable: {err}"))
                    continue
                reason = _check_file(path, size)
                if reason:
                    skipped.append((Path(path), reason))
                else:
                    files.append((Path(path), index))
                    total += size
        if len(files) == before:
            empty.append(name)
    if not files:
        why = f"; {len(skipped)} files skipped, e.g. {skipped[0][0]}: {skipped[0][1]}" if skipped else ""
        raise ValueError(f"no usable images under {top} ({len(names)} class directories){why}; expected {LAYOUT}")
    manifest, manifest_error = None, None
    if (top / MANIFEST).is_file():
        try:
            manifest = json.loads((top / MANIFEST).read_text())
        except (OSError, ValueError) as err:
            manifest_error = str(err)
        if manifest is not None and not isinstance(manifest, dict):
            manifest, manifest_error = None, f"expected a JSON object, found {type(manifest).__name__}"
    return Scan(top, files, names, skipped, total, manifest, manifest_error, empty)


def _decode_pil(path: Path) -> Image.Image:
    with Image.open(path) as im:
        return im.convert("RGB")  # decodes fully: corrupt data fails here, not in a transform


def _decode_tensor(path: Path) -> torch.Tensor:
    # PIL (libjpeg-turbo) rather than torchvision.io, whose decoders torchvision 0.29 deprecates
    return torch.from_numpy(np.array(_decode_pil(path))).permute(2, 0, 1)


def _read_jpeg_bytes(path: Path) -> torch.Tensor:
    # For decoding on the device: only the header is checked here, as nvJPEG would reject the file there.
    data = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)
    jpeg_header(data)
    return data


DECODERS = {"pil": _decode_pil, "tensor": _decode_tensor, "bytes": _read_jpeg_bytes}


def set_page_cache(paths: list[Path], fraction: float, seed: int = 0) -> tuple[float, str | None]:
    """Leaves `fraction` of the files (a fixed random subset) in the page cache and drops the rest.

    Returns the fraction cached as far as the kernel was told, and why dropping failed where it did.
    """
    order = list(paths)
    random.Random(seed).shuffle(order)
    keep = round(fraction * len(order))
    for p in order[:keep]:
        with open(p, "rb") as f:
            while f.read(1 << 20):
                pass
    if keep == len(order):
        return 1.0, None
    if not hasattr(os, "posix_fadvise"):
        return 1.0, "the page cache was not dropped: posix_fadvise is not available here, so every file stayed cached"
    for p in order[keep:]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError as e:
            return 1.0, f"the page cache was not dropped ({p}: {e}), so the fetch stall reads as cached"
        finally:
            os.close(fd)
    return keep / len(order), None


def collate_bytes(batch: list[tuple[torch.Tensor, int]]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """DataLoader collate for ``decode="bytes"``: the files' byte tensors as a list (they differ in length)."""
    return [b[0] for b in batch], torch.tensor([b[1] for b in batch])


class ImageFiles(torch.utils.data.Dataset):
    """Map-style dataset of ``(image, class index)`` over a `Scan`.

    ``decode="pil"`` gives RGB PIL images (as ImageFolder), ``"tensor"`` uint8 CHW
    tensors, ``"bytes"`` the JPEG files' bytes as 1-D uint8 tensors (for decoding on
    the device; only the header is checked). A file that fails to decode is replaced by the next one that decodes
    and counted (`failed`, `failed_count`), or with ``strict=True`` raises
    `CorruptImageError` (see the module docstring).
    """

    def __init__(
        self,
        scan: Scan,
        transform: Callable[[Any], Any] | None = None,
        decode: str = "pil",
        strict: bool = False,
        target_transform: Callable[[int], Any] | None = None,
    ) -> None:
        if decode not in DECODERS:
            raise ValueError(f"decode must be one of {', '.join(DECODERS)}, got {decode!r}")
        if not scan.files:
            raise ValueError(f"the scan of {scan.root} holds no images; expected {LAYOUT}")
        if strict and scan.skipped:
            path, reason = scan.skipped[0]
            raise CorruptImageError(
                f"{path}: {reason} ({len(scan.skipped)} unusable files under {scan.root}); "
                "remove them, or pass strict=False to skip them"
            )
        self.root = scan.root
        self.samples = scan.files
        self.classes = scan.class_names
        self.transform = transform
        self.target_transform = target_transform
        self.decode = decode
        self.strict = strict
        self._decoder = DECODERS[decode]
        # One byte per file, in shared memory: workers mark the files that failed.
        self._failed = multiprocessing.RawArray("B", len(self.samples))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        n = len(self.samples)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for {n} images")
        index %= n
        for step in range(n):
            j = (index + step) % n
            if self._failed[j]:
                continue
            path, target = self.samples[j]
            try:
                image = self._decoder(path)
            except MemoryError:
                raise
            except Exception as err:  # noqa: BLE001  (any decoder error means this file is unusable)
                if self.strict:
                    raise CorruptImageError(
                        f"{path}: cannot decode ({type(err).__name__}: {err}); remove or "
                        "replace it, or pass strict=False to skip it"
                    ) from err
                self._failed[j] = 1
                warnings.warn(
                    f"{path}: cannot decode ({type(err).__name__}: {err}); using the next image instead",
                    RuntimeWarning,
                    stacklevel=2,
                )
                continue
            if self.transform is not None:
                image = self.transform(image)
            return image, (self.target_transform(target) if self.target_transform is not None else target)
        raise CorruptImageError(
            f"none of the {n} images under {self.root} decodes; run `torch-emugpu dataset check {self.root} --decode`"
        )

    def failed(self) -> list[Path]:
        """Files that failed to decode so far, in this process or any DataLoader worker."""
        flags = np.frombuffer(self._failed, dtype=np.uint8)
        return [self.samples[i][0] for i in np.flatnonzero(flags)]

    @property
    def failed_count(self) -> int:
        return int(np.count_nonzero(np.frombuffer(self._failed, dtype=np.uint8)))


def verify(found: Scan, decode: str = "pil", progress: bool = True) -> list[tuple[Path, str]]:
    """Decodes every file of the scan; returns (path, error) for those that fail."""
    from tqdm import tqdm

    decoder = DECODERS[decode]
    bad = []
    for path, _ in tqdm(found.files, desc="decoding", unit="img", disable=not progress):
        try:
            decoder(path)
        except MemoryError:
            raise
        except Exception as err:  # noqa: BLE001
            bad.append((path, f"cannot decode ({type(err).__name__}: {err})"))
    return bad


# --- the command ----------------------------------------------------------

SHOWN = 50  # skipped files listed by `dataset check`


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def main(args: Any) -> int:
    if args.action == "make":
        m = make(
            args.kind,
            args.dir,
            args.images,
            classes=args.classes,
            seed=args.seed,
            jobs=args.jobs,
            size=args.size,
            quality=args.quality,
            progress=not args.no_progress,
        )
        rate = m["count"] / m["elapsed_s"] if m["elapsed_s"] > 0 else float("inf")
        print(
            f"wrote {m['count']} images in {m['classes']} classes to {args.dir}: {_mb(m['total_bytes'])}, "
            f"mean {m['mean_width']:.0f}x{m['mean_height']:.0f} pixels, {m['mean_bytes'] / 1e3:.1f} KB per image "
            f"({m['elapsed_s']:.1f} s, {rate:.0f} images/s)"
        )
        return 0
    found = scan(args.dir)
    n = len(found.files)
    print(
        f"{found.root}: {n} images in {len(found.class_names)} classes, {_mb(found.total_bytes)} "
        f"({found.total_bytes / n / 1e3:.1f} KB per image)"
    )
    if found.empty_classes:
        print(f"{len(found.empty_classes)} classes without images: {', '.join(found.empty_classes[:10])}")
    manifest = found.manifest
    if manifest is not None:
        line = f"dataset.json: {manifest.get('kind')}, {manifest.get('count')} images, seed {manifest.get('seed')}"
        if manifest.get("count") != n:
            line += f"; found {n}: files were removed, added or damaged since it was made"
        print(line)
    elif found.manifest_error:
        print(f"dataset.json is unreadable ({found.manifest_error})")
    else:
        print("no dataset.json: not made by `torch-emugpu dataset make`, or that run did not finish")
    bad = list(found.skipped)
    if args.decode:
        bad += verify(found, progress=not args.no_progress)
    print(f"skipped {len(bad)} files" + (":" if bad else ""))
    for path, reason in bad[:SHOWN]:
        print(f"  {path}: {reason}")
    if len(bad) > SHOWN:
        print(f"  ... and {len(bad) - SHOWN} more")
    sys.stdout.flush()
    return 0
