"""Sharing emugpu tensors between processes (torch.multiprocessing), as CUDA
IPC does: producer/consumer queues, hogwild training on shared parameters.

Children are spawned (the backend refuses a forked child of a process that
used the device) and configure themselves from EMUGPU_* variables.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from conftest import child_env, run_python

import torch_emugpu

pytestmark = pytest.mark.slow  # multi-process runs: scripts/test.sh --fast leaves them out

TIMEOUT = 120  # seconds for any one wait on a child
CTX = mp.get_context("spawn")


def start(target: Any, *args: Any, **env: str) -> Any:
    with child_env(**env):
        p = CTX.Process(target=target, args=args, daemon=True)
        p.start()
    return p


def finish(p: Any) -> None:
    p.join(TIMEOUT)
    if p.is_alive():
        p.kill()
        pytest.fail(f"child {p.pid} still running after {TIMEOUT} s")
    assert p.exitcode == 0, f"child exited with {p.exitcode}"


# --- children (module level, so spawned processes can import them) -----------


def consume(inbox: Any, outbox: Any) -> None:
    """Reads everything the producer sent, reports it, then writes real bytes back."""
    import torch_emugpu

    first = inbox.get(timeout=TIMEOUT)
    report: dict[str, Any] = {"ready_ns": torch_emugpu._C._device_ready_ns(0)}  # before any launch of our own
    second = inbox.get(timeout=TIMEOUT)
    real, low, high, computed = first["real"], first["low"], first["high"], first["computed"]
    report["real"] = real.cpu().tolist()
    report["real_device"] = str(real.device)
    report["real_is_shared"] = real.is_shared()
    report["views_share_storage"] = low.untyped_storage().data_ptr() == high.untyped_storage().data_ptr()
    report["view_gap"] = high.data_ptr() - low.data_ptr()
    report["later_message_same_storage"] = (
        second["low_again"].untyped_storage().data_ptr() == low.untyped_storage().data_ptr()
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report["computed"] = computed.cpu().tolist()
    report["computed_warned"] = any("placeholders" in str(w.message) for w in caught)
    param, int_param = first["param"], first["int_param"]
    report["param"] = (type(param).__name__, param.requires_grad, param.cpu().tolist())
    report["int_param"] = (type(int_param).__name__, int_param.requires_grad, int_param.dtype)
    storage = first["storage"]
    report["storage"] = (
        type(storage).__name__,
        str(storage.device),
        torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage).cpu().tolist(),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated
        typed = first["typed"]
        report["typed"] = (type(typed).__name__, typed.dtype, typed.cpu().tolist())
    report["on_device1"] = (str(first["on_device1"].device), first["on_device1"].cpu().tolist())
    report["empty"] = (str(first["empty"].device), first["empty"].numel())
    report["allocated"] = [torch.emugpu.memory_allocated(d) for d in range(2)]
    report["reserved"] = [torch.emugpu.memory_reserved(d) for d in range(2)]
    real.copy_(torch.full((16,), 7.0))  # a real host-to-device copy into the shared pages
    torch.emugpu.synchronize()
    outbox.put(report)
    inbox.get(timeout=TIMEOUT)  # the producer has read what we wrote


def consume_expecting_error(inbox: Any, outbox: Any) -> None:
    try:
        inbox.get(timeout=TIMEOUT)
        outbox.put(("no error", ""))
    except Exception as e:  # noqa: BLE001 - reported to the parent
        outbox.put((type(e).__name__, str(e)))


def hogwild_worker(model: torch.nn.Module, lock: Any, steps: int) -> None:
    import torch_emugpu

    torch_emugpu.configure(mode="compute")
    opt = torch.optim.SGD(model.parameters(), lr=0.25)
    for _ in range(steps):
        with lock:  # lock-free in real hogwild; here every update must land so the sum is exact
            opt.zero_grad()
            (model.weight.sum() + model.bias.sum()).backward()  # gradient 1 everywhere
            opt.step()
            torch.emugpu.synchronize()


# --- one producer/consumer exchange, read by the tests below -----------------


@pytest.fixture(scope="module")
def exchange() -> Iterator[dict[str, Any]]:
    torch_emugpu.configure(gpu=torch_emugpu._C.DEFAULT_GPU, device_count=2, mode="timing")
    real = torch.arange(16.0).to("emugpu")
    big = torch.arange(32.0).to("emugpu")
    computed = torch.empty(16, device="emugpu") * 2  # timing mode: an op on a placeholder is one
    param = torch.nn.Parameter(torch.ones(3).to("emugpu"))
    int_param = torch.nn.Parameter(torch.arange(3).to("emugpu"), requires_grad=False)
    storage = torch.arange(8, dtype=torch.uint8).to("emugpu").untyped_storage()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        typed = torch.tensor([1.5, 2.5], dtype=torch.float64).to("emugpu").storage()
    on_device1 = torch.arange(4.0).to("emugpu:1")
    empty = torch.empty(0, device="emugpu")
    torch_emugpu._C._emulate_kernel(0, 2.0)  # the consumer's stream must wait for this
    producer_ready = torch_emugpu._C._device_ready_ns(0)
    inbox, outbox = CTX.Queue(), CTX.Queue()
    p = start(consume, inbox, outbox, EMUGPU_DEVICE_COUNT="2")
    inbox.put(
        {
            "real": real,
            "low": big[:16],
            "high": big[16:],
            "computed": computed,
            "param": param,
            "int_param": int_param,
            "storage": storage,
            "typed": typed,
            "on_device1": on_device1,
            "empty": empty,
        }
    )
    inbox.put({"low_again": big[:16]})
    report = outbox.get(timeout=TIMEOUT)
    report["producer_ready"] = producer_ready
    report["producer_sees"] = real.cpu().tolist()
    inbox.put("bye")
    finish(p)
    yield report


def test_the_consumer_reads_the_producers_copied_in_values(exchange):
    assert exchange["real"] == [float(i) for i in range(16)]
    assert exchange["real_device"] == "emugpu:0"
    assert exchange["on_device1"] == ("emugpu:1", [0.0, 1.0, 2.0, 3.0])
    assert exchange["empty"] == ("emugpu:0", 0)


def test_writes_by_the_consumer_are_visible_to_the_producer(exchange):
    assert exchange["producer_sees"] == [7.0] * 16


def test_two_views_of_one_storage_arrive_as_one_storage(exchange):
    assert exchange["views_share_storage"]
    assert exchange["view_gap"] == 16 * 4
    assert exchange["later_message_same_storage"]


def test_parameters_stay_parameters_with_their_requires_grad(exchange):
    assert exchange["param"] == ("Parameter", True, [1.0, 1.0, 1.0])
    assert exchange["int_param"] == ("Parameter", False, torch.int64)


def test_storages_sent_alone_arrive_on_emugpu(exchange):
    assert exchange["storage"] == ("UntypedStorage", "emugpu:0", list(range(8)))
    assert exchange["typed"][1:] == (torch.float64, [1.5, 2.5])


def test_whether_bytes_are_real_travels_with_them(exchange):
    assert exchange["computed"] == [0.0] * 16
    assert exchange["computed_warned"]  # a placeholder in the producer is one in the consumer


def test_opened_memory_is_not_counted_by_the_consumers_allocator(exchange):
    assert exchange["allocated"] == [0, 0]
    assert exchange["reserved"] == [0, 0]


def test_the_consumers_stream_waits_for_the_producers_work(exchange):
    assert exchange["ready_ns"] >= exchange["producer_ready"]


def test_emugpu_tensors_count_as_shared_and_share_memory_is_a_no_op(exchange):
    x = torch.ones(4, device="emugpu")
    ptr = x.data_ptr()
    assert x.share_memory_() is x and x.data_ptr() == ptr
    assert x.is_shared()
    assert exchange["real_is_shared"]


# --- hogwild ------------------------------------------------------------------


def test_hogwild_workers_update_the_shared_parameters():
    model = torch.nn.Linear(8, 4).to("emugpu")
    model.share_memory()
    before = [p.detach().cpu().clone() for p in model.parameters()]
    lock = CTX.Lock()
    workers = [start(hogwild_worker, model, lock, 3) for _ in range(2)]
    for w in workers:
        finish(w)
    for p, b in zip(model.parameters(), before, strict=True):
        torch.testing.assert_close(p.detach().cpu(), b - 2 * 3 * 0.25)  # every step of both workers landed


# --- refusals -----------------------------------------------------------------


def test_a_non_leaf_tensor_requiring_grad_is_refused_as_torch_refuses_it():
    x = torch.ones(3, device="emugpu", requires_grad=True)
    with pytest.raises(RuntimeError, match="Cowardly refusing to serialize non-leaf tensor"):
        ForkingPickler.dumps(x * 2)
    assert len(ForkingPickler.dumps((x * 2).detach())) > 0  # the data alone travels


def test_a_device_the_consumer_lacks_is_an_index_error_naming_both_sides():
    x = torch.arange(4.0).to("emugpu:1")
    inbox, outbox = CTX.Queue(), CTX.Queue()
    p = start(consume_expecting_error, inbox, outbox, EMUGPU_DEVICE_COUNT="1")
    inbox.put(x)
    kind, message = outbox.get(timeout=TIMEOUT)
    finish(p)
    assert kind == "IndexError", message
    assert "emugpu:1" in message and "1 emulated device" in message and "EMUGPU_DEVICE_COUNT" in message


def test_other_tensors_keep_torchs_reducers():
    reduce = ForkingPickler._extra_reducers[torch.Tensor]
    assert reduce(torch.ones(2))[0].__module__ == "torch.multiprocessing.reductions"
    assert reduce(torch.ones(2, device="emugpu"))[0].__module__ == "torch_emugpu.device._sharing"


def test_dataloader_fork_workers_still_deliver_batches_after_emugpu_was_used():
    r = run_python(
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "w = torch.ones(4).to('emugpu')\n"  # the device is in use before the workers fork
        "ds = TensorDataset(torch.arange(64.).view(16, 4))\n"
        "dl = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context='fork')\n"
        "total = sum(b.to('emugpu').cpu().sum().item() for (b,) in dl)\n"
        "print('sum', total, w.cpu().sum().item())",
        timeout=TIMEOUT,
    )
    assert r.returncode == 0, r.stderr
    assert "sum 2016.0 4.0" in r.stdout
