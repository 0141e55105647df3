"""GPU-side preprocessing on emugpu: decode_jpeg timed from the preprocessing
table (or scaled from another GPU's), real pixels in compute mode, and the
torchvision.transforms.v2 ops that run on emugpu tensors."""

import io
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import torch_emugpu
from torch_emugpu.data import preprocessing
from torch_emugpu.measure.images import render as _render


def jpeg(w: int, h: int, seed: int = 0) -> torch.Tensor:
    buf = io.BytesIO()
    _render(np.random.default_rng(seed), w, h).save(buf, format="JPEG", quality=90)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def test_the_header_gives_components_height_and_width_and_bad_bytes_are_value_errors():
    assert preprocessing.jpeg_header(jpeg(64, 48)) == (3, 48, 64)
    with pytest.raises(ValueError, match="not a JPEG: expected the start-of-image marker FF D8"):
        preprocessing.jpeg_header(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(ValueError, match="without a frame header"):
        preprocessing.jpeg_header(jpeg(64, 48)[:20])


def test_decoding_a_batch_allocates_the_images_and_takes_the_tables_time():
    torch_emugpu.configure(gpu="h100")
    datas = [jpeg(500, 375, seed) for seed in range(32)]
    before = torch.emugpu.memory_allocated()
    busy = torch.emugpu.engine_stats()["compute_busy_s"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the H100's own table: nothing to warn about
        warnings.filterwarnings("ignore", message=r".*is host-bound")  # drawn by a loaded host, not the subject
        images = preprocessing.decode_jpeg(datas, device="emugpu")
    torch.emugpu.synchronize()
    assert [tuple(i.shape) for i in images] == [(3, 375, 500)] * 32
    assert all(i.device.type == "emugpu" and i.dtype == torch.uint8 for i in images)
    assert torch.emugpu.memory_allocated() - before >= 32 * 3 * 375 * 500
    # the measured H100 row for 32 images of 500x375: 2.377 ms
    assert torch.emugpu.engine_stats()["compute_busy_s"] - busy == pytest.approx(2.377e-3, rel=0.02)


def test_a_gpu_without_a_table_uses_another_gpus_scaled_by_sm_count():
    torch_emugpu.configure(gpu="a100")  # 108 SMs, no table shipped
    preprocessing._warned.clear()
    with pytest.warns(UserWarning, match="no preprocessing table for NVIDIA A100-SXM4-40GB.*scaled by SM count"):
        seconds = preprocessing.decode_seconds([500 * 375] * 32, 0)
    assert seconds / (132 / 108) == pytest.approx(2.377e-3, rel=0.02)


def test_without_any_table_the_fitted_fallback_is_used(monkeypatch):
    monkeypatch.setenv("EMUGPU_PROFILES", "off")
    preprocessing._warned.clear()
    with pytest.warns(UserWarning, match="no preprocessing table on the search path"):
        seconds = preprocessing.decode_seconds([500 * 375] * 128, 0)
    # 29 us + 113 us / 128 + 0.27 ns per pixel, per image, scaled from 132 SMs to the A100's 108
    assert seconds == pytest.approx(128 * (29e-6 + 113e-6 / 128 + 0.27e-9 * 500 * 375) * 132 / 108, rel=1e-6)


def test_compute_mode_decodes_the_real_pixels():
    torch_emugpu.configure(mode="compute")
    data = jpeg(40, 30, seed=3)
    image = preprocessing.decode_jpeg(data)
    expected = np.array(Image.open(io.BytesIO(bytes(data.numpy()))).convert("RGB"))
    assert torch.equal(image.cpu(), torch.from_numpy(expected).permute(2, 0, 1))
    gray = preprocessing.decode_jpeg(data, mode="GRAY")
    assert gray.shape == (1, 30, 40)


def test_bad_inputs_are_value_errors():
    with pytest.raises(
        ValueError, match="expected 1-D uint8 CPU tensors of JPEG bytes, got input 0 as Tensor torch.float32"
    ):
        preprocessing.decode_jpeg(torch.zeros(10))
    with pytest.raises(ValueError, match="expected mode UNCHANGED, GRAY or RGB, got 'CMYK'"):
        preprocessing.decode_jpeg(jpeg(8, 8), mode="CMYK")
    assert preprocessing.decode_jpeg([]) == []


def _v2_ops():
    from torchvision.transforms.v2 import functional as F

    return {
        "resize": lambda x: F.resize(x, [40], antialias=True),
        "resized_crop": lambda x: F.resized_crop(x, 2, 2, 30, 30, [24, 24], antialias=True),
        "center_crop": lambda x: F.center_crop(x, [24, 24]),
        "pad": lambda x: F.pad(x, [4]),
        "horizontal_flip": F.horizontal_flip,
        "vertical_flip": F.vertical_flip,
        "rotate": lambda x: F.rotate(x, 15.0),
        "affine": lambda x: F.affine(x, angle=10.0, translate=[2, 2], scale=1.1, shear=[0.0]),
        "perspective": lambda x: F.perspective(
            x, [[0, 0], [47, 0], [47, 47], [0, 47]], [[2, 2], [45, 0], [47, 45], [0, 47]]
        ),
        "elastic": lambda x: F.elastic(x, torch.zeros(1, 48, 48, 2, device=x.device)),
        "normalize": lambda x: F.normalize(F.to_dtype(x, torch.float32, scale=True), [0.5] * 3, [0.2] * 3),
        "adjust_hue": lambda x: F.adjust_hue(x, 0.1),
        "gaussian_blur": lambda x: F.gaussian_blur(x, [5, 5]),
        "equalize": F.equalize,
        "autocontrast": F.autocontrast,
        "rgb_to_grayscale": F.rgb_to_grayscale,
    }


@pytest.mark.parametrize("name", list(_v2_ops()))
def test_torchvision_v2_ops_run_on_emugpu_images_with_the_cpus_values(name):
    torch_emugpu.configure(mode="compute")
    op = _v2_ops()[name]
    image = torch.randint(0, 256, (3, 48, 48), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    got = op(image.to("emugpu"))
    assert got.device.type == "emugpu"
    expected = op(image)
    assert got.shape == expected.shape
    assert torch.allclose(got.cpu().float(), expected.float(), atol=1.5)
