"""Regression suite for faults and bad input: a dying worker, a planted symlink, a wrong argument.

Files are written safely (an unpredictable temporary name, a rename that
replaces rather than follows a symlink, the umask's mode, no NaN in JSON);
worker processes that die make their parent fail within seconds, naming the
signal; `dataset make` refuses image sizes that do not fit in memory; and
`configure()` rejects wrong types and out-of-range values itself.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import stat
import subprocess
import sys
import time

import pytest
from conftest import REPO

import torch_emugpu
from torch_emugpu.data import datasets
from torch_emugpu.measure import common

# --- files are written safely -----------------------------------------------


def _plant_symlink(at: os.PathLike[str] | str, tmp_path) -> os.PathLike[str]:
    """A symlink at `at` to a file another user cares about; returns that file."""
    victim = tmp_path / "victim"
    victim.write_text("the victim's data\n")
    os.symlink(victim, at)
    return victim


def test_json_write_does_not_follow_a_symlink_planted_at_the_old_temporary_name(tmp_path):
    target = tmp_path / "profiles" / "resnet50.json"
    target.parent.mkdir()
    victim = _plant_symlink(target.with_suffix(".json.tmp"), tmp_path)  # where the old code wrote
    common.write_json_atomic(target, {"model": "resnet50"})
    assert victim.read_text() == "the victim's data\n"
    assert stat.S_ISREG(os.lstat(target).st_mode)
    assert json.loads(target.read_text()) == {"model": "resnet50"}


def test_json_write_replaces_a_symlink_at_the_target_instead_of_writing_through_it(tmp_path):
    target = tmp_path / "dataset.json"
    victim = _plant_symlink(target, tmp_path)
    common.write_json_atomic(target, {"count": 1})
    assert victim.read_text() == "the victim's data\n"
    assert stat.S_ISREG(os.lstat(target).st_mode)


def test_dataset_images_do_not_follow_a_symlink_planted_at_the_old_temporary_name(tmp_path):
    root = tmp_path / "images"
    (root / "class000").mkdir(parents=True)
    job = datasets._Job(str(root), ("class000",), seed=0, quality=90, size=(16, 16), digits=6)
    image = root / "class000" / "000000.JPEG"
    victim = _plant_symlink(f"{image}.tmp", tmp_path)  # where the old code wrote
    datasets._make_range(job, 0, 1)
    assert victim.read_text() == "the victim's data\n"
    assert stat.S_ISREG(os.lstat(image).st_mode)
    assert image.read_bytes()[:2] == b"\xff\xd8"


def test_temporary_names_are_unpredictable_and_in_the_target_directory(tmp_path, monkeypatch):
    sources = []
    replace = os.replace

    def spy(src, dst, *args, **kwargs):
        sources.append(os.fspath(src))
        return replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", spy)
    target = tmp_path / "calibration.json"
    common.write_json_atomic(target, {"a": 1})
    common.write_json_atomic(target, {"a": 2})
    assert len(sources) == 2 and sources[0] != sources[1]
    assert all(os.path.dirname(s) == str(tmp_path) for s in sources)
    assert json.loads(target.read_text()) == {"a": 2}


def test_written_files_get_the_mode_the_umask_allows(tmp_path):
    old = os.umask(0o027)
    try:
        common.write_json_atomic(tmp_path / "a.json", {})
        with common.atomic_output(tmp_path / "b.JPEG") as f:
            f.write(b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "a.json").st_mode) == 0o640
    assert stat.S_IMODE(os.stat(tmp_path / "b.JPEG").st_mode) == 0o640


def test_a_failed_write_leaves_neither_the_target_nor_a_temporary_file(tmp_path):
    with pytest.raises(RuntimeError, match="encoder failed"), common.atomic_output(tmp_path / "x.JPEG") as f:
        f.write(b"half")
        raise RuntimeError("encoder failed")
    with pytest.raises(TypeError):
        common.write_json_atomic(tmp_path / "y.json", {"f": object()})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_json_with_a_non_finite_number_is_refused_naming_the_file_and_key(tmp_path, bad):
    target = tmp_path / "resnet50.json"
    doc = {"model": "resnet50", "batches": [{"forward_s": 0.01}, {"forward_s": bad}]}
    with pytest.raises(ValueError) as e:
        common.write_json_atomic(target, doc)
    message = str(e.value)
    assert str(target) in message and "batches[1].forward_s" in message and str(bad) in message
    assert list(tmp_path.iterdir()) == []


# --- configure() checks its arguments ---------------------------------------


@pytest.mark.parametrize("count", [65, 2**40, 2**80])
def test_configure_refuses_a_device_count_beyond_the_cores_limit_naming_it(count):
    with pytest.raises(ValueError, match=r"device_count: expected at most 64 emulated GPUs, got \d+"):
        torch_emugpu.configure(device_count=count)
    assert torch_emugpu.config().device_count == 2  # unchanged


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"device_count": "2"}, r"device_count=.*expected an int .* got str '2'"),
        ({"device_count": 2.5}, r"device_count=.*expected an int .* got float 2.5"),
        ({"device_count": True}, r"device_count=.*expected an int .* got bool True"),
        ({"gpu": 3}, r"gpu=.*expected a GPU name as a str.* got int 3"),
        ({"mode": 1}, r"mode=.*expected one of 'timing', 'compute', got int 1"),
        ({"gpu": "t4", "mode": b"compute"}, r"mode=.*got bytes b'compute'"),
    ],
)
def test_configure_refuses_wrong_types_naming_the_argument(kwargs, expected):
    with pytest.raises(TypeError, match=expected):
        torch_emugpu.configure(**kwargs)
    cfg = torch_emugpu.config()
    assert (cfg.device_count, cfg.mode) == (2, "timing")


def test_configure_takes_integers_of_any_int_type():
    import numpy as np

    torch_emugpu.configure(device_count=np.int64(3))
    assert torch_emugpu.config().device_count == 3


# --- worker processes that die ------------------------------------------------

# Runs `dataset make` through the command, with 2 workers, one of which SIGKILLs itself
# (fork: the workers inherit the patched function). The old multiprocessing.Pool replaced
# the dead worker and waited forever for its task; the timeout below bounds that.
_KILLED_WORKER = """
import os, signal, sys, time
from torch_emugpu.cli import commands
from torch_emugpu.data import datasets
parent, real = os.getpid(), datasets._make_range
def dies_in_a_worker(job, start, stop):
    if os.getpid() != parent and start >= 4:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(job, start, stop)
