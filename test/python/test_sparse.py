"""Sparse tensors (COO, CSR) on emugpu, as GNN training uses them: built,
moved, coalesced and multiplied with dense features; costs by nnz."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_emugpu


@pytest.fixture
def compute_mode():
    torch_emugpu.configure(mode="compute")
    yield
    torch_emugpu.configure(mode="timing")


def adjacency(n: int, nnz: int, seed: int = 0, coalesce: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (2, nnz), generator=g)
    a = torch.sparse_coo_tensor(idx, torch.rand(nnz, generator=g), (n, n), check_invariants=False)
    return a.coalesce() if coalesce else a


def test_coo_keeps_its_structure_and_values_through_the_device():
    a = adjacency(50, 300)
    e = a.to("emugpu")
    assert e.layout == torch.sparse_coo and e.device == torch.device("emugpu:0")
    assert e._nnz() == a._nnz() and e.is_coalesced()
    assert e.indices().device.type == "emugpu"
    back = e.cpu()
    assert back.layout == torch.sparse_coo
    torch.testing.assert_close(back.to_dense(), a.to_dense())  # copies move real bytes in timing mode too


def test_members_are_charged_to_device_memory():
    before = torch.emugpu.memory_allocated()
    a = adjacency(1000, 20000)
    e = a.to("emugpu")
    expected = a._nnz() * (2 * 8 + 4)  # int64 indices, float32 values
    assert torch.emugpu.memory_allocated() - before == pytest.approx(expected, abs=2 * 512)
    del e
    assert torch.emugpu.memory_allocated() == before


def test_tensors_of_one_index_land_on_that_device():
    e = adjacency(10, 20).to("emugpu:1")
    assert e.device == torch.device("emugpu:1") and e.values().device == torch.device("emugpu:1")
    assert torch.sparse.mm(e, torch.ones(10, 3, device="emugpu:1")).device == torch.device("emugpu:1")


OPS = {
    "spmm": lambda a, x: torch.sparse.mm(a, x),
    "spmm_csr": lambda a, x: torch.sparse.mm(a.to_sparse_csr(), x),
    "addmm": lambda a, x: torch.addmm(x[:, :20], a, x, beta=0.5, alpha=2.0),
    "dense_times_sparse": lambda a, x: x.t() @ a,
    "mv": lambda a, x: torch.mv(a, x[:, 0]),
    "transpose": lambda a, x: a.t().coalesce().to_dense(),
    "coalesce_duplicates": lambda a, x: (
        torch.sparse_coo_tensor(a.indices().repeat(1, 2), a.values().repeat(2), a.shape).coalesce().to_dense()
    ),
    "sum": lambda a, x: torch.sparse.sum(a, dim=1).to_dense(),
    "add_sparse": lambda a, x: (a + a.t()).to_dense(),
    "mul_scalar": lambda a, x: (a * 3).to_dense(),
    "to_sparse": lambda a, x: (x[:5] * (x[:5] > 0.5)).to_sparse().to_dense(),
    "softmax": lambda a, x: torch.sparse.softmax(a, dim=1).to_dense(),
    "add_dense": lambda a, x: x[:, :20] + a,
    "values": lambda a, x: a.values() * 2,
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_sparse_op_matches_cpu_in_compute_mode(name, compute_mode):
    a, x = adjacency(20, 60), torch.rand(20, 20)
    expected = OPS[name](a, x)
    got = OPS[name](a.to("emugpu"), x.to("emugpu"))
    assert got.device.type == "emugpu"
    torch.testing.assert_close(got.cpu(), expected)


class GCN(torch.nn.Module):
    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(features, hidden)
        self.l2 = torch.nn.Linear(hidden, classes)

    def forward(self, adj: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(torch.sparse.mm(adj, self.l1(x)))
        return torch.sparse.mm(adj, self.l2(h))


def train_gcn(device: str, steps: int, layout: torch.layout = torch.sparse_coo) -> list[float]:
    torch.manual_seed(0)
    adj = adjacency(200, 1200, seed=1)
    adj = (adj if layout == torch.sparse_coo else adj.to_sparse_csr()).to(device)
    x, y = torch.rand(200, 16).to(device), torch.randint(0, 4, (200,)).to(device)
    model = GCN(16, 32, 4).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(adj, x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_gcn_training_matches_cpu_in_compute_mode(layout, compute_mode):
    expected = train_gcn("cpu", 4, layout)
    got = train_gcn("emugpu", 4, layout)
    assert got == pytest.approx(expected, rel=1e-4)
    assert got[-1] < got[0]


def test_sparse_embedding_gradients_train_as_on_cpu(compute_mode):
    def run(device: str) -> torch.Tensor:
        torch.manual_seed(0)
        emb = torch.nn.Embedding(100, 8, sparse=True).to(device)
        opt = torch.optim.SGD(emb.parameters(), lr=0.5)
        for step in range(3):
            idx = torch.tensor([1, 5, 5, 9 + step]).to(device)
            emb(idx).pow(2).sum().backward()
            assert emb.weight.grad.layout == torch.sparse_coo
            opt.step()
            opt.zero_grad()
        return emb.weight.detach().cpu()

    torch.testing.assert_close(run("emugpu"), run("cpu"))


def test_gcn_trains_in_timing_mode():
    losses = train_gcn("emugpu", 3)
    assert len(losses) == 3
    stats = torch.emugpu.engine_stats()
    assert stats["compute_launches"] > 0


def test_timing_mode_products_are_not_computed_on_the_host():
    a, x = adjacency(30, 100).to("emugpu"), torch.ones(30, 4).to("emugpu")  # both copied in: real bytes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the placeholder warning (once per process)
        out = torch.sparse.mm(a, x).cpu()
    assert out.shape == (30, 4) and not out.any()  # a placeholder, as every computed value in timing mode


def product_time(nnz: int, n: int = 10000, features: int = 64) -> float:
    a, x = adjacency(n, nnz).to("emugpu"), torch.empty(n, features, device="emugpu")
    torch.emugpu.synchronize()
    torch.emugpu.reset_engine_stats()
    torch.sparse.mm(a, x)
    torch.emugpu.synchronize()
    return torch.emugpu.engine_stats()["compute_busy_s"]


def test_products_cost_by_stored_entries_not_dense_size():
    few, many = product_time(10_000), product_time(1_000_000)
    assert many > 5 * few
    # The dense product of the same shape costs far more.
    torch.emugpu.reset_engine_stats()
    torch.empty(10000, 10000, device="emugpu") @ torch.empty(10000, 64, device="emugpu")
    torch.emugpu.synchronize()
    assert torch.emugpu.engine_stats()["compute_busy_s"] > 10 * few


def test_coalescing_waits_for_the_device_as_on_cuda():
    a = adjacency(30, 200, coalesce=False).to("emugpu")
    big = torch.empty(8192, 8192, device="emugpu")
    stream = torch.emugpu.current_stream()
    for _ in range(4):
        big @ big  # about 0.3 s of emulated work in all: the host stays ahead even when loaded
    a * 2  # same nnz: asynchronous
    assert not stream.query()
    for _ in range(4):
        big @ big
    a.coalesce()  # the output's nnz depends on the indices: a host sync
    assert stream.query()


def test_mixing_devices_fails_as_on_cuda():
    a = adjacency(10, 20).to("emugpu:0")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.sparse.mm(a, torch.ones(10, 2, device="emugpu:1"))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.sparse.mm(a, torch.ones(10, 2))


def test_ops_without_a_sparse_kernel_say_what_to_do():
    a = adjacency(10, 20).to("emugpu")
    with pytest.raises(NotImplementedError, match="no kernel for sparse tensors.*to_dense"):
        torch.cumsum(a, 0)


def test_repr_shows_the_structure(compute_mode):
    text = repr(adjacency(4, 3).to("emugpu"))
    assert "indices=tensor(" in text and "device='emugpu:0'" in text and "layout=torch.sparse_coo" in text
