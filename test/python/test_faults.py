"""Issue 30's regression suite, Python side: faults, bad input and other users.

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
import stat

import pytest

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