datasets._make_range = dies_in_a_worker
started = time.perf_counter()
rc = commands.main(["dataset", "make", "fixed", sys.argv[1], "--images", "32", "--classes", "2",
                    "--size", "32x32", "--jobs", "2", "--no-progress"])
print(f"rc={rc} after {time.perf_counter() - started:.1f} s")
"""


@pytest.mark.slow  # a fresh interpreter: about 10 s
def test_dataset_make_fails_within_seconds_naming_the_signal_when_a_worker_is_killed(tmp_path):
    script = tmp_path / "killed_worker.py"
    script.write_text(_KILLED_WORKER)
    root = tmp_path / "images"
    r = subprocess.run([sys.executable, str(script), str(root)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    rc, elapsed = re.search(r"rc=(\d+) after ([\d.]+) s", r.stdout).groups()
    assert rc == "1" and float(elapsed) < 10, r.stdout
    assert re.search(r"worker process \d+ was killed by signal SIGKILL \(9\)", r.stderr), r.stderr
    assert "fewer --jobs" in r.stderr and "no dataset.json" in r.stderr
    assert not (root / "dataset.json").exists()


def test_dataset_make_raises_a_workers_exception_with_its_traceback(tmp_path, monkeypatch):
    real = datasets._make_range
    parent = os.getpid()

    def fails_in_a_worker(job, start, stop):
        if os.getpid() != parent and start >= 4:
            raise OSError(28, "No space left on device")
        return real(job, start, stop)

    monkeypatch.setattr(datasets, "_make_range", fails_in_a_worker)
    with pytest.raises(OSError, match="No space left") as e:
        datasets.make("fixed", tmp_path / "images", 32, classes=2, size=(32, 32), jobs=2, progress=False)
    assert "fails_in_a_worker" in "".join(getattr(e.value, "__notes__", []))


@pytest.mark.slow  # a model's set-up and a DataLoader: about 6 s
@pytest.mark.filterwarnings("ignore:emugpu. no profile matched")
def test_train_data_fails_naming_the_signal_when_a_loader_worker_is_killed(tmp_path, monkeypatch):
    from torch_emugpu.data import WorkerDiedError, data_train

    root = tmp_path / "images"
    datasets.make("fixed", root, 16, classes=2, size=(32, 32), jobs=1, progress=False)
    parent, real = os.getpid(), datasets.ImageFiles.__getitem__

    def dies_in_a_worker(self, index):
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, index)

    monkeypatch.setattr(datasets.ImageFiles, "__getitem__", dies_in_a_worker)
    started = time.perf_counter()
    with pytest.raises(WorkerDiedError, match=r"DataLoader worker process \d+ was killed by signal SIGKILL") as e:
        data_train.run(root, model="resnet18", batch_size=4, workers=1, progress=False)
    assert "fewer --workers" in str(e.value)
    assert time.perf_counter() - started < 60  # the model's set-up included; the worker's death is seen at once


# --- image sizes against memory -------------------------------------------------


def test_dataset_make_refuses_an_image_size_that_does_not_fit_in_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "available_memory", lambda: 2 << 30)
    root = tmp_path / "images"
    with pytest.raises(ValueError) as e:
        datasets.make("fixed", root, 1, size=(40000, 40000), jobs=1, progress=False)
    message = str(e.value)
    assert "--size 40000x40000" in message and "35.8 GiB" in message and "2.0 GiB is available" in message
    assert "choose a smaller --size" in message
    assert not root.exists()


def test_dataset_make_refuses_more_jobs_than_fit_in_memory_and_defaults_to_as_many_as_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "available_memory", lambda: 100 << 20)  # one 256x256 worker (~66 MiB) fits
    with pytest.raises(ValueError, match=r"--jobs 2 with --size 256x256: .* use --jobs 1 or fewer"):
        datasets.make("fixed", tmp_path / "a", 2, classes=1, size=(256, 256), jobs=2, progress=False)

    def no_workers(*args):
        raise AssertionError("one process fits, so make() should not start workers")

    monkeypatch.setattr(datasets, "_in_workers", no_workers)
    m = datasets.make("fixed", tmp_path / "b", 2, classes=1, size=(256, 256), progress=False)
    assert m["count"] == 2


def test_a_generator_on_a_device_that_does_not_exist_is_an_index_error() -> None:
    import torch

    with pytest.raises(IndexError, match=r"expected 0 <= index < \d+, got 9"):
        torch.Generator(device="emugpu:9")
    assert torch.Generator(device="emugpu:0").device == torch.device("emugpu", 0)
