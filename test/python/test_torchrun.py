"""torchrun with emugpu: one emulated node, several emulated nodes on one
machine (on loopback, in network namespaces of their own, with clocks set
apart), and elastic restarts after a rank failure; first the backend's pieces
for several nodes, in this process.

Every torchrun runs in a session of its own with a bounded wait; whatever is
still running at the end (torchrun and the workers it starts in sessions of
their own) is terminated, then killed. The jobs are examples/ddp_resnet.py and
torchrun_job.py next to this file, which prints one `RESULT {json}` line per
rank.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from conftest import REPO, free_port

import torch_emugpu

pytestmark = pytest.mark.slow  # multi-process runs: scripts/test.sh --fast leaves them out

JOB = os.path.join(REPO, "test", "python", "torchrun_job.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
TIMEOUT = 240  # seconds for one test's torchruns together
BIG_MIB = 256  # the timed all_reduce of torchrun_job.py


@dataclass
class Outcome:
    returncode: int | None  # None: still running at the deadline (then killed)
    output: str  # stdout and stderr
    seconds: float

    def results(self) -> list[dict]:
        return [
            json.loads(line.removeprefix("RESULT ")) for line in self.output.splitlines() if line.startswith("RESULT ")
        ]


def _env(**extra: str) -> dict[str, str]:
    # GLOO_SOCKET_IFNAME would hide whether the backend picks its transport's address itself.
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_") and k != "GLOO_SOCKET_IFNAME"}
    env.update(extra)
    return env


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _stop(proc: subprocess.Popen) -> None:
    """Ends `proc` and every process under it (torchrun starts its workers
    in sessions of their own, so its process group alone is not enough)."""
    if proc.poll() is not None:
        return
    tree = _descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)  # torchrun stops its workers on SIGTERM
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass
    for pid in [proc.pid, *tree]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(10)


def run_together(
    commands: list[list[str]], tmp_path: Path, env: dict[str, str], timeout: float = TIMEOUT
) -> list[Outcome]:
    """Starts every command at once and waits for all of them, `timeout`
    seconds at most; each one's output goes to a file (no pipe to fill)."""
    logs = [tmp_path / f"out{i}.log" for i in range(len(commands))]
    procs: list[subprocess.Popen] = []
    start = time.monotonic()
    ended: dict[int, float] = {}
    try:
        for cmd, log in zip(commands, logs, strict=True):
            with open(log, "a") as out:
                procs.append(
                    subprocess.Popen(
                        cmd,
                        env=env,
                        cwd=REPO,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
        while len(ended) < len(procs) and time.monotonic() - start < timeout:
            for i, p in enumerate(procs):
                if i not in ended and p.poll() is not None:
                    ended[i] = time.monotonic() - start
            time.sleep(0.2)
    finally:
        for p in procs:
            _stop(p)
    return [
        Outcome(
            procs[i].returncode if i in ended else None, logs[i].read_text(), ended.get(i, time.monotonic() - start)
        )
        for i in range(len(procs))
    ]


def _describe(outcomes: list[Outcome]) -> str:
    return "\n".join(
        f"--- torchrun {i}: exit {o.returncode} after {o.seconds:.1f} s\n{o.output[-4000:]}"
        for i, o in enumerate(outcomes)
    )


def _two_node_command(node_rank: int, endpoint: str, *extra: str) -> list[str]:
    return [
        *TORCHRUN,
        "--nnodes",
        "2",
        "--node-rank",
        str(node_rank),
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        *extra,
        JOB,
    ]


def _check_two_nodes(outcomes: list[Outcome]) -> list[dict]:
    """The checks every two-node run passes; returns the ranks' results by rank."""
    assert all(o.returncode == 0 for o in outcomes), _describe(outcomes)
    results = sorted((r for o in outcomes for r in o.results()), key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == [0, 1, 2, 3], _describe(outcomes)
    for o in outcomes:  # the two ranks of one torchrun are one node
        assert len({r["node"] for r in o.results()}) == 1, _describe(outcomes)
    model = torch_emugpu._C._collective_time
    gpu = torch_emugpu._C.DEFAULT_GPU
    two_nodes = model("all_reduce", BIG_MIB << 20, gpu, 2, 2)["seconds"]
    one_node = model("all_reduce", BIG_MIB << 20, gpu, 4, 1)["seconds"]
    assert two_nodes > one_node  # the network is slower than NVLink: the check below tells them apart
    for r in results:
        assert r["world"] == 4 and r["local_world"] == 2
        assert r["node"] == r["rank"] // 2 and r["local_rank"] == r["rank"] % 2
        assert r["device_count"] == 2, "the emulated device count must default to LOCAL_WORLD_SIZE"
        assert (r["ranks_per_node"], r["nodes"]) == (2, 2), r
        assert r["all_reduce"] == [10.0, 10.0, 10.0]  # 1 + 2 + 3 + 4
        assert r["ranks"] == [0, 1, 2, 3]
        assert r["checksums"] == results[0]["checksums"] and len(set(r["checksums"])) == 1, "replicas diverged"
        # Subgroups take their topology from where their ranks run, not from LOCAL_WORLD_SIZE.
        node_peer, local_peer = r["rank"] ^ 1, r["rank"] ^ 2
        assert r["subgroups"]["within"] == {"ranks_per_node": 2, "nodes": 1, "sum": r["rank"] + node_peer}, r
        assert r["subgroups"]["across"] == {"ranks_per_node": 1, "nodes": 2, "sum": r["rank"] + local_peer}, r
        assert r["big_launches"] == 1
        assert r["big_busy_ns"] == pytest.approx(two_nodes * 1e9, abs=4), (r, two_nodes, one_node)
    return results


# --- the backend's pieces for several nodes, in this process --------------------


def _in_threads(*calls: Callable[[], Any]) -> list[Any]:
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [f.result(timeout=60) for f in futures]


def _topology(nodes: list[int], size: int) -> tuple[int, int]:
    from torch_emugpu import _C

    return tuple(_C._group_topology(nodes, size))


def _fresh_namespace(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> str:
    from torch_emugpu import _C

    return _C._fresh_namespace(store, rank, size, timeout.total_seconds())


def test_topology_from_the_nodes_of_the_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _topology([0, 0, 1, 1], 4) == (2, 2)
    assert _topology([0, 1], 2) == (1, 2)  # a subgroup across two nodes
    assert _topology([1, 1], 2) == (2, 1)  # one within a node
    assert _topology([0, 0, 1, 1, 1, 1], 6) == (2, 3)  # uneven: never fewer network hops than there are
    assert _topology([0, 0, 0, 1, 1], 5) == (1, 5)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # no launcher named the nodes
    assert _topology([-1, -1, -1, -1], 4) == (2, 2)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert _topology([-1, -1, -1, -1], 4) == (4, 1)


def test_exchange_keys_are_fresh_for_each_instance_of_a_group() -> None:
    # As under torchrun after a restart: the store still holds the keys of
    # the failed attempt, and rank 1 of the new one arrives before rank 0.
    store = dist.HashStore()
    timeout = datetime.timedelta(seconds=30)
    first = _in_threads(lambda: _fresh_namespace(store, 0, 2, timeout), lambda: _fresh_namespace(store, 1, 2, timeout))
    assert first[0] == first[1]

    def late_rank_0() -> str:
        time.sleep(0.5)
        return _fresh_namespace(store, 0, 2, timeout)

    second = _in_threads(late_rank_0, lambda: _fresh_namespace(store, 1, 2, timeout))
    assert second[0] == second[1] != first[0]


def test_the_exchange_listens_on_the_address_facing_the_store() -> None:
    from torch_emugpu import _C

    local = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    assert _C._listen_address(dist.PrefixStore("a/", local)) == "127.0.0.1"  # the store is on this machine
    # A store at a routed address (nothing is sent to it): the source address of that route.
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("203.0.113.7", 1))
            want = probe.getsockname()[0]
    except OSError:
        want = ""  # no route out of this machine
    assert _C._address_towards("203.0.113.7") == want


# --- torchrun ------------------------------------------------------------------


def _ddp_example_on_two_ranks(torchrun: list[str]) -> list[str]:
    """examples/ddp_resnet.py, tiny, on one node of two ranks."""
    example = [os.path.join(REPO, "examples", "ddp_resnet.py"), "--model", "resnet18", "--batch-size", "4"]
    return [*torchrun, "--standalone", "--nproc-per-node", "2", *example, "--iterations", "1"]


def test_torchrun_runs_the_ddp_example_on_one_emulated_node(tmp_path: Path) -> None:
    # torchrun's rendezvous on a free loopback port; the device count comes
    # from its LOCAL_WORLD_SIZE.
    (o,) = run_together([_ddp_example_on_two_ranks(TORCHRUN)], tmp_path, _env())
    assert o.returncode == 0, _describe([o])
    assert "resnet18 DDP on 2 x NVIDIA" in o.output
    assert "rank 0:" in o.output and "rank 1:" in o.output
    assert "host-bound       " in o.output


@pytest.mark.parametrize("launcher", ["module", "script"])
def test_torchrun_under_the_virtual_clock_keeps_its_own_clock_real(tmp_path: Path, launcher: str) -> None:
    # The launcher imports torch (and so torch_emugpu) too: its rendezvous pickles datetimes and its monitor
    # loop sleeps, so it must keep the real clock while its workers run the virtual one.
    torchrun = TORCHRUN if launcher == "module" else [os.path.join(os.path.dirname(sys.executable), "torchrun")]
    cmd = _ddp_example_on_two_ranks(torchrun)
    (o,) = run_together([cmd], tmp_path, _env(EMUGPU_CLOCK="virtual", EMUGPU_HOST="modelled"))
    assert o.returncode == 0, _describe([o])
    assert "resnet18 DDP on 2 x NVIDIA" in o.output
    assert "PicklingError" not in o.output


def test_torchrun_runs_the_fsdp_example_with_tensor_parallelism(tmp_path: Path) -> None:
    # A 1 x 2 mesh: the example's FSDP2 and parallelize_module paths, tiny.
    cmd = [
        *TORCHRUN,
        "--standalone",
        "--nproc-per-node",
        "2",
        os.path.join(REPO, "examples", "fsdp_gpt.py"),
        "--layers",
        "1",
        "--dim",
        "64",
        "--heads",
        "4",
        "--vocab",
        "256",
        "--context",
        "32",
        "--batch-size",
        "2",
        "--iterations",
        "1",
        "--tp",
        "2",
    ]
    (o,) = run_together([cmd], tmp_path, _env())
    assert o.returncode == 0, _describe([o])
    assert "FSDP2 on 2 x NVIDIA" in o.output and "mesh dp=1 x tp=2" in o.output
    assert "rank 0:" in o.output and "rank 1:" in o.output
    assert "host-bound       " in o.output


def test_two_emulated_nodes_on_loopback(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    outcomes = run_together([_two_node_command(n, endpoint) for n in (0, 1)], tmp_path, _env(EMUGPU_MODE="compute"))
    results = _check_two_nodes(outcomes)
    assert all(r["clock_offset_ns"] == 0 for r in results), "one machine, one clock: nothing to align"


def _can_run(cmd: list[str]) -> str | None:
    """None if `cmd` succeeds, else why not."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if r.returncode == 0 else (r.stderr.strip() or f"exit {r.returncode}")


def test_nodes_whose_clocks_differ(tmp_path: Path) -> None:
    # Node 1 runs in a time namespace whose CLOCK_MONOTONIC is 1000 s ahead,
    # as another machine's would be: the backend measures the offset at set-up
    # and exchanges start times in rank 0's clock. Unaligned, node 0's ranks
    # would wait 1000 s in the first collective.
    shift = ["unshare", "--time", "--monotonic", "1000", "--fork"]
    why = _can_run([*shift, "true"])
    if why is not None:
        pytest.skip(f"cannot create a time namespace here (unshare --time, Linux >= 5.6 and CAP_SYS_ADMIN): {why}")
    endpoint = f"127.0.0.1:{free_port()}"
    outcomes = run_together(
        [_two_node_command(0, endpoint), [*shift, *_two_node_command(1, endpoint)]],
        tmp_path,
        _env(EMUGPU_MODE="compute"),
    )
    results = _check_two_nodes(outcomes)
    shifted = {r["rank"] for r in outcomes[1].results()}

    def ahead(rank: int) -> float:
        return 1000e9 if rank in shifted else 0.0

    for r in results:  # offsets are from rank 0's clock, whichever node rendezvous made node 0
        assert r["clock_offset_ns"] == pytest.approx(ahead(r["rank"]) - ahead(0), abs=1e6), r  # within 1 ms
        assert r["big_wall_s"] < 30, r
    # ranks sharing a clock share its offset exactly (their times stay exact among themselves)
    assert len({r["clock_offset_ns"] for r in results if r["rank"] in shifted}) == 1


@pytest.fixture
def network_namespaces() -> Iterator[list[tuple[str, str]]]:
    """Two network namespaces joined by a veth pair, 10.77.0.1 and
    10.77.0.2, each with its loopback up: (namespace, address) per node.
    Deleted afterwards whatever happens."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    if shutil.which("ip") is None:
        pytest.skip("needs `ip` (iproute2; scripts/setup.sh installs it)")
    tag = os.getpid()
    names = [f"emugpu-{tag}-n{i}" for i in (0, 1)]
    veths = [f"emu{tag % 10**8}v{i}" for i in (0, 1)]  # interface names are at most 15 characters
    addresses = ["10.77.0.1", "10.77.0.2"]
    made: list[str] = []

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)

    try:
        try:
            for name in names:
                ip("netns", "add", name)
                made.append(name)
            ip("link", "add", veths[0], "type", "veth", "peer", "name", veths[1])
        except subprocess.CalledProcessError as e:
            pytest.skip(f"cannot create network namespaces here (needs CAP_NET_ADMIN): {e.stderr.strip()}")
        for name, veth, address in zip(names, veths, addresses, strict=True):
            ip("link", "set", veth, "netns", name)
            ip("-n", name, "addr", "add", f"{address}/24", "dev", veth)
            ip("-n", name, "link", "set", "lo", "up")
            ip("-n", name, "link", "set", veth, "up")
        yield list(zip(names, addresses, strict=True))
    finally:
        # Deleting a namespace deletes the veth end inside; one never moved stays here.
        subprocess.run(["ip", "link", "del", veths[0]], capture_output=True, timeout=30)
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def test_two_emulated_nodes_in_network_namespaces(tmp_path: Path, network_namespaces: list[tuple[str, str]]) -> None:
    # As on two machines: each node reaches the other only through its veth.
    # torchrun needs node 0's address as the endpoint, --local-addr (else
    # MASTER_ADDR is the hostname, which resolves to a loopback address here)
    # and is_host on node 0 (the endpoint is not its hostname's address). No
    # GLOO_SOCKET_IFNAME: the backend's TCP transport binds the address facing the store.
    endpoint = f"{network_namespaces[0][1]}:{free_port()}"
    commands = []
    for node, (namespace, address) in enumerate(network_namespaces):
        host = ["--rdzv-conf", "is_host=1"] if node == 0 else []
        commands.append(
            ["ip", "netns", "exec", namespace, *_two_node_command(node, endpoint, "--local-addr", address, *host)]
        )
    _check_two_nodes(run_together(commands, tmp_path, _env(EMUGPU_MODE="compute")))


def test_elastic_restart_after_a_rank_failure(tmp_path: Path) -> None:
    # Rank 1 raises after the first step (DDP's all-reduces done) on the first
    # attempt only; torchrun restarts both ranks, which then finish.
    cmd = [*TORCHRUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", JOB, "--fail-rank", "1"]
    (o,) = run_together([cmd], tmp_path, _env(EMUGPU_MODE="compute"))
    assert o.returncode == 0, _describe([o])
    assert "rank 1: injected failure on attempt 0" in o.output
    results = sorted(o.results(), key=lambda r: r["rank"])
    assert [(r["rank"], r["attempt"]) for r in results] == [(0, 1), (1, 1)], _describe([o])
    for r in results:
        assert r["all_reduce"] == [3.0, 3.0, 3.0] and r["ranks"] == [0, 1]
        assert len(set(r["checksums"])) == 1, "replicas diverged"


def test_rank_failure_without_restarts_fails_the_job(tmp_path: Path) -> None:
    # The other rank must not hang (the process group's timeout is 30
    # minutes): it fails at once in its next collective, or torchrun stops it.
    cmd = [*TORCHRUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "0", JOB, "--fail-rank", "1"]
    (o,) = run_together([cmd], tmp_path, _env(EMUGPU_MODE="compute"), timeout=120)
    assert o.returncode is not None, "the job hung after a rank failed:\n" + _describe([o])
    assert o.returncode != 0, _describe([o])
    assert "rank 1: injected failure on attempt 0" in o.output
    assert o.results() == [], "no rank may finish after another failed"
