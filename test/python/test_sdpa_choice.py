"""scaled_dot_product_attention on emugpu runs the kernel CUDA would run on
the emulated GPU (flash, memory-efficient, math, cuDNN), honouring
torch.nn.attention.sdpa_kernel; so DTensor's sharding rules for those ops
apply to tensor-parallel attention (tested over 2 ranks)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from distributed_ranks import run_ranks
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

import torch_emugpu

FLASH = "aten._scaled_dot_product_flash_attention.default"
EFFICIENT = "aten._scaled_dot_product_efficient_attention.default"
CUDNN = "aten._scaled_dot_product_cudnn_attention.default"


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def _ran(dtype: torch.dtype = torch.float16, mask: bool = False, head_dim: int = 64, **kw: object) -> set[str]:
    q, k, v = (torch.empty(2, 4, 128, head_dim, dtype=dtype, device="emugpu") for _ in range(3))
    attn_mask = torch.empty(128, 128, dtype=torch.bool, device="emugpu") if mask else None
    with _Ops() as ops:
        F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kw)  # type: ignore[arg-type]
    return set(ops.names)


@pytest.fixture
def gpu():
    def configure(name: str) -> None:
        torch_emugpu.configure(gpu=name, device_count=2, mode="timing")

    yield configure
    torch_emugpu.configure(gpu=torch_emugpu._C.DEFAULT_GPU, device_count=2, mode="timing")


def test_cudas_default_order_on_an_h100(gpu):
    gpu("h100")
    assert FLASH in _ran(torch.float16) and FLASH in _ran(torch.bfloat16, is_causal=True)
    assert EFFICIENT in _ran(torch.float32)  # flash takes 16-bit inputs only
    assert EFFICIENT in _ran(torch.float16, mask=True)  # nor a mask
    assert EFFICIENT in _ran(torch.float16, head_dim=512)  # nor head dims above 256


def test_older_gpus_lose_flash_attention(gpu):
    gpu("t4")  # sm75
    assert EFFICIENT in _ran(torch.float16)
    gpu("v100")
    assert EFFICIENT in _ran(torch.float16)


def test_sdpa_kernel_is_honoured(gpu):
    gpu("h100")
    with sdpa_kernel(SDPBackend.MATH):
        ran = _ran(torch.float16)
        assert not ran & {FLASH, EFFICIENT, CUDNN} and "aten.bmm.default" in ran  # the math path's matmuls
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        assert EFFICIENT in _ran(torch.float16)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        assert CUDNN in _ran(torch.bfloat16)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION], set_priority=True):
        assert EFFICIENT in _ran(torch.float16)  # first in the given order


def test_no_enabled_kernel_raises_as_on_cuda(gpu):
    gpu("h100")
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), pytest.raises(RuntimeError, match="No available kernel.*FLASH"):
        _ran(torch.float32)


def test_flash_attention_forward_and_backward_run_and_take_time(gpu):
    gpu("h100")
    q, k, v = (torch.empty(2, 8, 256, 64, dtype=torch.bfloat16, device="emugpu", requires_grad=True) for _ in range(3))
    with _Ops() as ops:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1)
        out.sum().backward()
    assert FLASH in ops.names and "aten._scaled_dot_product_flash_attention_backward.default" in ops.names
    assert q.grad is not None and q.grad.shape == q.shape
    assert torch.emugpu.get_rng_state()[8:].view(torch.int64).item() >= 2 * 8 * 32  # dropout drew B*H*32


def test_compute_mode_values_match_the_cpu():
    torch_emugpu.configure(mode="compute")
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    out = F.scaled_dot_product_attention(q.to("emugpu"), k.to("emugpu"), v.to("emugpu"), is_causal=True)
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v, is_causal=True))


# --- tensor-parallel attention over 2 ranks -----------------------------------


def _tp_attention(rank: int, world: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, object]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("emugpu", (world,))
    torch.manual_seed(0)
    full = [torch.randn(2, 4, 32, 16, dtype=dtype) for _ in range(3)]
    q, k, v = (distribute_tensor(t.to("emugpu").requires_grad_(), mesh, [Shard(1)]) for t in full)  # heads split
    # Compute mode runs the math path, whose causal mask is a plain tensor DTensor refuses (as on CUDA, where
    # math is not chosen for these inputs): it is tested without the mask.
    causal = torch_emugpu.config().mode == "timing"
    with _Ops() as ops:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out.sum().backward()
    result: dict[str, object] = {
        "placements": [str(p) for p in out.placements],
        "ops": sorted({n for n in ops.names if "scaled_dot_product" in n}),
        "grad_placements": [str(p) for p in q.grad.placements],  # type: ignore[union-attr]
    }
    if torch_emugpu.config().mode == "compute":
        ref = F.scaled_dot_product_attention(*[t.float() for t in full])
        result["max_error"] = (out.full_tensor().float().cpu() - ref).abs().max().item()

    class Attention(torch.nn.Module):  # the shape of the official examples' attention block
        def __init__(self) -> None:
            super().__init__()
            self.wq, self.wk, self.wv = (torch.nn.Linear(64, 64, bias=False) for _ in range(3))
            self.wo = torch.nn.Linear(64, 64, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = (w(x).view(b, s, -1, 16).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1)
            return self.wo(y.transpose(1, 2).reshape(b, s, -1))

    block = Attention().to("emugpu", dtype)
    plan = {"wq": ColwiseParallel(), "wk": ColwiseParallel(), "wv": ColwiseParallel(), "wo": RowwiseParallel()}
    parallelize_module(block, mesh, plan)
    x = torch.randn(2, 32, 64, dtype=dtype).to("emugpu")
    block(x).sum().backward()
    result["block_grad"] = list(block.wq.weight.grad.to_local().shape)  # type: ignore[union-attr]
    torch.emugpu.synchronize()
    return result


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["timing", "compute"])
def test_tensor_parallel_attention_on_two_ranks(mode: str):
    out = run_ranks(_tp_attention, world=2, mode=mode, timeout=60, env={"EMUGPU_GPU": "h100"})
    for rank in (0, 1):
        r = out[rank]
        assert r["placements"] == ["S(1)"] and r["grad_placements"] == ["S(1)"], r
        assert r["block_grad"] == [32, 64], r  # each rank holds half of wq's rows
        if mode == "timing":  # CUDA's kernel, sharded by DTensor's rule for it
            assert FLASH.replace(".default", "") in " ".join(r["ops"]), r
        else:  # compute mode: the math path, whose values DTensor's decomposition gives
            assert r["max_error"] < 0.05, r
