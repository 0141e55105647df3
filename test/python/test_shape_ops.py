"""Timing mode: every op yields correctly shaped outputs without computing;
copies move real bytes; data-dependent shapes follow the documented policy."""

import pytest
import torch

import torch_emugpu
from torch_emugpu import _C


def emu(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="emugpu")


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.uint8, torch.complex64]
)
def test_host_device_roundtrip_is_bit_identical(dtype):
    src = (torch.randn(7, 13) * 100).to(dtype)
    back = src.to("emugpu").cpu()
    assert back.dtype == dtype
    assert torch.equal(back.view(torch.uint8), src.view(torch.uint8))


def test_non_contiguous_and_converting_copies_keep_values():
    src = torch.arange(24, dtype=torch.float32).view(4, 6)
    d = src.t().to("emugpu")
    assert d.shape == (6, 4)
    assert torch.equal(d.cpu(), src.t())
    half = src.to("emugpu").to(torch.float16)  # device-side dtype conversion of real bytes
    assert torch.equal(half.cpu(), src.half())
    dst = emu(4, 6)
    dst[1:3].copy_(torch.ones(2, 6))
    assert torch.equal(dst[1:3].cpu(), torch.ones(2, 6))
    clone = src.to("emugpu").clone()
    assert torch.equal(clone.cpu(), src)


def test_outputs_have_the_right_shape_dtype_and_strides():
    x = emu(8, 3, 32, 32)
    w = emu(16, 3, 3, 3)
    y = torch.nn.functional.conv2d(x, w, padding=1)
    assert y.shape == (8, 16, 32, 32) and y.device.type == "emugpu"
    cl = x.to(memory_format=torch.channels_last)
    assert cl.stride() == (3072, 1, 96, 3)
    assert (emu(4, 5, dtype=torch.int32) + 1.5).dtype == torch.float32
    assert emu(4, 5).sum(dim=1, keepdim=True).shape == (4, 1)
    a, b = emu(3, 10).split([4, 6], dim=1)
    assert a.shape == (3, 4) and b.shape == (3, 6)


def test_views_share_storage_and_in_place_ops_return_their_input():
    x = emu(4, 6)
    v = x.view(24)
    t = x.t()
    s = x[1:, 2:]
    for view in (v, t, s):
        assert view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert s.storage_offset() == 8 and s.stride() == (6, 1)
    assert x.add_(1) is x
    out = emu(0)
    r = torch.add(x, x, out=out)
    assert r is out and out.shape == (4, 6)  # out= resized
    assert x.unsqueeze_(0) is x and x.shape == (1, 4, 6)


def test_compute_ops_allocate_but_do_not_touch_data():
    before = torch.emugpu.memory_allocated()
    x = emu(1024, 1024)
    y = x * 2
    assert torch.emugpu.memory_allocated() - before == 2 * 4 * 2**20
    assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_computed_values_read_back_as_zero_placeholders():
    n = 1 << 15  # 128 KiB: above the size up to which ops on real bytes are computed (test_small_real.py)
    x = torch.full((n,), 5.0).to("emugpu")
    assert torch.equal(x.cpu(), torch.full((n,), 5.0))  # copied in: real
    y = x + 1
    assert torch.equal(y.cpu(), torch.zeros(n))  # computed: placeholder
    assert y.sum().item() == 0.0
    assert emu(2, dtype=torch.bool).any().item() is False
    x.mul_(3)  # computed in place: the copied-in values are gone
    assert torch.equal(x.cpu(), torch.zeros(n))


def test_data_dependent_shapes_take_their_upper_bound():
    x = emu(5, 4)
    assert torch.nonzero(x).shape == (20, 2)
    mask = emu(5, 4, dtype=torch.bool)
    assert torch.masked_select(x, mask).shape == (20,)
    assert x[mask].shape == (20,)
    assert x[emu(5, dtype=torch.bool)].shape == (5, 4)
    u, inv, counts = torch.unique(x, return_inverse=True, return_counts=True)
    assert u.shape == (20,) and inv.shape == (5, 4) and counts.shape == (20,)
    assert torch.unique(x, dim=0).shape == (5, 4)
    x[mask] = 0.0  # boolean index_put_ runs too
    assert x.shape == (5, 4)


def test_an_op_without_a_shape_rule_names_itself_and_says_what_to_do():
    lib = torch.library.Library("emugpu_test", "DEF")
    lib.define("cpu_only(Tensor x) -> Tensor")
    lib.impl("cpu_only", lambda x: x.clone(), "CPU")
    with pytest.raises(NotImplementedError) as e:
        torch.ops.emugpu_test.cpu_only(emu(3))
    msg = str(e.value)
    assert "emugpu_test::cpu_only" in msg and "no shape rule" in msg and ".cpu()" in msg
    # Compute mode finds shapes first too: the message must not send users there.
    assert "EMUGPU_MODE=compute" not in msg
    torch_emugpu.configure(mode="compute")
    with pytest.raises(NotImplementedError, match="no shape rule"):
        torch.ops.emugpu_test.cpu_only(emu(3))
    del lib


def test_shape_results_are_cached_across_iterations():
    m = torch.nn.Linear(64, 64).to("emugpu")
    x = emu(8, 64)
    for _ in range(2):  # the second iteration accumulates into existing grads: new ops
        m(x).sum().backward()
    _, misses = _C._shape_cache_stats()
    for _ in range(3):
        m(x).sum().backward()
    assert _C._shape_cache_stats()[1] == misses


