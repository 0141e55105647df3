"""The emugpu device is registered with stock PyTorch, by autoload or by import."""

import pytest
import torch
from conftest import run_python


@pytest.mark.slow
def test_import_torch_alone_registers_emugpu():
    r = run_python("import torch; t = torch.ones(2, device='emugpu'); print(t.device, hasattr(torch, 'emugpu'))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["emugpu:0", "True"]


@pytest.mark.slow
def test_autoload_can_be_turned_off_and_explicit_import_still_works():
    r = run_python("import torch; print(hasattr(torch, 'emugpu'))", env={"EMUGPU_AUTOLOAD": "0"})
    assert r.stdout.strip() == "False", r.stderr
    r = run_python(
        "import torch, torch_emugpu; print(torch.ones(1, device='emugpu').device)", env={"EMUGPU_AUTOLOAD": "0"}
    )
    assert r.stdout.strip() == "emugpu:0", r.stderr


@pytest.mark.slow
def test_autoload_stays_off_on_a_cuda_machine_unless_asked():
    fake_cuda = "import torch; torch.cuda.is_available = lambda: True\n"
    code = (
        fake_cuda + "from torch_emugpu_autoload import autoload; import sys\n"
        "sys.modules.pop('torch_emugpu', None); autoload(); print('torch_emugpu' in sys.modules)"
    )
    r = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.stdout.strip() == "False", r.stderr
    r = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "EMUGPU_AUTOLOAD": "1"})
    assert r.stdout.strip() == "True", r.stderr


def test_generated_tensor_module_and_storage_methods():
    t = torch.ones(3)
    d = t.emugpu()
    assert d.is_emugpu and d.device == torch.device("emugpu", 0)
    m = torch.nn.Linear(2, 2).emugpu()
    assert all(p.device.type == "emugpu" for p in m.parameters())
    assert d.untyped_storage().is_emugpu
    assert torch.device("emugpu:1").index == 1


def test_device_guard_moves_work_to_the_named_device():
    x = torch.ones(2, device="emugpu:1")
    y = x + x
    assert y.device == torch.device("emugpu", 1)
    with torch.emugpu.device(1):
        assert torch.emugpu.current_device() == 1
        assert torch.empty(1, device="emugpu").device.index == 1
    assert torch.emugpu.current_device() == 0


def test_torch_accelerator_sees_emugpu():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator().type == "emugpu"
    assert torch.accelerator.device_count() == 2
    before = torch.accelerator.memory_allocated()
    x = torch.empty(1 << 20, device="emugpu")
    assert torch.accelerator.memory_allocated() - before == 4 << 20
    del x
    torch.accelerator.synchronize()


def test_default_generator_and_seeding():
    torch.emugpu.manual_seed(1234)
    assert torch.emugpu.initial_seed() == 1234
    state = torch.emugpu.get_rng_state()
    assert state.dtype == torch.uint8 and state.numel() > 0
    g = torch.Generator(device="emugpu")
    assert g.device.type == "emugpu"
    assert torch.randn(4, device="emugpu", generator=g).shape == (4,)


def test_torch_accelerator_streams_devices_and_memory():
    torch.accelerator.set_device_index(1)
    assert torch.accelerator.current_device_index() == 1
    torch.accelerator.set_device_index(0)
    s = torch.Stream(device="emugpu")
    torch.accelerator.set_stream(s)
    assert torch.accelerator.current_stream() == s
    torch.accelerator.set_stream(torch.emugpu.default_stream())
    x = torch.empty(1 << 20, device="emugpu")
    assert torch.accelerator.max_memory_allocated() >= x.nbytes
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] >= x.nbytes
    del x
    torch.accelerator.empty_cache()
