"""Datasets: `torch-emugpu dataset make/check`, `scan` and `ImageFiles` (torch_emugpu.data.datasets)."""

from __future__ import annotations

import json
import re
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

from torch_emugpu import cli
from torch_emugpu.data import datasets


def make_fixed(root: Path, images: int = 8, size: str = "32x24", classes: int | None = None) -> Path:
    datasets.make("fixed", root, images, classes=classes, size=size, jobs=1, progress=False)
    return root


def corrupt_huffman_table(path: Path) -> None:
    """Keeps the JPEG's start, end and length but ruins its Huffman table: the
    cheap checks pass and decoding fails (libjpeg: bogus Huffman table)."""
    data = bytearray(path.read_bytes())
    at = data.find(b"\xff\xc4")
    assert at > 0
    data[at + 4 : at + 24] = b"\xff" * 20
    path.write_bytes(bytes(data))


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --- make -----------------------------------------------------------------


def test_same_seed_same_bytes_whatever_the_jobs(tmp_path):
    datasets.make("imagenet-like", tmp_path / "a", 12, classes=3, seed=7, jobs=1, progress=False)
    datasets.make("imagenet-like", tmp_path / "b", 12, classes=3, seed=7, jobs=2, progress=False)
    datasets.make("imagenet-like", tmp_path / "c", 12, classes=3, seed=8, jobs=1, progress=False)
    a, b, c = (tree_bytes(tmp_path / d) for d in "abc")
    assert len(a) == 13  # 12 images + dataset.json
    assert a == b
    assert a.keys() == c.keys()
    assert all(a[k] != c[k] for k in a if k.endswith(".JPEG"))


def test_layout_is_read_by_imagefolder_in_the_same_order(tmp_path):
    root = make_fixed(tmp_path / "d", images=10, classes=4)
    found = datasets.scan(root)
    folder = torchvision.datasets.ImageFolder(str(root))
    assert folder.classes == found.class_names == ["class000", "class001", "class002", "class003"]
    assert folder.samples == [(str(p), c) for p, c in found.files]
    assert Counter(c for _, c in found.files) == {0: 3, 1: 3, 2: 2, 3: 2}
    image, target = folder[5]
    assert image.size == (32, 24) and target == 1
    assert sorted(p.name for p in (root / "class001").iterdir()) == ["000001.JPEG", "000005.JPEG", "000009.JPEG"]


@pytest.mark.slow
def test_imagenet_like_sizes_resemble_imagenet(tmp_path):
    # the sampler alone, many draws: the figures the module's comment states
    rng = np.random.default_rng(0)
    sizes = np.array([datasets.imagenet_like_size(rng) for _ in range(20000)])
    assert 395 < sizes[:, 0].mean() < 425 and 335 < sizes[:, 1].mean() < 360
    assert 0.55 < (sizes.max(axis=1) == 500).mean() < 0.65
    assert Counter(map(tuple, sizes.tolist())).most_common(1)[0][0] == (500, 375)
    assert sizes.min() >= 40 and sizes.max() > 1000

    m = datasets.make("imagenet-like", tmp_path / "d", 200, jobs=2, progress=False)
    files = sorted((tmp_path / "d").glob("*/*.JPEG"))
    assert len(files) == 200 and m["count"] == 200 and m["classes"] == 100
    dims = np.array([Image.open(p).size for p in files])
    assert 360 < dims[:, 0].mean() < 460 and 300 < dims[:, 1].mean() < 400
    assert m["mean_width"] == round(dims[:, 0].mean(), 1)
    assert m["total_bytes"] == sum(p.stat().st_size for p in files)
    assert 80e3 < m["mean_bytes"] < 140e3  # ImageNet: about 110 KB per file
    assert json.loads((tmp_path / "d" / "dataset.json").read_text())["kind"] == "imagenet-like"


