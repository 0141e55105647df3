"""The main job: an emulated training run of a torchvision model or a GPT-2-size
decoder on an emulated GPU, with a progress bar and a summary. With --data DIR
it trains on a real image folder through a DataLoader and reports where each
epoch's time went (fetch, preprocessing and transfer stalls, accelerator
utilisation): see torch_emugpu/data/data_train.py."""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

import torch_emugpu
from torch_emugpu import _C
from torch_emugpu.device import device_module
from torch_emugpu.measure.models import GPT2_SMALL, GPTConfig, image_size, torchvision_model

# GPT-2 124M, and GPT-3 6.7B's layout (made on the emulated device: its
# 27 GB of fp32 weights need not fit the host's memory).
GPT_MODELS = {
    "gpt2": GPT2_SMALL,
    "gpt-6.7b": GPTConfig(context=2048, layers=32, heads=32, width=4096),
}
BUILT_ON_DEVICE = {"gpt-6.7b"}


@dataclass
class TrainResult:
    model: str
    gpu: str
    batch_size: int
    iterations: int
    iteration_s: float  # median wall time per iteration (emulated GPU time when GPU-bound)
    gpu_busy_s: float  # emulated compute-engine time per iteration
    host_overhead_s: float  # host time per iteration not spent waiting for the emulated GPU
    peak_memory: int
    samples_per_s: float
    clock: str = "real"  # "real", or "virtual (measured host)" / "virtual (modelled host)"
    emulated_per_wall: float = 1.0  # emulated seconds per wall second over the measured iterations


def build(model: str, batch_size: int, seq_len: int) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    if model in GPT_MODELS:
        from torch_emugpu.measure.models import GPT

        with torch.device("emugpu" if model in BUILT_ON_DEVICE else "cpu"):
            gpt = GPT(GPT_MODELS[model])
        x = torch.randint(0, gpt.cfg.vocab_size, (batch_size, seq_len))
        return gpt, x, x.clone()
    import torchvision

    if model not in torchvision.models.list_models(module=torchvision.models):
        known = ", ".join(sorted(torchvision.models.list_models(module=torchvision.models)))
        raise ValueError(f"unknown model {model!r}; choose gpt2, gpt-6.7b or a torchvision classifier: {known}")
    net = torchvision_model(model)
    size = image_size(model)
    return net, torch.randn(batch_size, 3, size, size), torch.randint(0, 1000, (batch_size,))


