"""The torch-emugpu command: the main training job and the GPU list."""

import os
import subprocess
import sys

import pytest
import torch

from torch_emugpu import cli
from torch_emugpu.cli import train
from torch_emugpu.measure.models import GPT

pytestmark = pytest.mark.slow  # multi-process runs: scripts/test.sh --fast leaves them out

BIN = os.path.join(os.path.dirname(sys.executable), "torch-emugpu")


def test_help_reads_well():
    r = subprocess.run([BIN, "train", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for option in ("--model", "--gpu", "--batch-size", "--iterations", "--amp"):
        assert option in r.stdout


def test_train_prints_a_summary():
    r = subprocess.run(
        [BIN, "train", "--model", "resnet18", "--gpu", "t4", "--batch-size", "4", "--iterations", "3", "--warmup", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    for line in ("iteration time", "throughput", "GPU busy", "host overhead", "peak memory", "Tesla T4"):
        assert line in r.stdout
    assert "3/3" in r.stderr  # the progress bar


def test_iteration_time_is_the_emulated_gpu_time_when_gpu_bound():
    # The iteration and host times train reports are wall times, which host load moves: best of 3 runs.
    for _ in range(3):
        r = train.run(model="resnet50", gpu="k80", batch_size=16, iterations=3, warmup=2, progress=False)
        if r.gpu_busy_s > 5 * r.host_overhead_s and abs(r.iteration_s - r.gpu_busy_s) / r.gpu_busy_s < 0.05:
            break
    assert r.gpu_busy_s > 5 * r.host_overhead_s, r
    assert abs(r.iteration_s - r.gpu_busy_s) / r.gpu_busy_s < 0.05, r
    assert r.peak_memory > 0


def test_gpt2_job_runs():
    r = train.run(
        model="gpt2",
        gpu="A100-SXM4-40GB",
        batch_size=1,
        seq_len=128,
        iterations=2,
        warmup=1,
        optimizer="adamw",
        amp="bf16",
        progress=False,
    )
    with torch.device("meta"):  # counts the parameters without allocating them
        params = sum(p.numel() for p in GPT().parameters())
    assert (r.model, r.gpu, r.iterations) == ("gpt2", "NVIDIA A100-SXM4-40GB", 2)
    # fp32 weights, gradients and AdamW's two moments stay on the device across the step.
    assert r.peak_memory >= 4 * 4 * params
    # A training step is at least 6 FLOPs per parameter and token; an A100 does at most 312 TFLOP/s in bf16.
    assert r.gpu_busy_s >= 6 * params * 128 / 312e12
    assert r.samples_per_s == pytest.approx(1 / r.iteration_s)


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_a_6_7b_decoder_is_made_on_the_device_and_needs_an_h200_for_adamw():
    before = _rss_bytes()
    kwargs = dict(batch_size=1, seq_len=128, iterations=1, warmup=1, optimizer="adamw", amp="bf16", progress=False)
    r = train.run(model="gpt-6.7b", gpu="h200", **kwargs)
    # Its 27 GB of fp32 weights never touched the host.
    assert _rss_bytes() - before < 2 << 30
    with torch.device("meta"):
        params = sum(p.numel() for p in GPT(train.GPT_MODELS["gpt-6.7b"]).parameters())
    assert 6.6e9 < params < 6.8e9
    # Weights, gradients and AdamW's two moments in fp32: more than an H100's 80 GB, less than an H200's 141.
    assert 16 * params <= r.peak_memory < 141e9
    with pytest.raises(torch.OutOfMemoryError):
        train.run(model="gpt-6.7b", gpu="h100", **kwargs)


def test_bad_input_exits_2_with_a_message(capsys):
    assert cli.main(["train", "--model", "resnet9000", "--iterations", "1"]) == 2
    assert "unknown model 'resnet9000'" in capsys.readouterr().err
    assert cli.main(["train", "--gpu", "v1000", "--iterations", "1"]) == 2
    assert "did you mean" in capsys.readouterr().err
    assert cli.main(["train", "--batch-size", "0"]) == 2


def test_out_of_memory_exits_3():
    assert (
        cli.main(
            [
                "train",
                "--model",
                "resnet152",
                "--gpu",
                "v100",
                "--batch-size",
                "512",
                "--iterations",
                "1",
                "--warmup",
                "0",
                "--no-progress",
            ]
        )
        == 3
    )


def test_gpus_lists_the_catalog(capsys):
    assert cli.main(["gpus"]) == 0
    assert "NVIDIA H100 80GB HBM3" in capsys.readouterr().out
