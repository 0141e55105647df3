"""Process lifecycle (issue 6): the device count from import on, fork, Ctrl-C
during host waits, a source tree whose extension is not built, and warnings
that say when values are placeholders."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings

import pytest
import torch
from conftest import REPO, run_python

pytestmark = pytest.mark.slow  # multi-process runs: scripts/test.sh --fast leaves them out


def test_a_cpu_backward_before_the_first_emugpu_use_leaves_emugpu_backward_working():
    r = run_python(
        "import torch\n"
        "w = torch.ones(3, requires_grad=True); (w * 2).sum().backward()\n"  # autograd sizes its queues here
        "x = torch.ones(3, device='emugpu', requires_grad=True); (x * 2).sum().backward()\n"
        "print('grad', tuple(x.grad.shape), torch.emugpu.device_count())",
        env={"EMUGPU_DEVICE_COUNT": "3"},
    )
    assert r.returncode == 0, r.stderr
    assert "grad (3,) 3" in r.stdout


def test_a_forked_child_of_a_process_that_used_emugpu_is_refused_like_cuda():
    r = run_python(
        "import os, torch\n"
        "x = torch.empty(4, device='emugpu')\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    try:\n"
        "        torch.empty(4, device='emugpu')\n"
        "        os._exit(3)\n"
        "    except RuntimeError as e:\n"
        "        os._exit(0 if 'forked subprocess' in str(e) and torch.emugpu._is_in_bad_fork() else 4)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('child', os.waitstatus_to_exitcode(status))"
    )
    assert r.returncode == 0, r.stderr
    assert "child 0" in r.stdout


def test_dataloader_workers_forked_before_first_use_and_pin_memory_still_work():
    r = run_python(
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "ds = TensorDataset(torch.arange(64.).view(16, 4))\n"
        "dl = DataLoader(ds, batch_size=4, num_workers=2, pin_memory=True,"
        " multiprocessing_context='fork')\n"
        "total = 0.0\n"
        "for (b,) in dl:\n"
        "    total += b.to('emugpu', non_blocking=True).cpu().sum().item()\n"
        "print('sum', total)",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "sum 2016.0" in r.stdout


@pytest.mark.parametrize("wait", ["torch.emugpu.synchronize()", "y.cpu()", "y.sum().item()"])
def test_ctrl_c_interrupts_a_host_wait(wait):
    code = (
        "import torch, torch_emugpu, time\n"
        "x = torch.empty(4, device='emugpu')\n"
        "torch_emugpu._C._emulate_kernel(0, 600.0)\n"  # ten minutes of emulated work
        "y = x * 2\n"
        "print('waiting', flush=True)\n"
        "t = time.monotonic()\n"
        "try:\n"
        f"    {wait}\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted after', round(time.monotonic() - t, 1), flush=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_")}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)  # generous for a loaded host; uninterrupted it would wait 600 s
    finally:
        proc.kill()
    assert "interrupted after" in out, err


def test_an_unbuilt_source_tree_says_what_is_missing():
    # What a checkout without the compiled module looks like to the package.
    r = subprocess.run(
        [
            sys.executable,
            "-W",
            "always",
            "-c",
            "import sys; sys.modules['torch_emugpu._C'] = None\n"
            "import torch_emugpu, torch\n"
            "torch.device('emugpu')\n"
            "print('parses')\n"
            "try:\n"
            "    torch_emugpu.configure()\n"
            "except RuntimeError as e:\n"
            "    print('error:', e)",
        ],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_")}, "EMUGPU_AUTOLOAD": "0"},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert "compiled extension torch_emugpu._C is missing" in r.stderr
    assert "pip install --no-build-isolation" in r.stderr
    assert "parses" in r.stdout and "error: torch-emugpu's compiled extension" in r.stdout


def test_reading_back_computed_values_in_timing_mode_warns_once_naming_compute_mode(tmp_path):
    r = run_python(
        "import torch, warnings\n"
        "warnings.simplefilter('always')\n"
        "x = torch.ones(4).to('emugpu')\n"
        "print('copied', x.cpu().tolist(), 'small', (x * 2).sum().item())\n"  # real bytes, a small op on them
        "x = torch.ones(1 << 15).to('emugpu')\n"  # 128 KiB: ops on it are not computed
        "loss = (x * 2).sum()\n"
        "print('loss', loss.item(), (x + 1)[:2].cpu().tolist())\n"
        f"torch.save({{'w': x * 3}}, r'{tmp_path / 'ckpt.pt'}')\n"
    )
    assert r.returncode == 0, r.stderr
    assert "copied [1.0, 1.0, 1.0, 1.0] small 8.0" in r.stdout and "loss 0.0 [0.0, 0.0]" in r.stdout
    assert r.stderr.count("placeholders") == 1 and "EMUGPU_MODE=compute" in r.stderr


def test_no_warning_in_compute_mode():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=r".*is host-bound")  # drawn by a loaded host, not the subject
        import torch_emugpu

        torch_emugpu.configure(mode="compute")
        assert (torch.ones(2, device="emugpu") * 2).sum().item() == 4.0


# Rank 0 of two, whose peer never comes (set-up) or never reaches the barrier; the store is made here so
# that PyTorch's own wait for the store's clients is not the wait under test.
MISSING_PEER = """
import datetime, os, sys, time, subprocess
import torch, torch_emugpu, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
peer = None
if sys.argv[1] == "barrier":  # rank 1 joins the group, then sleeps instead of reaching the barrier
    code = (
        "import sys, time, torch, torch_emugpu, torch.distributed as dist\\n"
        "store = dist.TCPStore('127.0.0.1', int(sys.argv[1]), 2, False)\\n"
        "dist.init_process_group('emu', store=store, rank=1, world_size=2)\\n"
        "time.sleep(600)\\n"
    )
    peer = subprocess.Popen([sys.executable, "-c", code, str(store.port)])
print("waiting", flush=True)
t = time.monotonic()
try:
    dist.init_process_group("emu", store=store, rank=0, world_size=2, timeout=datetime.timedelta(seconds=600))
    print("joined", flush=True)
    dist.barrier()
except KeyboardInterrupt:
    print("interrupted after", round(time.monotonic() - t, 1), flush=True)
finally:
    if peer is not None:
        peer.kill()
"""


@pytest.mark.slow
@pytest.mark.parametrize("where", ["set-up", "barrier"])
def test_ctrl_c_interrupts_a_rank_waiting_for_a_missing_peer(where):
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_")}
    env["PYTHONPATH"] = REPO
    proc = subprocess.Popen(
        [sys.executable, "-c", MISSING_PEER, where],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "waiting"
        if where == "barrier":
            assert proc.stdout.readline().strip() == "joined"
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)  # uninterrupted it would wait 600 s
    finally:
        proc.kill()
    assert "interrupted after" in out, err[-2000:]
