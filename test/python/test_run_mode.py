"""Run mode: scripts written for CUDA run unmodified on emulated GPUs
(`torch-emugpu run`, EMUGPU_AS_CUDA=1). Run mode changes torch process-wide,
so every case runs in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import REPO, run_python

from torch_emugpu.device import as_cuda

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_script.py")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EMUGPU_", "CUDA_VISIBLE"))}
    env.update(extra)
    return env


def run_mode(code: str, **env: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter in run mode."""
    return run_python(textwrap.dedent(code), env={"EMUGPU_AS_CUDA": "1", **env})


def last_json(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def script() -> dict:
    """cuda_script.py under `torch-emugpu run --gpu h100 --gpus 2 -- python cuda_script.py`."""
    r = subprocess.run(
        [sys.executable, "-m", "torch_emugpu", "run", "--gpu", "h100", "--gpus", "2", "--", sys.executable, SCRIPT],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    return last_json(r)


def test_the_script_sees_an_available_cuda_gpu(script):
    assert script["device_type"] == "cuda"  # torch.device("cuda") stays what the script made
    assert script["is_available"] is True
    assert script["device_count"] == 2
    assert script["bf16"] is True
    assert "H100" in script["name"] and script["props"][0] == script["name"]
    assert script["props"][1] > 70 * 2**30 and script["props"][2] > 100
    assert script["capability"] == [9, 0]
    assert script["accelerator"] == ["cuda", 2]  # scripts that branch on device.type == "cuda" take that branch
    assert script["pinned_batch"] is True


def test_model_and_tensors_land_on_the_emulated_gpu(script):
    assert script["param_device"] == "emugpu:0"
    assert script["module_cuda"] == "emugpu:0"
    assert script["tensor_devices"] == [
        "emugpu:0",  # randn(device=torch.device("cuda"))
        "emugpu:0",  # randint(device="cuda")
        "emugpu:0",  # pinned .to(device, non_blocking=True)
        "emugpu:0",  # .cuda()
        "emugpu:1",  # .cuda(1)
        "emugpu:1",  # .to("cuda:1")
        "emugpu:1",  # ones(device=torch.device("cuda", 1))
        "emugpu:0",  # arange
        "emugpu:0",  # tensor
        "emugpu:1",  # new_zeros
        "emugpu:1",  # empty_like(device=)
        "emugpu:0",  # .to(device=)
    ]
    assert script["device_context"] == "emugpu:1"
    assert script["load_map_location"] == "emugpu:0"


def test_amp_runs_on_the_emulated_gpu(script):
    assert script["autocast_dtype"] == "torch.bfloat16"
    assert script["autocast_fp16_dtype"] == "torch.float16"
    assert script["scaler_enabled"] == [True, False]
    assert script["custom_fwd_dtype"] == "torch.float16"


def test_streams_events_devices_and_rng(script):
    assert script["elapsed_ms"] > 0  # emulated GPU time between the events
    assert script["in_device_context"] == 1
    assert script["after_set_device"] == [1, "emugpu:1"]
    assert script["rng_state_all"] == 2
    assert script["generator"] == ["emugpu:0", True, True]
    assert script["generator_pickles"] == "Generator"
    assert script["device_pickles"] == "cuda:1"


def test_memory_statistics_are_the_emulated_allocators(script):
    assert script["memory_allocated"] > 0
    assert script["max_memory_allocated"] >= script["memory_allocated"]
    assert script["memory_reserved"] >= script["memory_allocated"]
    assert script["memory_stats_keys"] and script["summary"]
    assert script["reserved_before_empty_cache"] >= script["memory_reserved"] + 256 * 2**20
    assert script["reserved_after_empty_cache"] < script["reserved_before_empty_cache"] - 255 * 2**20


def test_an_ordinal_beyond_the_emulated_gpus_is_cudas_error():
    r = run_mode(
        """
        import torch
        for attempt in (lambda: torch.cuda.set_device(5), lambda: torch.zeros(1, device="cuda:5"),
                        lambda: torch.ones(1).to(torch.device("cuda", 2))):
            try:
                attempt()
                print("no error")
            except RuntimeError as e:
                print(type(e).__name__, e)
        """,
        EMUGPU_DEVICE_COUNT="2",
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 3
    for line in lines:
        assert "CUDA error: invalid device ordinal" in line and "2 emulated GPUs visible" in line


@pytest.mark.parametrize(
    ("visible", "count"), [("2,3", 2), ("1,7,2", 1), ("1,1", 0), ("", 0), ("-1", 0), ("3gpu", 1), ("GPU-1234", 0)]
)
def test_cuda_visible_devices_narrows_as_cuda_does(visible, count):
    assert as_cuda.visible_count(4, visible) == count
    assert as_cuda.visible_count(4, None) == 4


def test_cuda_visible_devices_in_a_script():
    code = """
        import json, torch
        print(json.dumps([torch.cuda.is_available(), torch.cuda.device_count()]))
        """
    assert last_json(run_mode(code, EMUGPU_DEVICE_COUNT="4", CUDA_VISIBLE_DEVICES="2,3")) == [True, 2]
    assert last_json(run_mode(code, EMUGPU_DEVICE_COUNT="4", CUDA_VISIBLE_DEVICES="")) == [False, 0]
    # A child with a narrower CUDA_VISIBLE_DEVICES of its own narrows the same 4 GPUs, not its parent's 2.
    nested = """
        import json, os, subprocess, sys, torch
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="3")
        child = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                               env=env, capture_output=True, text=True)
        print(json.dumps([torch.cuda.device_count(), int(child.stdout)]))
        """
    assert last_json(run_mode(nested, EMUGPU_DEVICE_COUNT="4", CUDA_VISIBLE_DEVICES="0,1")) == [2, 1]


def test_nccl_becomes_backend_emu():
    r = run_mode(
        """
        import json, os, torch, torch.distributed as dist
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
        store = dist.HashStore()
        dist.init_process_group("nccl", store=store, rank=0, world_size=1)
        t = torch.ones(4, device="cuda")
        dist.all_reduce(t)
        g = dist.new_group(backend="nccl")
        print(json.dumps([dist.get_backend(), dist.get_backend(g), str(t.device)]))
        dist.destroy_process_group()
        """
    )
    assert last_json(r) == ["emu", "emu", "emugpu:0"]


def test_torchscript_compiles_through_the_wrappers(tmp_path):
    path = tmp_path / "scripted.py"  # TorchScript reads the source: a file, not -c
    path.write_text(
        textwrap.dedent(
            """
            from typing import Optional
            import torch

            @torch.jit.script
            def frequencies(n: int, like: torch.Tensor, g: Optional[torch.Generator] = None) -> torch.Tensor:
                return torch.zeros(n, device=like.device) + torch.fft.fftfreq(n, device=like.device)

            @torch.jit.script
            def internal_annotation(x: torch.Tensor, g: Optional[torch._C.Generator] = None) -> torch.Tensor:
                return x + 1  # torch's own annotations name torch._C.Generator

            x = torch.ones(1, device="cuda")
            print(frequencies(4, x).device, internal_annotation(x).device)
            """
        )
    )
    r = subprocess.run(
        [sys.executable, str(path)], env=_env(EMUGPU_AS_CUDA="1"), capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["emugpu:0", "emugpu:0"]


def test_backend_strings_translate():
    assert as_cuda._translate_backend("nccl") == "emu"
    assert as_cuda._translate_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,emugpu:emu"
    assert as_cuda._translate_backend("gloo") == "gloo"


def test_the_factory_list_covers_every_aten_op_with_a_device():
    """A torch upgrade that adds a public factory fails here until FACTORIES names it."""
    names = set()
    for schema in torch._C._jit_get_all_schemas():
        name = schema.name.removeprefix("aten::")
        if schema.name.startswith("aten::") and not name.startswith("_"):
            if any(a.name == "device" for a in schema.arguments):
                names.add(name)
    covered = (
        set(as_cuda.FACTORIES)
        | set(as_cuda.TENSOR_METHODS)
        | {f"fft_{n}" for n in as_cuda.FFT_FACTORIES}
        | {"to", "pin_memory", "is_pinned", "Generator"}  # wrapped by hand, or CPU-side (pinning)
    )
    assert names - covered == set()


def test_run_mode_loads_the_package_even_where_autoload_is_off():
    r = run_mode("import torch; print(torch.cuda.is_available(), torch.ones(1).cuda().device)", EMUGPU_AUTOLOAD="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "emugpu:0"]


def test_without_run_mode_cuda_is_left_alone():
    r = run_python("import torch; print(torch.cuda.is_available(), torch.zeros is torch._C._VariableFunctions.zeros)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"]


def test_run_help_reads_well():
    r = subprocess.run(
        [sys.executable, "-m", "torch_emugpu", "run", "--help"], capture_output=True, text=True, env=_env(), cwd=REPO
    )
    assert r.returncode == 0
    for text in ("--gpu", "--gpus", "CUDA_VISIBLE_DEVICES", "EMUGPU_AS_CUDA=1"):
        assert text in r.stdout


def test_run_without_a_command_says_what_to_do():
    r = subprocess.run(
        [sys.executable, "-m", "torch_emugpu", "run", "--gpu", "h100"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=REPO,
    )
    assert r.returncode == 2
    assert "expected a command" in r.stderr


def test_run_with_an_unknown_gpu_or_command_says_what_is_wrong():
    for argv, message in (
        (["--gpu", "h999", "--", sys.executable, "-c", "pass"], "unknown GPU 'h999'; did you mean"),
        (["--", "no-such-command-29"], "command not found: 'no-such-command-29'"),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "torch_emugpu", "run", *argv], capture_output=True, text=True, env=_env(), cwd=REPO
        )
        assert r.returncode == 2 and message in r.stderr, r.stderr


@pytest.mark.slow
def test_spawned_children_and_dataloader_workers_inherit_the_mode(tmp_path):
    path = tmp_path / "spawning.py"  # spawn re-imports the main module: a file, not -c
    path.write_text(
        textwrap.dedent(
            """
        import json, torch, torch.multiprocessing as mp

        def child(rank, queue):
            queue.put((rank, torch.cuda.is_available(), str(torch.zeros(1, device="cuda").device)))

        class Data(torch.utils.data.Dataset):
            def __len__(self):
                return 2
            def __getitem__(self, i):
                return torch.tensor([float(torch.cuda.is_available())])

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            queue = ctx.SimpleQueue()
            mp.spawn(child, args=(queue,), nprocs=2)
            children = sorted(queue.get() for _ in range(2))
            loader = torch.utils.data.DataLoader(Data(), batch_size=2, num_workers=1, multiprocessing_context="spawn")
            batch = next(iter(loader))
            print(json.dumps([children, batch.flatten().tolist()]))
        """
        )
    )
    r = subprocess.run(
        [sys.executable, str(path)], env=_env(EMUGPU_AS_CUDA="1"), capture_output=True, text=True, timeout=300
    )
    assert last_json(r) == [[[0, True, "emugpu:0"], [1, True, "emugpu:0"]], [1.0, 1.0]]


@pytest.mark.slow
def test_torchrun_workers_with_nccl_and_ddp(tmp_path):
    path = tmp_path / "ddp.py"
    path.write_text(
        textwrap.dedent(
            """
            import json, os, torch, torch.distributed as dist
            dist.init_process_group(backend="nccl")
            local_rank = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(local_rank)
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8).cuda(), device_ids=[local_rank])
            model(torch.randn(4, 8, device="cuda")).sum().backward()
            torch.cuda.synchronize()
            flag = torch.tensor([1.0], device=f"cuda:{local_rank}")
            dist.all_reduce(flag)
            result = [dist.get_backend(), str(next(model.parameters()).device), torch.cuda.device_count(),
                      torch.cuda.max_memory_allocated() > 0]
            with open(os.path.join(os.path.dirname(__file__), f"rank{local_rank}.json"), "w") as f:
                json.dump(result, f)
            dist.destroy_process_group()
            """
        )
    )
    r = subprocess.run(
        [sys.executable, "-m", "torch_emugpu", "run", "--", sys.executable, "-m", "torch.distributed.run",
         "--standalone", "--nproc-per-node", "2", str(path)],
        env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert lines == [["emu", "emugpu:0", 2, True], ["emu", "emugpu:1", 2, True]]


@pytest.mark.slow
def test_init_device_mesh_gives_each_torchrun_rank_its_own_gpu(tmp_path):
    path = tmp_path / "mesh.py"
    path.write_text(
        textwrap.dedent(
            """
            import json, os, torch
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh("cuda", (2,))
            rank = int(os.environ["LOCAL_RANK"])
            with open(os.path.join(os.path.dirname(__file__), f"rank{rank}.json"), "w") as f:
                json.dump([mesh.device_type, torch.cuda.current_device(), str(torch.zeros(1, device="cuda").device)], f)
            torch.distributed.destroy_process_group()
            """
        )
    )
    r = subprocess.run(
        [sys.executable, "-m", "torch_emugpu", "run", "--", sys.executable, "-m", "torch.distributed.run",
         "--standalone", "--nproc-per-node", "2", str(path)],
        env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert ranks == [["emugpu", 0, "emugpu:0"], ["emugpu", 1, "emugpu:1"]]


@pytest.mark.slow
def test_a_process_that_stays_on_the_cpu_is_warned_once():
    burn = """
        import time, torch
        model = torch.nn.Linear(256, 256)
        x = torch.randn(256, 256)
        end = time.process_time() + 4
        while time.process_time() < end:
            model(x).sum().backward()  # starts autograd's device threads, as any CPU training does
        {extra}
        """
    r = run_mode(burn.format(extra=""))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("never allocated on an emulated GPU") == 1
    r = run_mode(burn.format(extra="model.cuda()"))
    assert r.returncode == 0, r.stderr
    assert "never allocated" not in r.stderr


@pytest.mark.parametrize("gpus", [1, 2])
def test_data_parallel_of_a_cuda_script_runs_on_the_emulated_gpus(gpus: int):
    # pytorch/examples' imagenet: `nn.DataParallel(model).cuda()`; DataParallel asks torch for the
    # available device type, whose "cuda" would make cuda:0 its source device.
    r = run_mode(
        """
        import json, torch
        model = torch.nn.DataParallel(torch.nn.Linear(16, 4)).cuda()
        y = model(torch.randn(8, 16).cuda())
        y.sum().backward()
        print(json.dumps([str(y.device), str(next(model.parameters()).device), model.device_ids]))
        """,
        EMUGPU_DEVICE_COUNT=str(gpus),
    )
    assert last_json(r) == ["emugpu:0", "emugpu:0", list(range(gpus))]


def test_the_report_lists_only_the_gpus_a_process_used():
    r = run_mode(
        """
        import torch
        model = torch.nn.Linear(16, 4).cuda()
        model(torch.randn(8, 16, device="cuda")).sum().backward()
        """,
        EMUGPU_DEVICE_COUNT="2",
        EMUGPU_AS_CUDA_REPORT="1",
    )
    assert r.returncode == 0, r.stderr
    assert "cuda:0" in r.stderr and "cuda:1" not in r.stderr, r.stderr


@pytest.mark.slow
def test_seeding_cuda_in_a_forked_dataloader_worker_does_nothing_as_cudas():
    # Hugging Face's seed_worker calls torch.cuda.manual_seed_all in each worker; CUDA queues it there.
    r = run_mode(
        """
        import json, torch
        from torch.utils.data import DataLoader
        def init(worker_id):
            torch.cuda.manual_seed(1); torch.cuda.manual_seed_all(1); torch.cuda.seed(); torch.cuda.seed_all()
            torch.manual_seed(1)
        torch.zeros(1, device="cuda")
        batches = list(DataLoader(list(range(4)), num_workers=1, worker_init_fn=init))
        print(json.dumps(len(batches)))
        """
    )
    assert last_json(r) == 4


def test_torch_cuda_random_is_the_emulated_gpus_generator():
    # Hugging Face's Trainer saves its checkpoints' RNG state through torch.cuda.random.
    r = run_mode(
        """
        import json, torch
        torch.cuda.random.manual_seed(7)
        state = torch.cuda.random.get_rng_state()
        a = torch.rand(4, device="cuda").cpu()
        torch.cuda.random.set_rng_state(state)
        b = torch.rand(4, device="cuda").cpu()
        print(json.dumps([len(state), len(torch.cuda.random.get_rng_state_all()), torch.cuda.random.initial_seed(),
                          bool(torch.equal(a, b))]))
        """,
        EMUGPU_DEVICE_COUNT="2",
        EMUGPU_MODE="compute",
    )
    assert last_json(r) == [16, 2, 7, True]


def test_checkpoints_saved_in_run_mode_are_cudas(tmp_path):
    path = tmp_path / "ckpt.pt"
    r = run_mode(
        f"import torch; torch.save({{'w': torch.ones(3, device='cuda:1')}}, {str(path)!r})", EMUGPU_DEVICE_COUNT="2"
    )
    assert r.returncode == 0, r.stderr
    tags: list[str] = []
    torch.load(path, map_location=lambda storage, location: tags.append(location) or storage)
    assert tags == ["cuda:1"]  # loads on a real GPU machine without map_location
    r = run_mode(
        f"import json, torch; print(json.dumps(str(torch.load({str(path)!r})['w'].device)))", EMUGPU_DEVICE_COUNT="2"
    )
    assert last_json(r) == "emugpu:1"