def run(
    model: str = "resnet50",
    gpu: str | None = None,
    batch_size: int = 64,
    iterations: int = 20,
    warmup: int = 3,
    optimizer: str = "sgd",
    amp: str = "none",
    seq_len: int = 1024,
    progress: bool = True,
) -> TrainResult:
    if batch_size < 1 or iterations < 1 or warmup < 0 or seq_len < 1:
        raise ValueError("batch size, iterations and sequence length must be >= 1 and warm-up >= 0")
    torch_emugpu.configure(gpu=gpu)
    net, x_host, y_host = build(model, batch_size, seq_len)
    device = torch.device("emugpu", 0)
    net = net.to(device).train()
    if optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    elif optimizer == "adamw":
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    else:
        raise ValueError(f"optimizer must be sgd or adamw, got {optimizer!r}")
    dtypes = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}
    if amp not in dtypes:
        raise ValueError(f"amp must be one of {', '.join(dtypes)}, got {amp!r}")
    is_gpt = model in GPT_MODELS

    def step() -> None:
        x = x_host.to(device)
        y = y_host.to(device)
        with torch.autocast("emugpu", dtype=dtypes[amp] or torch.float16, enabled=dtypes[amp] is not None):
            out = net(x)
            if is_gpt:
                out = out.view(-1, out.size(-1))
                y = y.view(-1)
            loss = torch.nn.functional.cross_entropy(out, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    device_module.synchronize()
    device_module.reset_peak_memory_stats()
    times: list[float] = []
    _C._reset_engine_stats(0)
    clock_before = torch_emugpu.clock_report()
    start = time.perf_counter()
    bar = tqdm(range(iterations), desc=f"{model} on {device_module.get_device_name()}", unit="it", disable=not progress)
    for _ in bar:
        t0 = time.perf_counter()
        step()
        device_module.synchronize()
        times.append(time.perf_counter() - t0)
    total = time.perf_counter() - start
    clock_after = torch_emugpu.clock_report()
    clock, emulated_per_wall = "real", 1.0
    if clock_after["clock"] == "virtual":
        clock = f"virtual ({clock_after['host']} host)"
        wall = clock_after["wall_s"] - clock_before.get("wall_s", 0.0)
        emulated_per_wall = (clock_after["elapsed_s"] - clock_before.get("elapsed_s", 0.0)) / max(wall, 1e-9)
    stats = _C._engine_stats(0)
    busy = stats["compute"][1] / 1e9 / iterations
    blocked = stats["host_blocked_ns"] / 1e9
    median = statistics.median(times)
    return TrainResult(
        model=model,
        gpu=device_module.get_device_name(),
        batch_size=batch_size,
        iterations=iterations,
        iteration_s=median,
        gpu_busy_s=busy,
        host_overhead_s=(total - blocked) / iterations,
        peak_memory=device_module.max_memory_allocated(),
        samples_per_s=batch_size / median,
        clock=clock,
        emulated_per_wall=emulated_per_wall,
    )


def summary(r: TrainResult) -> str:
    return "\n".join(
        [
            f"model              {r.model} (batch {r.batch_size}, {r.iterations} iterations)",
            f"emulated GPU       {r.gpu}",
            f"iteration time     {r.iteration_s * 1e3:.2f} ms (median, "
            f"{'wall time' if r.clock == 'real' else 'emulated time'})",
            f"throughput         {r.samples_per_s:.1f} samples/s",
            f"GPU busy           {r.gpu_busy_s * 1e3:.2f} ms per iteration (emulated compute engine)",
            f"host overhead      {r.host_overhead_s * 1e3:.2f} ms per iteration "
            f"({r.host_overhead_s / max(r.iteration_s, 1e-12):.1%} of the iteration)",
            f"peak memory        {r.peak_memory / 2**30:.2f} GiB (max_memory_allocated)",
            f"clock              {r.clock}"
            + ("" if r.clock == "real" else f": {r.emulated_per_wall:.1f} emulated seconds per wall second"),
        ]
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default="resnet50", help="torchvision classifier name, gpt2 (124M) or gpt-6.7b (default: resnet50)"
    )
    p.add_argument(
        "--gpu",
        default=None,
        help="emulated GPU, e.g. v100, A100-SXM4-80GB, h100 (default: EMUGPU_GPU or NVIDIA A100-SXM4-40GB)",
    )
    p.add_argument("--batch-size", type=int, default=64, help="samples per iteration (default: 64)")
    p.add_argument("--iterations", type=int, default=20, help="measured iterations (default: 20)")
    p.add_argument("--warmup", type=int, default=3, help="iterations before measuring (default: 3)")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd", help="default: sgd")
    p.add_argument(
        "--amp", choices=("none", "fp16", "bf16"), default="none", help="autocast dtype (default: none, fp32)"
    )
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per sample for the decoders (default: 1024)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    from torch_emugpu.data import data_train

    data_train.add_arguments(p.add_argument_group("training on an image folder (data stalls)"))


def main(args: argparse.Namespace) -> int:
    if getattr(args, "data", None):
        from torch_emugpu.data import data_train

        return data_train.main(args)
    r = run(
        model=args.model,
        gpu=args.gpu,
        batch_size=args.batch_size,
        iterations=args.iterations,
        warmup=args.warmup,
        optimizer=args.optimizer,
        amp=args.amp,
        seq_len=args.seq_len,
        progress=not args.no_progress,
    )
    print(summary(r))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m torch_emugpu.cli.train", description=__doc__)
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
