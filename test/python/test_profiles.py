"""Measured profiles drive the emulated clock (issue 3): format, search path,
matching, region calibration, transfer times, import, listing and plotting."""

import json
import os
import warnings
from pathlib import Path

import pytest
import torch
import torchvision
from conftest import REPO, profile_search_dir, run_python, write_synthetic_profile

import torch_emugpu
from torch_emugpu.measure import importers
from torch_emugpu.timing import profiles

REFERENCE = Path(REPO).parent / "shared" / "reference" / "gpemu-profiled-data"
RESNET18_PARAMS = 11689512


def write_profile(
    directory: Path,
    gpu: str = "Tesla T4",
    model: str = "resnet18",
    batches=None,
    parameters: int | None = RESNET18_PARAMS,
    name: str | None = None,
) -> Path:
    batches = batches or [
        {"batch_size": 2, "forward_s": 0.020, "backward_s": 0.040, "transfer_pageable_s": 0.004},
        {"batch_size": 4, "forward_s": 0.030, "backward_s": 0.060, "transfer_pageable_s": 0.008},
    ]
    return write_synthetic_profile(directory, model, batches, parameters, gpu=gpu, name=name)


@pytest.fixture
def profile_dir(tmp_path, monkeypatch):
    """An EMUGPU_PROFILE_PATH directory and an empty user directory; the GPU is a T4."""
    with profile_search_dir(tmp_path, monkeypatch, device_count=1) as directory:
        yield directory


def iteration_s(start_ns: int) -> float:
    """Seconds from the host's `start_ns` (the device idle) to the end of the
    device's work: what a host wait at the iteration's end sees, read on the
    core's clocks, so that a loaded host's latency after the wait (which wall
    time would add) does not count."""
    return (torch_emugpu._C._device_ready_ns(torch.emugpu.current_device()) - start_ns) / 1e9


