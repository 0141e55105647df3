"""emugpu's generators keep CUDA's Philox state: a seed and an offset,
16 bytes in get_rng_state, offsets that random kernels advance as CUDA's
do on the emulated GPU. DTensor's random ops and checkpointed RNG states
rely on exactly this; values come from the host, a function of the state."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import torch_emugpu

# The default GPU (A100 SXM4: 108 SMs of 2048 threads) holds 864 blocks of
# 256 threads: one kernel covers 864 * 256 * 4 float32 values per Philox step.
ONE_STEP = 864 * 256 * 4


def _state(device: int = 0) -> tuple[int, int]:
    s = torch.emugpu.get_rng_state(device)
    assert s.dtype == torch.uint8 and s.device.type == "cpu"
    return int(s[:8].view(torch.int64)), int(s[8:].view(torch.int64))


@pytest.fixture
def compute_mode():
    torch_emugpu.configure(mode="compute")


def test_state_is_cudas_sixteen_bytes_of_seed_and_offset():
    torch.emugpu.manual_seed(1234)
    assert torch.emugpu.get_rng_state().numel() == 16
    assert _state() == (1234, 0)
    assert torch.emugpu.initial_seed() == 1234
    torch.empty(8, device="emugpu").normal_()
    assert _state() == (1234, 4)


@pytest.mark.parametrize(
    ("numel", "dtype", "advance"),
    [
        (1, torch.float32, 4),
        (ONE_STEP, torch.float32, 4),
        (ONE_STEP + 1, torch.float32, 8),  # a second grid-stride iteration
        (ONE_STEP, torch.float64, 8),  # two doubles per Philox draw, not four
        (0, torch.float32, 0),
    ],
)
def test_offsets_advance_per_kernel_as_cudas(numel, dtype, advance):
    torch.emugpu.manual_seed(0)
    torch.empty(numel, dtype=dtype, device="emugpu").uniform_()
    assert _state()[1] == advance


def test_dropout_and_factory_ops_draw_from_the_device_generator():
    torch.emugpu.manual_seed(0)
    torch.rand(16, device="emugpu")
    torch.randint(0, 5, (16,), device="emugpu")
    torch.nn.functional.dropout(torch.ones(16, device="emugpu"), 0.5, training=True)
    assert _state()[1] == 12
    torch.nn.functional.dropout(torch.ones(16, device="emugpu"), 0.5, training=False)  # eval: no draw
    assert _state()[1] == 12


def test_each_device_and_each_generator_keeps_its_own_state():
    torch.emugpu.manual_seed_all(5)
    torch.rand(4, device="emugpu:1")
    assert _state(0) == (5, 0) and _state(1) == (5, 4)
    g = torch.Generator(device="emugpu").manual_seed(9)
    torch.rand(4, device="emugpu", generator=g)
    assert g.get_state().numel() == 16 and g.get_offset() == 4 and g.initial_seed() == 9
    assert _state(0) == (5, 0)


def test_set_rng_state_restores_seed_and_offset():
    torch.emugpu.manual_seed(3)
    saved = torch.emugpu.get_rng_state()
    torch.rand(4, device="emugpu")
    torch.emugpu.set_rng_state(saved)
    assert _state() == (3, 0)
    seed_only = saved[:8].clone()  # CUDA's other layout: a seed, offset 0
    torch.emugpu.set_rng_state(seed_only)
    assert _state() == (3, 0)


def test_bad_states_are_refused_as_cudas_are():
    with pytest.raises(RuntimeError, match="wrong size.*got 5056"):
        torch.emugpu.set_rng_state(torch.get_rng_state())  # a CPU generator's state
    bad = torch.emugpu.get_rng_state()
    bad[8:] = torch.tensor([6], dtype=torch.int64).view(torch.uint8)
    with pytest.raises(RuntimeError, match="multiple of 4"):
        torch.emugpu.set_rng_state(bad)
    with pytest.raises(TypeError, match="ByteTensor"):
        torch.emugpu.set_rng_state(torch.zeros(16))
    with pytest.raises(RuntimeError, match="Expected a 'emugpu' device type for generator"):
        torch.rand(4, device="emugpu", generator=torch.Generator())


def test_same_state_same_values_in_compute_mode(compute_mode):
    torch.emugpu.manual_seed(11)
    a = torch.randn(64, device="emugpu").cpu()
    b = torch.randn(64, device="emugpu").cpu()
    assert not torch.equal(a, b)  # the offset moved on
    torch.emugpu.manual_seed(11)
    assert torch.equal(torch.randn(64, device="emugpu").cpu(), a)
    torch.manual_seed(11)  # seeds the CPU too, which emugpu's values do not come from
    torch.randn(3)
    torch.emugpu.manual_seed(11)
    assert torch.equal(torch.randn(64, device="emugpu").cpu(), a)


def test_fork_rng_and_rng_state_all_replay_values(compute_mode):
    torch.emugpu.manual_seed_all(2)
    states = torch.emugpu.get_rng_state_all()
    with torch.random.fork_rng(devices=[0], device_type="emugpu"):
        inside = torch.rand(8, device="emugpu").cpu()
    assert _state() == (2, 0)  # restored
    torch.rand(8, device="emugpu:1")
    torch.emugpu.set_rng_state_all(states)
    assert _state(1) == (2, 0)
    assert torch.equal(torch.rand(8, device="emugpu").cpu(), inside)


def test_activation_checkpointing_replays_dropout(compute_mode):
    """torch.utils.checkpoint saves the device's RNG state and restores it for the recomputation: the
    gradient through a checkpointed dropout equals the one without checkpointing."""
    x = torch.randn(32, 16).to("emugpu").requires_grad_()
    lin = torch.nn.Linear(16, 16).to("emugpu")

    def block(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(lin(t), 0.5, training=True).sum(dim=1)

    torch.emugpu.manual_seed(4)
    plain = torch.autograd.grad(block(x).sum(), x)[0].cpu()
    torch.emugpu.manual_seed(4)
    ckpt = torch.autograd.grad(checkpoint(block, x, use_reentrant=False).sum(), x)[0].cpu()
    assert torch.equal(plain, ckpt)


def test_graphsafe_states_share_one_state():
    g = torch.Generator(device="emugpu").manual_seed(1)
    shared = g.graphsafe_get_state()
    torch.rand(4, device="emugpu", generator=g)
    assert shared.get_offset() == 4  # the same state, not a copy
    h = torch.Generator(device="emugpu")
    h.graphsafe_set_state(shared)
    assert h.initial_seed() == 1 and h.get_offset() == 4


# --- DTensor's random ops over 2 ranks -----------------------------------------


def _dtensor_random(rank: int, world: int) -> dict[str, object]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("emugpu", (world,))
    torch.manual_seed(7)
    sharded = distribute_tensor(torch.zeros(8, 4).to("emugpu"), mesh, [Shard(0)])
    torch.nn.init.uniform_(sharded)  # DTensor's OffsetBasedRNGTracker: each shard from its own offset
    replicated = distribute_tensor(torch.zeros(8, 4).to("emugpu"), mesh, [Replicate()])
    torch.nn.init.uniform_(replicated)  # every rank from the same offset
    return {
        "sharded": sharded.to_local().cpu().tolist(),
        "replicated": replicated.to_local().cpu().tolist(),
        "state": _state(rank),
    }


@pytest.mark.slow
def test_dtensor_random_ops_shard_and_replicate_as_on_cuda():
    from distributed_ranks import run_ranks

    out = run_ranks(_dtensor_random, world=2, mode="compute", timeout=60)
    assert out[0]["sharded"] != out[1]["sharded"]  # different pieces of one random tensor
    assert out[0]["replicated"] == out[1]["replicated"]
    assert out[0]["state"] == out[1]["state"] == (7, 64)  # each op moved every rank past its 32 values


def test_seeding_creates_no_device_context():
    """torch.manual_seed seeds every emulated GPU without creating a context, as torch.cuda defers it:
    init_device_mesh, called later, moves each rank to its LOCAL_RANK's device only while none exists."""
    from conftest import run_python

    r = run_python(
        "import torch, torch_emugpu\n"
        "torch.manual_seed(3); torch.emugpu.seed_all(); torch.emugpu.manual_seed(4)\n"
        "print('before', torch.emugpu.is_initialized())\n"
        "print('state', torch.emugpu.get_rng_state(1)[:8].view(torch.int64).item(), torch.emugpu.is_initialized())\n",
        env={"EMUGPU_DEVICE_COUNT": "2"},
    )
    assert r.returncode == 0, r.stderr
    assert "before False" in r.stdout and "state" in r.stdout and r.stdout.strip().endswith("True"), r.stdout
