"""torch-emugpu train --data: DataLoader-fed epochs on an image folder with the
stall breakdown (fetch, preprocessing, transfer), AU and a timeline."""

import pytest
from conftest import run_python

from torch_emugpu.data import data_train, datasets


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("data") / "images"
    datasets.make("fixed", root, 48, classes=4, size=(64, 48), jobs=1, progress=False)
    return root


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos") / "images"
    datasets.make("fixed", root, 32, classes=2, size=(640, 480), jobs=1, progress=False)
    return root


@pytest.mark.slow
def test_a_gpu_bound_epoch_has_high_au_and_little_stall(folder):
    # vgg11 on a K80 needs ~70 ms per batch of 8; two workers make a batch of tiny JPEGs far sooner.
    # The workers' decoding is real host work, which a loaded machine slows: best of 3 epochs.
    for _ in range(3):
        r = data_train.run(folder, model="vgg11", gpu="k80", batch_size=8, workers=2, progress=False)
        (e,) = r.epochs
        if e.au > 0.75 and e.prep_stall_s < 0.3 * e.epoch_s:
            break
    assert e.images == 48 and r.baseline is None
    assert e.au > 0.75, data_train.summary(r)
    assert e.fetch_stall_s == 0.0
    assert e.prep_stall_s < 0.3 * e.epoch_s
    assert e.gpu_busy_s == pytest.approx(e.gpu_needed_s, rel=0.15)
    assert r.pipeline_images_per_s > r.batch_size / r.gpu_iteration_s  # the GPU limits


@pytest.mark.slow
def test_a_data_bound_epoch_reports_the_preprocessing_stall(photos):
    # resnet18 on an A100 needs a few ms per batch of 8; decoding 640x480 JPEGs in the main process far longer
    r = data_train.run(photos, model="resnet18", gpu="a100", batch_size=8, workers=0, progress=False)
    (e,) = r.epochs
    assert e.au < 0.5, data_train.summary(r)
    assert e.prep_stall_s > 0.5 * e.epoch_s
    assert e.data_wait_s > 0.3 * e.epoch_s
    assert "the host pipeline limits" in data_train.summary(r)


@pytest.mark.slow
def test_a_partly_cached_dataset_gets_a_cached_baseline_and_a_fetch_stall(folder, tmp_path):
    png = tmp_path / "timeline.png"
    r = data_train.run(
        folder,
        model="resnet18",
        gpu="v100",
        batch_size=8,
        workers=1,
        cache_fraction=0.5,
        epochs=2,
        timeline=str(png),
        progress=False,
    )
    assert r.baseline is not None and r.baseline.cached_fraction == 1.0
    assert len(r.epochs) == 2
    for e in r.epochs:
        assert e.cached_fraction == 0.5 or e.cache_note
        assert e.fetch_stall_s >= 0 and e.prep_stall_s == r.baseline.data_stall_s
    assert png.stat().st_size > 10_000
    text = data_train.summary(r)
    assert "baseline (all cached)" in text and "50% of the files cached" in text and "AU" in text


@pytest.mark.slow
def test_gpu_preprocessing_decodes_on_the_emulated_gpu(folder):
    r = data_train.run(
        folder, model="resnet18", gpu="h100", batch_size=8, workers=1, gpu_preprocessing=True, progress=False
    )
    (e,) = r.epochs
    assert e.images == 48 and r.failed_files == 0
    assert not r.pin_memory or r.gpu_preprocessing
    assert "GPU preprocessing" in data_train.summary(r)


def test_the_page_cache_split_keeps_the_asked_fraction(folder):
    paths = [p for p, _ in datasets.scan(folder).files]
    assert datasets.set_page_cache(paths, 1.0) == (1.0, None)
    cached, note = datasets.set_page_cache(paths, 0.25)
    assert (cached, note) == (0.25, None) or "not dropped" in note


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"workers": -1}, "--workers: expected 0 or more DataLoader worker processes, got -1"),
        ({"cache_fraction": 1.5}, "--cache-fraction: expected a fraction of the dataset from 0 to 1, got 1.5"),
        ({"cache_fraction": -0.1}, "--cache-fraction: expected a fraction"),
        ({"batch_size": 100}, "fewer than one batch of 100"),
        ({"model": "gpt2"}, "expected a torchvision classification model \\(e.g. resnet50\\), got 'gpt2'"),
    ],
)
def test_bad_arguments_are_value_errors(folder, kwargs, message):
    with pytest.raises(ValueError, match=message):
        data_train.run(folder, **{"model": "resnet18", "progress": False, **kwargs})


@pytest.mark.slow
def test_the_cli_reports_a_missing_folder_and_bad_options(tmp_path):
    r = run_python(
        "from torch_emugpu import cli\n"
        f"raise SystemExit(cli.main(['train', '--data', '{tmp_path / 'nowhere'}', '--no-progress']))"
    )
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = run_python(
        "from torch_emugpu import cli\n"
        f"raise SystemExit(cli.main(['train', '--data', '{tmp_path}', '--workers', '-2']))"
    )
    assert r.returncode == 2 and "--workers: expected 0 or more" in r.stderr
