"""Batch sizes between and beyond a profile's points follow the cost model's
curve (issue 28, part 2), and region_report() says how each target was made."""

import pytest
import torch
import torchvision
from conftest import profile_search_dir
from test_profiles import iteration_s, write_profile

import torch_emugpu
from torch_emugpu.timing import profiles


@pytest.fixture
def profile_dir(tmp_path, monkeypatch):
    with profile_search_dir(tmp_path, monkeypatch, device_count=1) as directory:
        yield directory


def train(model: torch.nn.Module, batch: int, iterations: int) -> list[float]:
    """Per iteration, forward + loss + backward + SGD, synchronized: its device time (seconds)."""
    model = model.to("emugpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.empty(batch, 3, 32, 32, device="emugpu")
    y = torch.zeros(batch, dtype=torch.long, device="emugpu")
    times = []
    for _ in range(iterations):
        torch.emugpu.synchronize()
        t0 = torch_emugpu._C._host_now_ns()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        torch.emugpu.synchronize()
        times.append(iteration_s(t0))
    return times


def rows(batch: int) -> dict[str, dict]:
    return {r["key"].rsplit(":", 1)[1]: r for r in torch_emugpu.region_report() if f"@{batch}:" in r["key"]}


def test_the_first_occurrence_takes_the_straight_line_then_the_cost_models_curve(profile_dir, virtual_clock):
    write_profile(profile_dir)  # forward 20 ms at batch 2, 30 ms at 4; backward 40 and 60 ms
    profiles.reload()
    model = torchvision.models.resnet18()
    train(model, batch=3, iterations=1)
    first = rows(3)
    for kind, straight in (("forward", 0.025), ("backward", 0.050)):
        assert first[kind]["target_from"] == "straight line" and first[kind]["between"] == [2, 4]
        assert first[kind]["target_s"] == pytest.approx(straight)
    times = train(model, batch=3, iterations=3)
    later = rows(3)
    for kind, (lo, hi) in (("forward", (0.020, 0.030)), ("backward", (0.040, 0.060))):
        r = later[kind]
        assert r["target_from"] == "cost-model curve" and r["between"] == [2, 4]
        assert r["kind"] == "interpolated" and r["cost_model_s"] > 0
        assert lo < r["target_s"] < hi
    # The loop takes the bent targets (virtual clock: exact but for the modelled host before the forward).
    assert times[-1] == pytest.approx(later["forward"]["target_s"] + later["backward"]["target_s"], rel=0.002)


def test_a_profiled_batch_size_is_its_point_and_is_never_bent(profile_dir, virtual_clock):
    write_profile(profile_dir)
    profiles.reload()
    train(torchvision.models.resnet18(), batch=4, iterations=3)
    for r in rows(4).values():
        assert r["target_from"] == "profile point" and r["between"] == [4, 4]
    assert rows(4)["forward"]["target_s"] == pytest.approx(0.030)


def test_beyond_the_table_the_nearest_points_curve_continues(profile_dir, virtual_clock):
    write_profile(profile_dir)
    profiles.reload()
    with pytest.warns(UserWarning, match="extrapolating along the cost model's curve"):
        train(torchvision.models.resnet18(), batch=8, iterations=3)
    r = rows(8)["forward"]
    assert r["kind"] == "extrapolated" and r["target_from"] == "cost-model curve" and r["between"] == [2, 4]
    assert r["target_s"] > 0.030  # more work than the largest profiled batch


def test_a_model_without_a_profile_says_its_target_is_the_cost_model(profile_dir):
    write_profile(profile_dir)
    profiles.reload()
    m = torch.nn.Linear(64, 64).to("emugpu")
    for _ in range(2):
        m(torch.empty(8, 64, device="emugpu")).sum().backward()
    torch.emugpu.synchronize()
    assert {r["target_from"] for r in torch_emugpu.region_report() if r["source"] == "cost model"} == {"cost model"}