def test_an_optimizers_changing_step_size_does_not_miss_the_shape_cache():
    # Adam's bias-corrected step size changes every step; an in-place op's scalar cannot change its output's shape.
    m = torch.nn.Linear(64, 64).to("emugpu")
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    x = emu(8, 64)
    for _ in range(2):
        m(x).sum().backward()
        opt.step()
    _, misses = _C._shape_cache_stats()
    for _ in range(3):
        m(x).sum().backward()
        opt.step()
    assert _C._shape_cache_stats()[1] == misses


def test_a_functional_ops_scalar_still_keys_the_shape_cache():
    # Not in place: the scalar is keyed, so a new value is a new entry (arange's shape depends on it).
    _, misses = _C._shape_cache_stats()
    assert torch.arange(0.0, 10.5, device="emugpu").shape == (11,)
    assert torch.arange(0.0, 12.5, device="emugpu").shape == (13,)
    x = emu(4)
    torch.add(x, x, alpha=0.5)
    torch.add(x, x, alpha=0.25)
    assert _C._shape_cache_stats()[1] >= misses + 2


def test_factories_and_random_ops_produce_device_tensors():
    for t in (
        torch.zeros(3, 4, device="emugpu"),
        torch.ones(2, device="emugpu"),
        torch.randn(5, device="emugpu"),
        torch.arange(10, device="emugpu"),
        torch.full((2, 2), 3.0, device="emugpu"),
        torch.randint(0, 5, (4,), device="emugpu"),
        torch.randperm(6, device="emugpu"),
        torch.linspace(0, 1, 7, device="emugpu"),
    ):
        assert t.device.type == "emugpu"
    assert torch.arange(10, device="emugpu").shape == (10,)
    assert torch.nn.functional.dropout(emu(4, 4), 0.5).shape == (4, 4)


def test_save_load_and_storage_operations_keep_real_bytes(tmp_path):
    w = torch.arange(6.0).view(2, 3).to("emugpu")
    torch.save({"w": w}, tmp_path / "ckpt.pt")
    loaded = torch.load(tmp_path / "ckpt.pt")
    assert loaded["w"].device.type == "emugpu"
    assert torch.equal(loaded["w"].cpu(), torch.arange(6.0).view(2, 3))
    s = w.untyped_storage()
    assert torch.equal(torch.frombuffer(bytearray(s.cpu()), dtype=torch.float32), torch.arange(6.0))
    s.resize_(48)
    assert s.nbytes() == 48
    t = emu(0)
    t.set_(w.untyped_storage(), 2, (2,), (1,))
    assert torch.equal(t.cpu(), torch.tensor([2.0, 3.0]))


def test_data_dependent_ops_use_real_values_where_the_inputs_hold_them():
    labels = torch.tensor([0, 2, 2, 5]).to("emugpu")
    assert torch.equal(torch.bincount(labels).cpu(), torch.tensor([1, 0, 2, 0, 0, 1]))
    assert torch.equal(torch.nonzero(labels).cpu().flatten(), torch.tensor([1, 2, 3]))
    assert torch.equal(torch.unique(labels).cpu(), torch.tensor([0, 2, 5]))


def test_value_dependent_sizes_without_a_bound_ask_for_real_inputs():
    counts = emu(4, dtype=torch.long)  # a placeholder: never copied in
    with pytest.raises(NotImplementedError, match="aten::bincount.*depends on input values"):
        torch.bincount(counts)
    with pytest.raises(NotImplementedError, match="output_size"):
        torch.repeat_interleave(emu(4, 2), counts, dim=0)
    assert torch.repeat_interleave(emu(4, 2), counts, dim=0, output_size=9).shape == (9, 2)


def test_equal_compares_real_bytes_and_placeholders():
    a = torch.arange(4).to("emugpu")
    assert torch.equal(a, a.clone())
    assert not torch.equal(a, torch.arange(1, 5).to("emugpu"))
    assert torch.equal(emu(3) * 2, torch.zeros(3).to("emugpu"))  # a placeholder reads as zeros


def test_recurrent_layers_train():
    for layer in (torch.nn.LSTM(8, 16, num_layers=2), torch.nn.GRU(8, 16)):
        layer = layer.to("emugpu")
        out, _ = layer(emu(5, 3, 8))
        out.sum().backward()
        assert out.shape == (5, 3, 16)
        assert all(p.grad is not None for p in layer.parameters())


def test_convolutions_keep_cudnns_channels_last_format():
    # As cuDNN does on CUDA: a channels-last input (or weight) gives a channels-last output and gradients,
    # so that a channels_last model stays NHWC after its first layer.
    cl = torch.channels_last
    conv = torch.nn.Conv2d(8, 16, 3, padding=1).to("emugpu").to(memory_format=cl)
    x = emu(2, 8, 6, 6).contiguous(memory_format=cl).requires_grad_()
    y = conv(x)
    assert y.is_contiguous(memory_format=cl)
    y.sum().backward()
    assert x.grad is not None and x.grad.is_contiguous(memory_format=cl)
    assert conv.weight.grad is not None and conv.weight.grad.is_contiguous(memory_format=cl)
    # Contiguous tensors stay contiguous.
    plain = torch.nn.Conv2d(8, 16, 3, padding=1).to("emugpu")
    assert plain(emu(2, 8, 6, 6)).is_contiguous()
