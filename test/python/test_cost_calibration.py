"""Calibration files: the per-op cost model fits its kernel parameters to a
`torch-emugpu calibrate` sweep of the emulated GPU found on the profile
search path; bad files are refused naming the file and the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import run_python

import torch_emugpu

SCHEMA = "torch-emugpu calibration v1"


@pytest.fixture
def calibration_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A profile directory first on the search path; the default path is restored afterwards."""
    monkeypatch.setenv("EMUGPU_PROFILE_PATH", str(tmp_path))
    yield tmp_path
    monkeypatch.undo()
    torch_emugpu.timing.profiles.reload()


def gpu_folder(root: Path) -> Path:
    name = torch.emugpu.get_device_name()
    folder = root / name.replace(" ", "_")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def slow_memory_sweep(gpu: str, bandwidth: float, efficiency: float) -> dict:
    """Elementwise adds measured at `efficiency` of `bandwidth`, 5 us launches."""
    points = []
    for e in range(16, 30, 2):
        n = 2**e
        nbytes = 12 * n
        points.append(
            {
                "family": "elementwise",
                "op": "add",
                "shape": {"numel": n},
                "dtype": "float32",
                "flags": {},
                "time_s": 5e-6 + nbytes / (bandwidth * efficiency),
                "flops": n,
                "bytes": nbytes,
                "kernels": 1,
            }
        )
    return {"schema": SCHEMA, "gpu": gpu, "measurements": points}


def busy_of_add(n: int) -> float:
    a = torch.empty(n, device="emugpu")
    torch.emugpu.synchronize()
    torch.emugpu.reset_engine_stats()
    torch.add(a, 1.0)
    torch.emugpu.synchronize()
    return torch.emugpu.engine_stats()["compute_busy_s"]


def test_a_calibration_for_the_emulated_gpu_replaces_the_architecture_table(calibration_dir: Path) -> None:
    table = torch_emugpu.kernel_params()
    assert table["source"].startswith("table: ")
    before = busy_of_add(2**26)
    bandwidth = 2**26 * 8 / ((before - table["launch_ns"] * 1e-9) / 1)  # read + write at the table's rate
    bandwidth /= table["memory_efficiency"]  # the peak
    sweep = slow_memory_sweep(torch.emugpu.get_device_name(), bandwidth, 0.2)
    (gpu_folder(calibration_dir) / "calibration.json").write_text(json.dumps(sweep))
    torch_emugpu.timing.profiles.reload()
    fitted = torch_emugpu.kernel_params()
    assert fitted["source"] == f"calibration: {gpu_folder(calibration_dir) / 'calibration.json'}"
    assert fitted["memory_efficiency"] == pytest.approx(0.2, rel=0.05)
    assert fitted["launch_ns"] == pytest.approx(5000, rel=0.1)
    # The shape cache forgot the old charge: the same add now takes the calibrated time.
    after = busy_of_add(2**26)
    assert after / before == pytest.approx(table["memory_efficiency"] / 0.2, rel=0.1)


def test_a_calibration_measured_on_another_gpu_is_refused(calibration_dir: Path) -> None:
    sweep = slow_memory_sweep("NVIDIA GeForce RTX 4090", 1e12, 0.5)
    (gpu_folder(calibration_dir) / "calibration.json").write_text(json.dumps(sweep))
    with pytest.raises(ValueError, match=r"calibration .*calibration.json: field 'gpu': measured on 'NVIDIA GeForce"):
        torch_emugpu.timing.profiles.reload()


def test_a_malformed_calibration_names_the_file_and_field(calibration_dir: Path) -> None:
    sweep = slow_memory_sweep(torch.emugpu.get_device_name(), 1e12, 0.5)
    sweep["measurements"][3]["time_s"] = "fast"
    path = gpu_folder(calibration_dir) / "calibration.json"
    path.write_text(json.dumps(sweep))
    with pytest.raises(ValueError, match=r"measurements\[3\]\.time_s"):
        torch_emugpu.timing.profiles.reload()
    path.write_text('{"schema": ')
    with pytest.raises(ValueError, match="calibration.json"):
        torch_emugpu.timing.profiles.reload()


def test_points_of_a_newer_versions_families_are_skipped_with_a_warning(calibration_dir: Path) -> None:
    sweep = slow_memory_sweep(torch.emugpu.get_device_name(), 1e12, 0.5)
    sweep["measurements"].append(
        {
            "family": "ssm_scan",
            "op": "forward",
            "shape": {"L": 4096},
            "dtype": "float32",
            "flags": {},
            "time_s": 1e-4,
            "flops": 1e9,
            "bytes": 1e7,
            "kernels": 1,
        }
    )
    path = gpu_folder(calibration_dir) / "calibration.json"
    path.write_text(json.dumps(sweep))
    with pytest.warns(
        UserWarning,
        match=r"calibration .*calibration.json: 1 point of families or ops this version "
        r"does not know \(ssm_scan\) ignored; the fit uses the other 7",
    ):
        torch_emugpu.timing.profiles.reload()
    assert torch_emugpu.kernel_params()["source"] == f"calibration: {path}"


@pytest.mark.slow
def test_the_shipped_h100_calibration_is_used_unless_switched_off() -> None:
    code = "import torch_emugpu; torch_emugpu.configure(gpu='h100-sxm'); print(torch_emugpu.kernel_params()['source'])"
    on = run_python(code, env={"EMUGPU_PROFILES": "off"})  # profiles off: the calibration still applies
    assert on.returncode == 0, on.stderr[-2000:]
    assert on.stdout.strip().endswith("NVIDIA_H100_80GB_HBM3/calibration.json"), on.stdout
    off = run_python(code, env={"EMUGPU_CALIBRATION": "off"})
    assert off.returncode == 0, off.stderr[-2000:]
    assert off.stdout.strip() == "table: hopper"
    bad = run_python(code, env={"EMUGPU_CALIBRATION": "maybe"})
    assert bad.returncode != 0 and "EMUGPU_CALIBRATION" in bad.stderr


@pytest.mark.slow
def test_ops_before_any_model_are_charged_under_the_calibration(tmp_path: Path) -> None:
    # Configured from the environment by a bare op: no configure(), no module.
    code = (
        "import torch, torch_emugpu; a = torch.ones(64, 64, device='emugpu'); (a @ a).sum(); "
        "print(torch_emugpu._C._current_kernel_params(0)['source'])"
    )
    run = run_python(code, env={"EMUGPU_GPU": "h100-sxm"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().endswith("NVIDIA_H100_80GB_HBM3/calibration.json"), run.stdout
    # A malformed file surfaces at that first op, as the ValueError reload() raises.
    (tmp_path / "NVIDIA_H100_80GB_HBM3").mkdir()
    (tmp_path / "NVIDIA_H100_80GB_HBM3" / "calibration.json").write_text("{")
    code = "import torch\ntry:\n    torch.ones(2, device='emugpu')\nexcept ValueError as e:\n    print('ValueError', e)"
    bad = run_python(code, env={"EMUGPU_GPU": "h100-sxm", "EMUGPU_PROFILE_PATH": str(tmp_path)})
    assert bad.returncode == 0, bad.stderr[-2000:]
    assert bad.stdout.startswith("ValueError") and "calibration.json" in bad.stdout, bad.stdout
