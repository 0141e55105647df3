"""Scripts of the same shape as pytorch/examples' distributed ones, small:
FSDP2 with a checkpoint saved and resumed (DTensor or DCP API), tensor
parallel, sequence parallel, and FSDP + TP with DTensor attention. Written
for CUDA's idioms (torch.accelerator, init_device_mesh on the accelerator's
type), run under torchrun by test_dist_examples.py. Rank 1 (whose device
the mesh must set) prints one JSON line of what it saw.

    torchrun --standalone --nproc-per-node 2 dist_examples_job.py fsdp2 --ckpt DIR [--dcp-api]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

VOCAB, DIM, HEADS, LAYERS, SEQ = 256, 64, 4, 2, 32


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, HEADS, DIM // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).contiguous().view(b, s, -1))


class Block(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attention = Attention()
        self.feed_forward = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attention(self.attention_norm(x)))
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block(dropout) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Embedding | nn.LayerNorm):
                m.reset_parameters()


def fsdp2(args: argparse.Namespace, device: torch.device) -> dict[str, object]:
    """The FSDP2 example's shape: meta init, fully_shard per block, train,
    full state dicts gathered to rank 0 and saved; a later run resumes."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Transformer()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    folder = os.path.join(args.ckpt, "dcp_api" if args.dcp_api else "dtensor_api")
    runs = sorted(int(n) for n in os.listdir(folder)) if os.path.isdir(folder) else []
    resumed = bool(runs)
    last = os.path.join(folder, str(runs[-1])) if resumed else ""
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    if not resumed:
        model.to_empty(device=device)
        model.reset_parameters()
    else:
        full = torch.load(os.path.join(last, "model.pt"), mmap=True, weights_only=True, map_location="cpu")
        if args.dcp_api:
            set_model_state_dict(model, full, options=options)
        else:
            meta = model.state_dict()
            sharded = {
                k: nn.Parameter(distribute_tensor(v, meta[k].device_mesh, meta[k].placements)) for k, v in full.items()
            }
            model.load_state_dict(sharded, strict=False, assign=True)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    if resumed and args.dcp_api:
        full_optim = torch.load(os.path.join(last, "optim.pt"), mmap=True, weights_only=True, map_location="cpu")
        set_optimizer_state_dict(model, optim, full_optim, options=options)
    for _ in range(args.steps):
        x = torch.randint(0, VOCAB, (4, SEQ), device=device)
        loss = model(x).sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optim.step()
        optim.zero_grad()
    if args.dcp_api:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_sd = get_model_state_dict(model, options=options)
        optim_sd = get_optimizer_state_dict(model, optim, options=options)
    else:
        model_sd = {}
        for k, v in model.state_dict().items():
            full_param = v.full_tensor()
            if dist.get_rank() == 0:
                model_sd[k] = full_param.cpu()
        optim_sd = {}
    if dist.get_rank() == 0:
        out = os.path.join(folder, str(int(time.time() * 1000)))
        os.makedirs(out, exist_ok=True)
        torch.save(model_sd, os.path.join(out, "model.pt"))
        torch.save(optim_sd, os.path.join(out, "optim.pt"))
    return {"resumed": resumed, "params": sorted(model.state_dict()), "optim_keys": sorted(optim.state_dict())}


class ToyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.in_proj, self.relu, self.out_proj = nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.relu(self.in_proj(x)))


def toy(args: argparse.Namespace, device: torch.device, sequence: bool) -> dict[str, object]:
    """tensor_parallel_example / sequence_parallel_example's shape."""
    mesh = init_device_mesh(device.type, (int(os.environ["WORLD_SIZE"]),))
    if sequence:
        plan = {
            "in_proj": ColwiseParallel(input_layouts=Shard(0)),
            "out_proj": RowwiseParallel(output_layouts=Shard(0)),
        }
    else:
        plan = {"in_proj": ColwiseParallel(), "out_proj": RowwiseParallel()}
    model = parallelize_module(ToyModel().to(device.type), mesh, plan)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.25, foreach=True)
    for i in range(args.steps):
        torch.manual_seed(i)
        inp = torch.rand(20, 10, device=device.type)
        model(inp).sum().backward()
        optimizer.step()
    placements = [str(p) for p in model.in_proj.weight.placements]
    return {"in_proj": placements, "device": str(model.in_proj.weight.to_local().device)}


def fsdp_tp(args: argparse.Namespace, device: torch.device) -> dict[str, object]:
    """fsdp_tp_example's shape: a (dp, tp) mesh, sequence parallel norms,
    DTensor q/k/v (use_local_output=False) into scaled_dot_product_attention."""
    tp = 2
    mesh = init_device_mesh(device.type, (dist.get_world_size() // tp, tp), mesh_dim_names=("dp", "tp"))
    model = Transformer(dropout=0.1).to(device.type)
    parallelize_module(
        model,
        mesh["tp"],
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        },
    )
    for block in model.layers:
        parallelize_module(
            block,
            mesh["tp"],
            {
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "attention.wq": ColwiseParallel(use_local_output=False),
                "attention.wk": ColwiseParallel(use_local_output=False),
                "attention.wv": ColwiseParallel(use_local_output=False),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "feed_forward.0": ColwiseParallel(),
                "feed_forward.2": RowwiseParallel(output_layouts=Shard(1)),
            },
        )
    model = fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
    for i in range(args.steps):
        torch.manual_seed(i + mesh["dp"].get_local_rank())
        inp = torch.randint(VOCAB, (2, SEQ), device=device.type)
        model(inp).sum().backward()
        optimizer.step()
    wq = model.layers[0].attention.wq.weight
    return {"wq": [str(p) for p in wq.placements], "is_dtensor": isinstance(wq, DTensor)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=["fsdp2", "tp", "sp", "fsdp_tp"])
    parser.add_argument("--ckpt", default="checkpoints")
    parser.add_argument("--dcp-api", action="store_true")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"{torch.accelerator.current_accelerator().type}:{rank}")
    # No set_device, as in the official scripts: init_device_mesh (fully_shard's default mesh) picks
    # LOCAL_RANK's device, which needs seeding and the process group to leave the device uninitialized.
    dist.init_process_group(backend=dist.get_default_backend_for_device(device), device_id=device)
    torch.manual_seed(0)
    if args.case == "fsdp2":
        result = fsdp2(args, device)
    elif args.case == "fsdp_tp":
        result = fsdp_tp(args, device)
    else:
        result = toy(args, device, sequence=args.case == "sp")
    torch.accelerator.synchronize()
    result["accelerator"] = device.type
    result["rng_state_bytes"] = torch.get_device_module(device.type).get_rng_state().numel()
    result["current_device"] = torch.accelerator.current_device_index()
    if dist.get_rank() == 1:  # rank 1: its device is LOCAL_RANK's only if the mesh or the script set it
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