def test_fixed_kind_sizes_are_exact_and_files_photo_sized(tmp_path):
    root = make_fixed(tmp_path / "d", images=5, size="256x192")
    files = sorted(root.glob("*/*.JPEG"))
    assert len(files) == 5 and all(Image.open(p).size == (256, 192) for p in files)
    # a flat or smooth image would be a few KB; photo-like content about 0.5-1 byte per pixel
    assert all(p.stat().st_size > 0.3 * 256 * 192 for p in files)
    assert datasets.scan(root).manifest["size"] == [256, 192]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(images=0), "--images must be at least 1, got 0"),
        (dict(classes=0), "--classes must be in 1..--images (4), got 0"),
        (dict(classes=5), "--classes must be in 1..--images (4), got 5"),
        (dict(size="12"), "--size must be WIDTHxHEIGHT"),
        (dict(size="0x5"), "--size must be WIDTHxHEIGHT"),
        (dict(size=None), "the fixed kind needs --size"),
        (dict(quality=0), "--quality must be in 1..100"),
        (dict(quality=101), "--quality must be in 1..100"),
        (dict(jobs=0), "--jobs must be at least 1"),
        (dict(seed=-1), "--seed must be a non-negative integer, got -1"),
        (dict(kind="imagenet"), "unknown dataset kind 'imagenet'"),
        (dict(kind="imagenet-like"), "--size applies to the fixed kind only"),
    ],
)
def test_make_refuses_bad_arguments(tmp_path, kwargs, message):
    args = dict(kind="fixed", root=tmp_path / "d", images=4, size="8x8", jobs=1, progress=False) | kwargs
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        datasets.make(**args)
    assert not (tmp_path / "d").exists()


def test_make_refuses_a_directory_that_is_not_empty(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="exists and is not empty .*notes.txt"):
        make_fixed(tmp_path / "d")
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["notes.txt"]
    (tmp_path / "e").mkdir()  # an empty one is fine
    assert make_fixed(tmp_path / "e", images=2).joinpath("dataset.json").is_file()


