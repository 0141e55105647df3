"""Scripts of the same shape as pytorch/examples' distributed ones (FSDP2
with and without --dcp-api resume, tensor_parallel_example,
sequence_parallel_example, fsdp_tp_example) run unmodified under
`torch-emugpu run --gpu h100 --gpus 2 -- torchrun --standalone
--nproc-per-node 2 ...`, in timing mode, on loopback."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from conftest import REPO

pytestmark = pytest.mark.slow  # torchrun jobs of two ranks: seconds each

JOB = pathlib.Path(__file__).resolve().parent / "dist_examples_job.py"
TIMEOUT = 300


def _run(*job_args: str, cwd: pathlib.Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EMUGPU_", "CUDA_VISIBLE"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    cmd = [sys.executable, "-m", "torch_emugpu", "run", "--gpu", "h100", "--gpus", "2", "--"]
    cmd += [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(JOB)]
    r = subprocess.run([*cmd, *job_args], env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-6000:]
    return json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][-1])


@pytest.mark.parametrize("dcp_api", [False, True], ids=["dtensor_api", "dcp_api"])
def test_fsdp2_trains_saves_and_resumes(tmp_path: pathlib.Path, dcp_api: bool):
    flags = ["--dcp-api"] if dcp_api else []
    first = _run("fsdp2", "--ckpt", str(tmp_path), *flags, cwd=tmp_path)
    assert first["resumed"] is False and "output.weight" in first["params"]
    assert first["accelerator"] == "cuda" and first["rng_state_bytes"] == 16  # CUDA's Philox state
    assert first["current_device"] == 1  # rank 1 on cuda:1, set by fully_shard's default mesh
    second = _run("fsdp2", "--ckpt", str(tmp_path), *flags, cwd=tmp_path)
    assert second["resumed"] is True and second["params"] == first["params"]
    folder = tmp_path / ("dcp_api" if dcp_api else "dtensor_api")
    runs = sorted(folder.iterdir())
    assert len(runs) == 2
    saved = torch.load(runs[-1] / "model.pt", weights_only=True)
    assert set(saved) == set(first["params"]) and saved["output.weight"].shape == (256, 64)
    if dcp_api:  # the optimizer's full state too, gathered by DCP
        assert "state" in torch.load(runs[-1] / "optim.pt", weights_only=True)


@pytest.mark.parametrize("case", ["tp", "sp"])
def test_tensor_and_sequence_parallel(tmp_path: pathlib.Path, case: str):
    out = _run(case, cwd=tmp_path)
    assert out["in_proj"] == ["S(0)"] and out["device"].endswith(":1") and out["current_device"] == 1


def test_fsdp_with_tensor_parallel_attention(tmp_path: pathlib.Path):
    out = _run("fsdp_tp", cwd=tmp_path)
    assert out["is_dtensor"] and len(out["wq"]) == 2 and out["wq"][1] == "S(0)"  # (dp, tp)
