"""nn.SyncBatchNorm on emugpu ranks: its five CUDA-only batch-norm kernels
(statistics, their combination over ranks, normalisation, the two backward
passes) have shapes in timing mode and CUDA's values in compute mode."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from distributed_ranks import run_ranks

import torch_emugpu

pytestmark = pytest.mark.slow  # spawned ranks


def _against_one_batch_norm(rank: int, world: int) -> dict:
    torch.manual_seed(0)
    x = torch.randn(8, 3, 5, 5, dtype=torch.double)
    dy = torch.randn_like(x)
    reference = torch.nn.BatchNorm2d(3).double()
    with torch.no_grad():
        reference.weight.uniform_(0.5, 1.5)
        reference.bias.uniform_(-0.5, 0.5)
    sync = torch.nn.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(copy.deepcopy(reference))).to(
        f"emugpu:{rank}"
    )
    rows = slice(rank * 4, rank * 4 + 4)
    xr = x.detach().clone().requires_grad_()
    yr = reference(xr)
    yr.backward(dy)
    xe = x[rows].to(f"emugpu:{rank}").requires_grad_()
    ye = sync(xe)
    ye.backward(dy[rows].to(f"emugpu:{rank}"))
    bn = sync[0]
    grads = torch.stack([bn.weight.grad.cpu(), bn.bias.grad.cpu()])
    dist.all_reduce(g := grads.to(f"emugpu:{rank}"))  # DDP would sum them
    return {
        "grad_input": torch.allclose(xe.grad.cpu(), xr.grad[rows]),
        "weight_bias_grads": torch.allclose(g.cpu(), torch.stack([reference.weight.grad, reference.bias.grad])),
        "running": torch.allclose(bn.running_mean.cpu(), reference.running_mean)
        and torch.allclose(bn.running_var.cpu(), reference.running_var),
        "output": torch.allclose(ye.detach().cpu(), yr.detach()[rows]),
    }


def test_sync_batch_norm_over_two_ranks_equals_one_batch_norm_of_the_whole_batch():
    out = run_ranks(_against_one_batch_norm, mode="compute")
    for rank in (0, 1):
        assert out[rank] == {"grad_input": True, "weight_bias_grads": True, "running": True, "output": True}, out


def _ddp_step_in_timing_mode(rank: int, world: int) -> dict:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.BatchNorm2d(16), torch.nn.ReLU())
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model).to(f"emugpu:{rank}")
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    x = torch.randn(4, 3, 32, 32, device=f"emugpu:{rank}").to(memory_format=torch.channels_last)
    torch.emugpu.synchronize()
    torch_emugpu.reset_cost_report()
    y = ddp(x)
    y.sum().backward()
    torch.emugpu.synchronize()
    rows = torch_emugpu.cost_report(reset=True)
    return {
        "shape": list(y.shape),
        "channels_last": y.is_contiguous(memory_format=torch.channels_last),
        "grad": ddp.module[1].weight.grad is not None,
        "charged": sum(r["ops"] for r in rows),
    }


def test_sync_batch_norm_trains_under_ddp_in_timing_mode():
    out = run_ranks(_ddp_step_in_timing_mode, mode="timing")
    for rank in (0, 1):
        assert out[rank]["shape"] == [4, 16, 30, 30] and out[rank]["grad"] and out[rank]["channels_last"]
        assert out[rank]["charged"] >= 5  # the five SyncBN kernels at least, besides the convolution's
