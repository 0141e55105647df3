"""A profiled iteration takes its profiled time whatever the loop's shape
(issue 6, part 1): with and without per-iteration syncs, timed with events,
gradient accumulation, evaluation forwards, two models in one loop, several
models one after another, every host sync point, and exceptions inside a
region. Times are read on the emulated timeline: events where the loop has
no sync of its own, else the device's end as the host's wait sees it."""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest
import torch
import torchvision
from test_profiles import RESNET18_PARAMS, iteration_s, profile_dir, write_profile  # noqa: F401

import torch_emugpu
from torch_emugpu.timing import profiles

FWD, BWD = 0.030, 0.060  # resnet18 at batch 4 in write_profile's table


def setup_resnet(profile_dir, batch: int = 4):  # noqa: F811
    write_profile(profile_dir)
    profiles.reload()
    model = torchvision.models.resnet18().to("emugpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.empty(batch, 3, 32, 32, device="emugpu")
    y = torch.zeros(batch, dtype=torch.long, device="emugpu")
    return model, opt, x, y


def step(model, opt, x, y) -> torch.Tensor:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def event_ms(fn) -> float:
    """Emulated milliseconds of `fn`, measured from a busy device: an event on
    an idle device marks the host's "now", and the first op would start when
    the host gets to it (host latency, as on a real GPU, is not what these
    tests are about)."""
    start, end = torch.emugpu.Event(enable_timing=True), torch.emugpu.Event(enable_timing=True)
    torch_emugpu._C._emulate_kernel(torch.emugpu.current_device(), 0.005)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


@pytest.mark.slow
def test_events_without_any_sync_see_the_profiled_time_from_the_second_iteration(profile_dir):  # noqa: F811
    model, opt, x, y = setup_resnet(profile_dir)
    step(model, opt, x, y)  # warm-up without synchronizing (its host work may be slow: Meta kernels run)
    model(x)  # closes the warm-up's backward region
    warm = {r["key"]: r["host_bound"] for r in torch_emugpu.region_report() if "host_bound" in r}
    times = []
    for _ in range(6):
        start, end = torch.emugpu.Event(enable_timing=True), torch.emugpu.Event(enable_timing=True)
        start.record()
        step(model, opt, x, y)
        end.record()
        times.append((start, end))
    torch.emugpu.synchronize()
    after = {r["key"]: r["host_bound"] for r in torch_emugpu.region_report() if "host_bound" in r}
    host_bound = sum(after.values()) - sum(warm.values())
    off = [
        start.elapsed_time(end)
        for start, end in times
        if start.elapsed_time(end) != pytest.approx((FWD + BWD) * 1e3, rel=1e-4)
    ]
    # Exact unless the host stalled past a region's end, and then reported as host-bound.
    assert len(off) <= host_bound <= 1, (off, after)


@pytest.mark.parametrize("sync", ["synchronize", "item", "cpu", "tolist", "event"])
@pytest.mark.slow
def test_every_host_wait_ends_the_iteration_at_its_profiled_time(profile_dir, virtual_clock, sync):  # noqa: F811
    model, opt, x, y = setup_resnet(profile_dir)

    def wait(loss: torch.Tensor) -> None:
        if sync == "synchronize":
            torch.emugpu.synchronize()
        elif sync == "item":
            loss.item()
        elif sync == "cpu":
            loss.cpu()
        elif sync == "tolist":
            loss.tolist()
        else:
            e = torch.emugpu.Event()
            e.record()
            e.synchronize()

    for _ in range(2):
        wait(step(model, opt, x, y))
    times = []
    for _ in range(5):
        t0 = torch_emugpu._C._host_now_ns()
        wait(step(model, opt, x, y))
        times.append(iteration_s(t0))
    # The host's own (modelled) latency before the forward adds a little; nothing else does.
    assert sorted(times)[2] == pytest.approx(FWD + BWD, rel=0.002)


@pytest.mark.slow
def test_gradient_accumulation_charges_every_micro_batch(profile_dir):  # noqa: F811
    model, opt, x, y = setup_resnet(profile_dir)

    def accumulated_step() -> None:
        opt.zero_grad()
        for _ in range(3):
            torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    accumulated_step()
    assert event_ms(accumulated_step) == pytest.approx(3 * (FWD + BWD) * 1e3, rel=1e-4)


def test_evaluation_forwards_take_the_forward_time_and_open_no_backward(profile_dir):  # noqa: F811
    model, opt, x, y = setup_resnet(profile_dir)
    step(model, opt, x, y)

    def evaluate() -> None:
        with torch.no_grad():
            model(x)

    evaluate()
    assert event_ms(evaluate) == pytest.approx(FWD * 1e3, rel=1e-4)
    assert event_ms(lambda: step(model, opt, x, y)) == pytest.approx((FWD + BWD) * 1e3, rel=1e-4)
    assert event_ms(evaluate) == pytest.approx(FWD * 1e3, rel=1e-4)


class Generator(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(16, 3 * 32 * 32)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z).view(-1, 3, 32, 32)


@pytest.mark.slow
def test_two_models_in_one_loop_each_take_their_profiled_times(profile_dir):  # noqa: F811
    gen_params = 16 * 3 * 32 * 32 + 3 * 32 * 32
    write_profile(
        profile_dir,
        model="generator",
        parameters=gen_params,
        batches=[{"batch_size": 4, "forward_s": 0.010, "backward_s": 0.020}],
    )
    _, _, x, _ = setup_resnet(profile_dir)
    g, d = Generator().to("emugpu"), torchvision.models.resnet18(num_classes=1).to("emugpu")
    d = torchvision.models.resnet18().to("emugpu")  # the profiled discriminator (its fingerprint)
    opt_g, opt_d = torch.optim.Adam(g.parameters()), torch.optim.Adam(d.parameters())
    z = torch.empty(4, 16, device="emugpu")

    def gan_step() -> None:
        fake = g(z)
        loss_d = d(x).mean() - d(fake.detach()).mean()
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        loss_g = -d(fake).mean()
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()

    gan_step()
    # G forward, three D forwards, D's backward twice (its own step, and on
    # the way back to G), G's backward and step. The mean of D's first output
    # runs in a backward region that is cancelled (D runs again before any
    # backward) and keeps its cost-model time: a few microseconds.
    expected = 0.010 + 3 * FWD + 2 * BWD + 0.020
    assert event_ms(gan_step) == pytest.approx(expected * 1e3, rel=1e-3)


@pytest.mark.slow
def test_several_models_one_after_another_each_take_their_times(profile_dir):  # noqa: F811
    write_profile(
        profile_dir,
        model="resnet34",
        parameters=21797672,
        name="resnet34.json",
        batches=[{"batch_size": 4, "forward_s": 0.050, "backward_s": 0.080}],
    )
    model, opt, x, y = setup_resnet(profile_dir)
    other = torchvision.models.resnet34().to("emugpu")
    opt2 = torch.optim.SGD(other.parameters(), lr=0.1)
    step(model, opt, x, y)
    assert event_ms(lambda: step(model, opt, x, y)) == pytest.approx((FWD + BWD) * 1e3, rel=1e-4)
    step(other, opt2, x, y)
    assert event_ms(lambda: step(other, opt2, x, y)) == pytest.approx(130, rel=1e-4)
    assert event_ms(lambda: step(model, opt, x, y)) == pytest.approx((FWD + BWD) * 1e3, rel=1e-4)


def test_an_exception_inside_a_forward_closes_its_region(profile_dir):  # noqa: F811
    model, opt, x, y = setup_resnet(profile_dir)

    def fail(*_):
        raise torch.OutOfMemoryError("emulated failure inside the forward")

    handle = model.layer2.register_forward_hook(fail)
    with pytest.raises(torch.OutOfMemoryError):
        model(x)
    handle.remove()
    report = {r["key"]: r for r in torch_emugpu.region_report()}
    assert report["resnet18@4:forward"]["aborted"] == 1
    # A retry (what batch-size finders do) takes the profiled time, not a pad left over.
    x2 = torch.empty(2, 3, 32, 32, device="emugpu")
    y2 = torch.zeros(2, dtype=torch.long, device="emugpu")
    step(model, opt, x2, y2)
    assert event_ms(lambda: step(model, opt, x2, y2)) == pytest.approx(60, rel=1e-4)
    # and the failed module is not kept alive by the planner
    ref = weakref.ref(model)
    model = opt = handle = None
    gc.collect()
    assert ref() is None


def test_module_calls_inside_a_root_forward_take_pytorchs_fast_path(profile_dir):  # noqa: F811
    import torch.nn.modules.module as nn_module

    model, opt, x, y = setup_resnet(profile_dir)
    seen = []
    # An instance hook on a submodule sees what every other module call inside the forward sees.
    handle = model.layer2.register_forward_pre_hook(
        lambda *_: seen.append((len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks)))
    )
    step(model, opt, x, y)
    handle.remove()
    assert seen == [(0, 0)]  # no global hook while the root runs
    assert len(nn_module._global_forward_pre_hooks) == 1  # discovery is back for the next root
    assert not model._forward_hooks and not model._forward_pre_hooks  # the root keeps none of ours
    assert event_ms(lambda: step(model, opt, x, y)) == pytest.approx((FWD + BWD) * 1e3, rel=1e-4)