def train_iterations(model: torch.nn.Module, batch: int, iterations: int, warmup: int = 2) -> float:
    """Median time per iteration of forward + loss + backward + SGD, synchronized (iteration_s)."""
    model = model.to("emugpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.empty(batch, 3, 64, 64, device="emugpu")
    y = torch.zeros(batch, dtype=torch.long, device="emugpu")
    times = []
    for i in range(warmup + iterations):
        torch.emugpu.synchronize()
        t0 = torch_emugpu._C._host_now_ns()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.emugpu.synchronize()
        if i >= warmup:
            times.append(iteration_s(t0))
    return sorted(times)[len(times) // 2]


def test_search_path_puts_the_environment_first_then_user_then_package(profile_dir, tmp_path):
    path = profiles.search_path()
    assert path[0] == profile_dir
    assert path[1] == tmp_path / "xdg" / "torch-emugpu" / "profiles"
    assert path[-1].name == "profiles"


def test_profiles_off_empties_the_search_path_and_bad_values_are_refused(profile_dir, monkeypatch):
    write_profile(profile_dir)
    monkeypatch.setenv("EMUGPU_PROFILES", "off")
    assert profiles.search_path() == []
    assert profiles.reload() == []
    monkeypatch.setenv("EMUGPU_PROFILES", "maybe")
    with pytest.raises(ValueError, match="EMUGPU_PROFILES: expected 'on' or 'off', got 'maybe'"):
        profiles.search_path()
    monkeypatch.setenv("EMUGPU_PROFILES", "on")
    assert any(s["gpu"] == "Tesla T4" and s["model"] == "resnet18" for s in profiles.reload())


def test_earlier_directories_win(profile_dir, tmp_path):
    user = tmp_path / "xdg" / "torch-emugpu" / "profiles"
    user.mkdir(parents=True)
    write_profile(user, batches=[{"batch_size": 2, "forward_s": 1.0, "backward_s": 1.0}])
    write_profile(profile_dir)
    profiles.reload()
    assert profiles.lookup("resnet18", 2)["forward_s"] == 0.020


def test_lookup_interpolates_and_extrapolates(profile_dir):
    write_profile(profile_dir)
    profiles.reload()
    assert profiles.lookup("resnet18", 4)["kind"] == "exact"
    mid = profiles.lookup("resnet18", 3)
    assert mid["kind"] == "interpolated" and mid["forward_s"] == pytest.approx(0.025)
    far = profiles.lookup("resnet18", 8)
    assert far["kind"] == "extrapolated" and far["backward_s"] == pytest.approx(0.100)
    assert profiles.lookup("resnet50", 4) is None
    with pytest.raises(ValueError, match="batch size must be >= 1"):
        profiles.lookup("resnet18", 0)


@pytest.mark.slow
def test_a_matching_model_takes_the_profiled_iteration_time(profile_dir, virtual_clock):
    write_profile(profile_dir)
    profiles.reload()
    measured = train_iterations(torchvision.models.resnet18(), batch=4, iterations=5)
    # Exact on the virtual clock, but for the (modelled) host's time before the forward.
    assert measured == pytest.approx(0.090, rel=0.002)
    report = {r["key"]: r for r in torch_emugpu.region_report()}
    assert report["resnet18@4:forward"]["kind"] == "exact"
    assert report["resnet18@4:forward"]["last_s"] == pytest.approx(0.030, rel=1e-6)
    # Only the first iteration may be host-bound: its host work computes the shape rules.
    assert report["resnet18@4:forward"]["host_bound"] <= 1
    assert report["resnet18@4:backward"]["source"].endswith("resnet18.json")


@pytest.mark.slow
def test_an_unprofiled_batch_size_is_interpolated(profile_dir, virtual_clock):
    write_profile(profile_dir)
    profiles.reload()
    measured = train_iterations(torchvision.models.resnet18(), batch=3, iterations=4)
    rows = [r for r in torch_emugpu.region_report() if "@3:" in r["key"]]
    assert {r["kind"] for r in rows} == {"interpolated"}
    # After the first occurrence, between the points along the cost model's curve (test_batch_curve.py).
    assert {r["target_from"] for r in rows} == {"cost-model curve"}
    assert measured == pytest.approx(sum(r["target_s"] for r in rows), rel=0.002)
    assert 0.060 < measured < 0.090


def test_extrapolation_warns_once(profile_dir):
    write_profile(profile_dir)
    profiles.reload()
    model = torchvision.models.resnet18().to("emugpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            model(torch.empty(6, 3, 32, 32, device="emugpu"))
    messages = [str(w.message) for w in caught if "extrapolating" in str(w.message)]
    assert len(messages) == 1 and "outside the profiled range 2-4" in messages[0]


def test_models_without_a_profile_use_the_cost_model_and_are_reported(profile_dir):
    write_profile(profile_dir)
    profiles.reload()
    m = torch.nn.Sequential(torch.nn.Linear(256, 256)).to("emugpu")
    x = torch.empty(64, 256, device="emugpu")
    for _ in range(2):
        m(x).sum().backward()
        torch.emugpu.synchronize()
    rows = {r["key"]: r for r in torch_emugpu.region_report() if r["source"] == "cost model"}
    key = "Sequential(65792 parameters)@64"
    forward, backward = rows[f"{key}:forward"], rows[f"{key}:backward"]
    # Beside the profiled regions, with their device times; the cost model's times stand, unpadded.
    for r in (forward, backward):
        assert r["target_s"] is None and r["occurrences"] == 2 and r["host_bound"] == 0
        assert r["charged_s"] == pytest.approx(r["estimated_s"]) and r["padded_s"] == 0
        assert 0 < r["estimated_s"] <= r["last_s"]
    assert backward["estimated_s"] > forward["estimated_s"]  # two matmuls against one


@pytest.mark.slow
def test_explicit_names_by_call_and_context_manager(profile_dir, virtual_clock):
    write_profile(profile_dir, model="my_net", parameters=None)
    profiles.reload()
    net = torchvision.models.resnet18()  # parameters do not identify "my_net"
    torch_emugpu.use_profile(net, "my_net")
    # Exact on the virtual clock, but for the (modelled) host's time before the forward.
    assert train_iterations(net, batch=2, iterations=3) == pytest.approx(0.060, rel=0.002)
    other = torchvision.models.resnet18().to("emugpu")
    with torch_emugpu.profiled_as("my_net"):
        other(torch.empty(2, 3, 32, 32, device="emugpu"))
    assert any(r["key"].startswith("my_net@2") for r in torch_emugpu.region_report())
    with pytest.warns(UserWarning, match="no profile for model 'nope'"):
        with torch_emugpu.profiled_as("nope"):
            other(torch.empty(2, 3, 32, 32, device="emugpu"))


def test_a_profile_times_only_the_precision_it_was_measured_in(profile_dir):
    write_profile(profile_dir)  # float32, no autocast
    profiles.reload()
    model = torchvision.models.resnet18().to("emugpu")
    x = torch.empty(4, 3, 64, 64, device="emugpu")
    with pytest.warns(
        UserWarning,
        match=r"measured in float32, but ResNet\(11689512 parameters\) runs under "
        r"bfloat16 autocast; its time comes from the cost model",
    ):
        with torch.autocast("emugpu", dtype=torch.bfloat16):
            model(x)
    assert not any(r["key"].startswith("resnet18@4") for r in torch_emugpu.region_report())
    model(x)  # float32 again: the profile
    assert any(r["key"] == "resnet18@4:forward" for r in torch_emugpu.region_report())


def test_input_copies_take_the_profiled_transfer_time(profile_dir):
    write_profile(profile_dir)
    profiles.reload()
    model = torchvision.models.resnet18().to("emugpu")
    x_host = torch.empty(4, 3, 64, 64)
    model(x_host.to("emugpu"))  # the first forward selects the profile
    torch.emugpu.synchronize()
    torch_emugpu._C._reset_engine_stats(0)
    x_host.to("emugpu")
    assert torch_emugpu._C._engine_stats(0)["h2d"][1] / 1e9 == pytest.approx(0.008, rel=0.01)


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda d: d.pop("model"), "field 'model': missing"),
        (lambda d: d["batches"][0].update(forward_s="fast"), "batches[0].forward_s"),
        (lambda d: d.update(batches=[]), "at least one batch entry"),
        (lambda d: d["batches"].reverse(), "increase strictly"),
        (lambda d: d["batches"][0].update(batch_size=0), "integer >= 1"),
        (lambda d: d["provenance"].pop("torch"), "provenance.torch"),
        (lambda d: d["provenance"].pop("dtype"), "provenance.dtype"),
        (lambda d: d["provenance"].update(amp="yes"), "provenance.amp"),
    ],
)
def test_malformed_profiles_name_the_file_and_field(profile_dir, edit, field):
    path = write_profile(profile_dir)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as e:
        profiles.reload()
    assert str(path) in str(e.value) and field in str(e.value)
    path.unlink()


