"""FSDP2 (`fully_shard`) training of a GPT-style model on emulated GPUs,
optionally with tensor parallelism on a 2-D device mesh.

One process per emulated GPU, launched by torchrun (one torchrun per node):

    torchrun --standalone --nproc-per-node 8 examples/fsdp_gpt.py
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 --rdzv-backend c10d \\
        --rdzv-endpoint 127.0.0.1:29400 examples/fsdp_gpt.py      # and --node-rank 1 beside it
    torchrun --standalone --nproc-per-node 8 examples/fsdp_gpt.py --tp 2   # 4-way FSDP x 2-way TP

Written as for CUDA, with "emugpu" as the device: each transformer block is
sharded with `fully_shard` (bf16 parameters, fp32 gradient reduction), with
`--tp` the blocks' attention and MLP are split by `parallelize_module` over
the mesh's "tp" dimension first. Rank 0 prints the iteration time, token
throughput and every rank's peak memory, as the emulated GPUs would show them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812  (PyTorch's own spelling)
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import torch_emugpu  # registers the emugpu device and the emu backend


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention and a 4x MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.norm1(x)
        # -1: under tensor parallelism this rank holds heads / tp of them.
        q, k, v = (m(h).view(b, t, -1, x.shape[-1] // self.heads).transpose(1, 2) for m in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, -1))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def shard(model: GPT, mesh: DeviceMesh, tp: int) -> None:
    """Tensor parallelism inside each block (over "tp"), then FSDP2 over "dp"."""
    if tp > 1:
        plan = {
            "q": ColwiseParallel(),
            "k": ColwiseParallel(),
            "v": ColwiseParallel(),
            "proj": RowwiseParallel(),
            "up": ColwiseParallel(),
            "down": RowwiseParallel(),
        }
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], plan)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"], mp_policy=policy)
    fully_shard(model, mesh=mesh["dp"], mp_policy=policy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12, help="transformer blocks (default: 12)")
    parser.add_argument("--dim", type=int, default=768, help="model width (default: 768, GPT-2 small)")
    parser.add_argument("--heads", type=int, default=12, help="attention heads (default: 12)")
    parser.add_argument("--vocab", type=int, default=50304, help="vocabulary size (default: 50304)")
    parser.add_argument("--context", type=int, default=1024, help="sequence length (default: 1024)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per data-parallel rank (default: 8)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree, a divisor of the world size")
    parser.add_argument("--iterations", type=int, default=10, help="timed iterations after one warm-up")
    parser.add_argument(
        "--sync",
        choices=("iteration", "phase", "none"),
        default="iteration",
        help="synchronize after each iteration (default), after each phase (forward, backward, step), or never "
        "(iterations are then timed by the host's launches, as on CUDA)",
    )
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("emugpu", local_rank)
    torch.emugpu.set_device(device)
    dist.init_process_group(device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.tp != 0 or args.heads % args.tp != 0:
        raise SystemExit(f"fsdp_gpt: --tp {args.tp} must divide the world size ({world}) and --heads ({args.heads})")
    mesh = init_device_mesh("emugpu", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))

    torch.manual_seed(0)  # every rank starts from the same weights, as FSDP2 expects
    model = GPT(args.vocab, args.dim, args.layers, args.heads, args.context)
    shard(model, mesh, args.tp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    # Tensor-parallel ranks of one data-parallel group see the same batch.
    generator = torch.Generator().manual_seed(mesh["dp"].get_local_rank())
    tokens = torch.randint(0, args.vocab, (args.batch_size, args.context + 1), generator=generator).pin_memory()

    times = []
    for i in range(args.iterations + 1):
        start = time.perf_counter()
        batch = tokens.to(device, non_blocking=True)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        if args.sync == "phase":
            torch.emugpu.synchronize()
        loss.backward()
        if args.sync == "phase":
            torch.emugpu.synchronize()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if args.sync != "none":
            torch.emugpu.synchronize()
        if i > 0:  # the first iteration fills the shape caches and FSDP's lazy state
            times.append(time.perf_counter() - start)

    # Per rank: peak memory, and whether the host kept the emulated GPU waiting (times then measure this host).
    host = torch_emugpu.host_bound_report(local_rank)
    mine = torch.tensor(
        [torch.emugpu.max_memory_allocated(device), host["host_bound_windows"], host["worst_idle_fraction"]],
        dtype=torch.float64,
        device=device,
    )
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    if rank == 0:
        it = statistics.median(times)
        params = sum(p.to_local().numel() for p in model.parameters())
        print(
            f"GPT ({args.layers} layers, width {args.dim}) FSDP2 on {world} x "
            f"{torch.emugpu.get_device_name(device)}: mesh dp={world // args.tp} x tp={args.tp}, "
            f"batch {args.batch_size} x {args.context} tokens per data-parallel rank"
        )
        print(f"parameters       {params / 1e6:.1f} M on rank 0 (its shard)")
        print(f"iteration time   {it * 1e3:.2f} ms (median of {len(times)})")
        print(f"throughput       {world // args.tp * args.batch_size * args.context / it:.0f} tokens/s")
        print("peak memory      " + ", ".join(f"rank {r}: {e[0].item() / 2**30:.2f} GiB" for r, e in enumerate(every)))
        late = [r for r, e in enumerate(every) if e[1].item() > 0]
        worst = max(e[2].item() for e in every)
        print(
            f"host-bound       {'ranks ' + str(late) if late else 'no'} (the emulated GPUs sat idle up to "
            f"{worst:.0%} of a window waiting for their hosts{'; these times measure this host' if late else ''})"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