def test_a_forward_interrupted_by_keyboard_interrupt_is_aborted_at_the_roots_next_call(profile_dir):  # noqa: F811
    import torch.nn.modules.module as nn_module

    model, opt, x, y = setup_resnet(profile_dir)

    def interrupt(*_):
        raise KeyboardInterrupt  # not an Exception: nn.Module runs no always-call hook for it

    handle = model.layer2.register_forward_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        model(x)
    handle.remove()
    assert len(nn_module._global_forward_pre_hooks) == 0  # its forward never returned
    step(model, opt, x, y)  # the root's own hook finds its stale forward
    report = {r["key"]: r for r in torch_emugpu.region_report()}
    assert report["resnet18@4:forward"]["aborted"] == 1
    assert len(nn_module._global_forward_pre_hooks) == 1
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert event_ms(lambda: step(model, opt, x, y)) == pytest.approx((FWD + BWD) * 1e3, rel=1e-4)


def test_a_host_slower_than_the_profile_is_reported_and_warned_once(profile_dir):  # noqa: F811
    write_profile(profile_dir, batches=[{"batch_size": 4, "forward_s": 1e-5, "backward_s": 1e-5}])
    profiles.reload()
    model = torchvision.models.resnet18().to("emugpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.empty(4, 3, 32, 32, device="emugpu")
    y = torch.zeros(4, dtype=torch.long, device="emugpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            step(model, opt, x, y)
    assert sum("host-bound" in str(w.message) for w in caught) == 1
    report = {r["key"]: r for r in torch_emugpu.region_report()}
    assert report["resnet18@4:forward"]["host_bound"] >= 2


def test_models_without_a_profile_are_announced_once(profile_dir):  # noqa: F811
    write_profile(profile_dir)  # some profile exists, but none for this model
    profiles.reload()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8)).to("emugpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            model(torch.empty(4, 8, device="emugpu"))
    messages = [str(w.message) for w in caught if "cost model" in str(w.message)]
    assert len(messages) == 1 and "Sequential" in messages[0]
    assert caught[0].filename == __file__  # points at the user's line


@pytest.mark.slow
def test_without_any_profile_one_notice_says_times_come_from_the_cost_model(tmp_path):
    from conftest import run_python

    r = run_python(
        "import torch, warnings\n"
        "warnings.simplefilter('always')\n"
        "m = torch.nn.Linear(4, 4).to('emugpu')\n"
        "for _ in range(3):\n"
        "    m(torch.empty(2, 4, device='emugpu'))\n"
        "print('hooks left', len(torch.nn.modules.module._global_forward_pre_hooks))",
        env={"EMUGPU_PROFILES": "off", "XDG_DATA_HOME": str(tmp_path)},
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("comes from the per-op cost model") == 1
    assert "hooks left 0" in r.stdout  # module calls are back on PyTorch's fast path


def test_a_module_that_cannot_list_its_parameters_runs_and_its_local_parts_are_timed():
    # torch.distributed.rpc's RemoteModule raises from named_modules(); a model holding one (pytorch/examples'
    # rpc/ddp_rpc) must run as natively, its local layers timed.
    class Remote(torch.nn.Module):
        def named_modules(self, *args, **kwargs):
            raise ValueError("Method named_modules not supported for RemoteModule")

    class Hybrid(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.remote = Remote()
            self.fc = torch.nn.Linear(16, 4).to("emugpu")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    model = Hybrid()
    with pytest.raises(ValueError):
        list(model.parameters())
    torch_emugpu.reset_cost_report()
    y = model(torch.randn(8, 16, device="emugpu"))
    y.sum().backward()
    torch.emugpu.synchronize()
    assert y.shape == (8, 4) and model.fc.weight.grad is not None
    assert sum(r["ops"] for r in torch_emugpu.cost_report(reset=True)) > 0