def test_a_profile_for_an_unknown_gpu_is_rejected(profile_dir):
    path = write_profile(profile_dir, gpu="Voodoo 5 6000")
    with pytest.raises(ValueError) as e:
        profiles.reload()
    assert f"profile {path}: field 'gpu': unknown GPU 'Voodoo 5 6000'" in str(e.value)
    path.unlink()
    write_profile(profile_dir, gpu="Tesla K80")
    profiles.reload()
    with pytest.raises(ValueError, match="no profile for model 'resnet18' on GPU 't4'; available: .*K80/resnet18"):
        profiles.find("t4", "resnet18")


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="GPEmu reference data (../shared/reference) is not present")
@pytest.mark.slow
def test_import_gpemu_reference(tmp_path):
    written = importers.import_gpemu(REFERENCE, tmp_path, progress=False)
    assert len(written) == 4 * 36
    doc = json.loads((tmp_path / "Tesla_V100-PCIE-32GB" / "resnet50.json").read_text())
    assert doc["fingerprint"]["parameters"] == 25557032
    b64 = next(b for b in doc["batches"] if b["batch_size"] == 64)
    assert b64["forward_s"] == pytest.approx(0.061156839, rel=1e-6)
    assert b64["peak_bytes"] > b64["persistent_bytes"] > 0
    assert len(doc["batches"]) == 256