def test_an_interrupted_make_leaves_no_manifest(tmp_path, monkeypatch, capsys):
    real = datasets._render
    calls = []

    def render(rng, w, h):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(rng, w, h)

    monkeypatch.setattr(datasets, "_render", render)
    with pytest.raises(KeyboardInterrupt):
        make_fixed(tmp_path / "d", images=8)
    assert len(list((tmp_path / "d").glob("*/*.JPEG"))) == 3
    assert not (tmp_path / "d" / "dataset.json").exists()
    assert not list((tmp_path / "d").glob("*/*.tmp"))
    assert cli.main(["dataset", "check", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "no dataset.json: not made by `torch-emugpu dataset make`, or that run did not finish" in out


# --- scan and ImageFiles --------------------------------------------------


def test_scan_refuses_a_missing_or_empty_root(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"dataset directory {tmp_path / 'nope'} does not exist"):
        datasets.scan(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=f"no usable images under {tmp_path / 'empty'} .*expected ROOT/<class name>/"):
        datasets.scan(tmp_path / "empty")
    (tmp_path / "empty" / "cat").mkdir()
    (tmp_path / "empty" / "cat" / "a.JPEG").write_text("hello")
    with pytest.raises(ValueError, match="1 files skipped, e.g. .*a.JPEG: not an image"):
        datasets.scan(tmp_path / "empty")


@pytest.fixture
def damaged(tmp_path) -> tuple[Path, dict[str, Path]]:
    """12 images in 3 classes; 4 damaged so that the scan skips them, 1 so that only decoding fails."""
    root = make_fixed(tmp_path / "d", images=12, classes=3)
    c0, c1 = root / "class000", root / "class001"
    bad = {
        "text": c0 / "x.JPEG",
        "empty": c0 / "empty.jpg",
        "other": c1 / "notes.txt",
        "truncated": c1 / "000004.JPEG",
        "corrupt": c0 / "000009.JPEG",  # the last of its class: its substitute is of class 1
    }
    bad["text"].write_text("not a JPEG at all")
    bad["empty"].write_bytes(b"")
    bad["other"].write_text("a stray file")
    data = bad["truncated"].read_bytes()
    bad["truncated"].write_bytes(data[: len(data) // 2])
    corrupt_huffman_table(bad["corrupt"])
    return root, bad


def test_scan_skips_files_that_are_not_images_with_reasons(damaged):
    root, bad = damaged
    found = datasets.scan(root)
    reasons = dict(found.skipped)
    assert reasons[bad["text"]].startswith("not an image: starts with 6e 6f 74")
    assert reasons[bad["empty"]] == "empty file (0 bytes)"
    assert reasons[bad["other"]].startswith("extension '.txt' is not an image extension")
    assert reasons[bad["truncated"]] == "truncated JPEG: does not end with the end-of-image marker FF D9"
    assert len(found.skipped) == 4
    assert len(found.files) == 11 and bad["corrupt"] in [p for p, _ in found.files]  # its ends look fine
    assert found.total_bytes == sum(p.stat().st_size for p, _ in found.files)


def test_scan_reads_the_format_from_the_bytes_not_the_name(tmp_path):
    (tmp_path / "d" / "a").mkdir(parents=True)
    image = Image.new("RGB", (8, 6), (200, 10, 10))
    image.save(tmp_path / "d" / "a" / "png.png")
    image.save(tmp_path / "d" / "a" / "png_named.JPEG", format="PNG")  # ImageNet holds such files
    image.save(tmp_path / "d" / "a" / "cut.png")
    cut = tmp_path / "d" / "a" / "cut.png"
    cut.write_bytes(cut.read_bytes()[:-12])
    image.save(tmp_path / "d" / "stray.jpg")
    (tmp_path / "d" / "dataset.json").write_text("[1, 2]")
    found = datasets.scan(tmp_path / "d")
    assert [p.name for p, _ in found.files] == ["png.png", "png_named.JPEG"]
    assert {p.name: r for p, r in found.skipped} == {
        "cut.png": "truncated PNG: does not end with the IEND chunk",
        "stray.jpg": "not in a class directory (expected ROOT/<class name>/<image>.JPEG "
        "(one directory per class, as torchvision's ImageFolder reads))",
    }
    assert datasets.ImageFiles(found)[1][0].getpixel((0, 0)) == (200, 10, 10)
    assert found.manifest is None and found.manifest_error == "expected a JSON object, found list"


def test_a_file_that_fails_to_decode_is_replaced_and_counted(damaged):
    root, bad = damaged
    found = datasets.scan(root)
    ds = datasets.ImageFiles(found, transform=torchvision.transforms.functional.pil_to_tensor)
    i = [p for p, _ in found.files].index(bad["corrupt"])
    with pytest.warns(RuntimeWarning, match=f"{bad['corrupt']}: cannot decode"):
        image, target = ds[i]
    assert image.shape == (3, 24, 32)
    assert found.files[i + 1][1] == target == 1  # the next file, with its own class
    assert torch.equal(datasets.ImageFiles(found, decode="tensor")[i + 1][0], image)
    assert ds.failed() == [bad["corrupt"]] and ds.failed_count == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # known bad now: skipped without decoding or warning again
        assert torch.equal(ds[i][0], image)
    assert ds.failed_count == 1


def test_strict_raises_naming_the_file(damaged):
    root, bad = damaged
    found = datasets.scan(root)
    with pytest.raises(datasets.CorruptImageError, match="empty.jpg: empty file .*4 unusable files"):
        datasets.ImageFiles(found, strict=True)
    found.skipped.clear()
    ds = datasets.ImageFiles(found, strict=True, decode="tensor")
    i = [p for p, _ in found.files].index(bad["corrupt"])
    with pytest.raises(datasets.CorruptImageError, match=f"^{bad['corrupt']}: cannot decode"):
        ds[i]
    assert ds[i + 1][0].shape == (3, 24, 32)
    assert ds.failed_count == 0


@pytest.mark.parametrize("start", ["fork", "spawn"])  # spawn: the shared flags travel by pickling
@pytest.mark.slow
def test_dataloader_workers_survive_corrupt_files_and_the_caller_sees_the_count(tmp_path, start):
    root = make_fixed(tmp_path / "d", images=16, classes=2)
    corrupt = [root / "class000" / "000004.JPEG", root / "class001" / "000011.JPEG"]
    for path in corrupt:
        corrupt_huffman_table(path)
    ds = datasets.ImageFiles(datasets.scan(root), decode="tensor")
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, shuffle=True, multiprocessing_context=start)
    for _ in range(2):  # the second epoch skips the known bad files
        seen = 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for images, targets in loader:
                assert images.shape[1:] == (3, 24, 32) and images.dtype == torch.uint8
                assert set(targets.tolist()) <= {0, 1}
                seen += len(targets)
        assert seen == 16  # batches keep their size: substitutes, not holes
        assert sorted(ds.failed()) == corrupt and ds.failed_count == 2


def test_imagefiles_refuses_a_bad_decoder(damaged):
    with pytest.raises(ValueError, match="decode must be one of pil, tensor, bytes, got 'cv2'"):
        datasets.ImageFiles(datasets.scan(damaged[0]), decode="cv2")


# --- the command ----------------------------------------------------------


def test_cli_make_then_check(tmp_path, capsys):
    root = tmp_path / "d"
    assert (
        cli.main(
            [
                "dataset",
                "make",
                "fixed",
                str(root),
                "--images",
                "6",
                "--size",
                "40x30",
                "--jobs",
                "2",
                "--seed",
                "3",
                "--quality",
                "80",
                "--no-progress",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"wrote 6 images in 6 classes to {root}" in out and "mean 40x30 pixels" in out
    manifest = json.loads((root / "dataset.json").read_text())
    assert (manifest["seed"], manifest["quality"], manifest["count"]) == (3, 80, 6)
    assert cli.main(["dataset", "check", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"{root}: 6 images in 6 classes" in out
    assert "dataset.json: fixed, 6 images, seed 3" in out and "skipped 0 files" in out


def test_cli_check_reports_skipped_and_corrupt_files(damaged, capsys):
    root, bad = damaged
    assert cli.main(["dataset", "check", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"{root}: 11 images in 3 classes" in out
    assert "dataset.json: fixed, 12 images, seed 0; found 11" in out
    assert "skipped 4 files:" in out and f"  {bad['truncated']}: truncated JPEG" in out
    assert str(bad["corrupt"]) not in out
    assert cli.main(["dataset", "check", str(root), "--decode", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "skipped 5 files:" in out and f"  {bad['corrupt']}: cannot decode" in out


def test_cli_errors_exit_2(tmp_path, capsys):
    assert cli.main(["dataset", "check", str(tmp_path / "nope")]) == 2
    assert f"torch-emugpu: error: dataset directory {tmp_path / 'nope'} does not exist" in capsys.readouterr().err
    assert cli.main(["dataset", "check", str(tmp_path)]) == 2
    assert f"torch-emugpu: error: no usable images under {tmp_path}" in capsys.readouterr().err
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep").write_text("")
    assert cli.main(["dataset", "make", "imagenet-like", str(tmp_path / "x"), "--images", "3"]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert cli.main(["dataset", "make", "fixed", str(tmp_path / "y"), "--images", "3", "--size", "3by4"]) == 2
    assert "--size must be WIDTHxHEIGHT" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # argparse: --images is required
        cli.main(["dataset", "make", "fixed", str(tmp_path / "y")])
    assert exit_.value.code == 2


def test_bytes_decoding_hands_over_the_jpeg_bytes_and_skips_files_without_a_jpeg_header(tmp_path):
    datasets.make("fixed", tmp_path / "d", images=4, classes=2, size=(32, 24), jobs=1, progress=False)
    found = datasets.scan(tmp_path / "d")
    first = found.files[0][0]
    first.write_bytes(b"\xff\xd8" + b"\x00" * 200)  # a JPEG marker and nothing usable after it
    ds = datasets.ImageFiles(found, decode="bytes")
    with pytest.warns(RuntimeWarning, match="cannot decode"):
        data, label = ds[0]
    assert data.dtype == torch.uint8 and data.dim() == 1
    assert bytes(data[:2].numpy()) == b"\xff\xd8" and data.numel() > 202
    assert ds.failed() == [first]