def test_import_of_a_wrong_layout_says_what_it_expected(tmp_path):
    with pytest.raises(ValueError, match=r"expected the directory .*time/compute/forward"):
        importers.import_gpemu(tmp_path, tmp_path / "out", progress=False)


@pytest.mark.slow
def test_import_list_and_show_commands(tmp_path):
    src = tmp_path / "profiled_data"
    for kind in ("forward", "backward"):
        d = src / "time" / "compute" / kind / "Tesla_T4" / "resnet18"
        d.mkdir(parents=True)
        (d / "time_by_batch_size.csv").write_text("Batch_Size,Time_In_SECONDS\n1.0,0.01\n2.0,0.015\n")
    out = tmp_path / "imported"
    env = {"EMUGPU_PROFILE_PATH": str(out), "XDG_DATA_HOME": str(tmp_path / "xdg")}
    exe = os.path.join(os.path.dirname(os.sys.executable), "torch-emugpu")
    code = (
        f"import subprocess, sys; exe = {exe!r}\n"
        f"for args in (['import', 'gpemu', {str(tmp_path)!r}, '--out', {str(out)!r}, '--no-progress'],"
        f" ['profiles'], ['show', 't4', 'resnet18', '--plot', {str(tmp_path / 'p.png')!r}]):\n"
        "    r = subprocess.run([exe, *args], capture_output=True, text=True); print(r.returncode, r.stdout)"
    )
    r = run_python(code, env=env)
    assert r.returncode == 0, r.stderr
    assert "0 wrote 1 profiles" in r.stdout
    assert "Tesla T4" in r.stdout and "1-2 (2)" in r.stdout
    assert "resnet18 on Tesla T4" in r.stdout and "10.00" in r.stdout
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_loop_that_waits_with_item_takes_the_profiled_time(profile_dir, virtual_clock):
    write_profile(profile_dir)
    profiles.reload()
    model = torchvision.models.resnet18().to("emugpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.empty(4, 3, 64, 64, device="emugpu")
    y = torch.zeros(4, dtype=torch.long, device="emugpu")
    times = []
    for _ in range(5):
        t0 = torch_emugpu._C._host_now_ns()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()  # the loop's only wait: the backward+update region ends here
        times.append(iteration_s(t0))
    assert sorted(times[2:])[1] == pytest.approx(0.090, rel=0.002)


@pytest.mark.slow
def test_the_first_use_reads_the_environments_profiles_without_configure_or_reload(tmp_path):
    # The core reads the search path when it configures itself from the environment: no Python runs there.
    (tmp_path / "env").mkdir()
    path = write_profile(tmp_path / "env")
    code = (
        "import torch, torchvision, torch_emugpu\n"
        "model = torchvision.models.resnet18().to('emugpu')\n"
        "model(torch.empty(2, 3, 32, 32, device='emugpu'))\n"
        "torch.emugpu.synchronize()\n"
        "print(sorted({r['source'] for r in torch_emugpu.region_report()}))"
    )
    env = {"EMUGPU_GPU": "t4", "EMUGPU_PROFILE_PATH": str(tmp_path / "env"), "XDG_DATA_HOME": str(tmp_path / "xdg")}
    run = run_python(code, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == f"[{str(path)!r}]", run.stdout


@pytest.mark.slow
def test_a_configure_after_import_follows_a_search_path_set_after_import(tmp_path):
    (tmp_path / "env").mkdir()
    write_profile(tmp_path / "env")
    code = (
        "import os, torch, torchvision, torch_emugpu\n"
        f"os.environ['EMUGPU_PROFILE_PATH'] = {str(tmp_path / 'env')!r}\n"
        "torch_emugpu.configure(gpu='t4')\n"
        "model = torchvision.models.resnet18().to('emugpu')\n"
        "model(torch.empty(2, 3, 32, 32, device='emugpu'))\n"
        "torch.emugpu.synchronize()\n"
        "print(sorted({r['source'] for r in torch_emugpu.region_report()}))"
    )
    run = run_python(code, env={"XDG_DATA_HOME": str(tmp_path / "xdg")})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "resnet18.json" in run.stdout and "cost model" not in run.stdout, run.stdout
