"""Configuration by environment and by torch_emugpu.configure(), with clear errors."""

import pytest
import torch
from conftest import run_python

import torch_emugpu


@pytest.mark.slow
def test_defaults_work_with_nothing_set():
    r = run_python(
        "import torch; print(torch.emugpu.device_count(), torch.emugpu.get_device_name(), torch_emugpu_mode())".replace(
            "torch_emugpu_mode()", "__import__('torch_emugpu').config().mode"
        )
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split(" ", 1)[0] == "1"
    assert "A100" in r.stdout and r.stdout.strip().endswith("timing")


@pytest.mark.slow
def test_environment_selects_gpu_count_and_mode():
    r = run_python(
        "import torch; print(torch.emugpu.device_count(), torch.emugpu.get_device_name(1),"
        " __import__('torch_emugpu').config().mode)",
        env={"EMUGPU_GPU": "Tesla_V100-PCIE-32GB", "EMUGPU_DEVICE_COUNT": "4", "EMUGPU_MODE": "compute"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "4 Tesla V100-PCIE-32GB compute"


@pytest.mark.parametrize(
    "env, message",
    [
        ({"EMUGPU_GPU": "V999"}, "unknown GPU 'V999'"),
        ({"EMUGPU_DEVICE_COUNT": "0"}, "positive number"),
        ({"EMUGPU_DEVICE_COUNT": "-2"}, "positive number"),
        ({"EMUGPU_DEVICE_COUNT": "two"}, "positive integer"),
        ({"EMUGPU_MODE": "fast"}, "expected one of timing, compute"),
    ],
)
@pytest.mark.slow
def test_malformed_environment_is_a_value_error(env, message):
    r = run_python(
        "import torch\ntry:\n    torch.empty(1, device='emugpu')\nexcept ValueError as e:\n    print('ValueError:', e)",
        env=env,
    )
    assert "ValueError:" in r.stdout, r.stdout + r.stderr
    assert message in r.stdout


@pytest.mark.parametrize(
    "name, expected",
    [
        ("v100", "Tesla V100-SXM2-16GB"),
        ("V100-PCIE-32GB", "Tesla V100-PCIE-32GB"),
        ("Tesla V100-PCIE-32GB", "Tesla V100-PCIE-32GB"),
        ("Tesla_V100-PCIE-32GB", "Tesla V100-PCIE-32GB"),
        ("NVIDIA_A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"),
        ("Quadro_RTX_6000", "Quadro RTX 6000"),
        ("H100-SXM", "NVIDIA H100 80GB HBM3"),
        ("h200", "NVIDIA H200"),
    ],
)
def test_gpu_names_match_loosely(name, expected):
    torch_emugpu.configure(gpu=name)
    assert torch.emugpu.get_device_name() == expected


def test_unknown_gpu_lists_known_ones_and_closest_match():
    with pytest.raises(ValueError) as e:
        torch_emugpu.configure(gpu="A100-SXM4-41GB")
    assert "did you mean 'NVIDIA A100-SXM4-40GB'" in str(e.value)
    assert "Tesla K80" in str(e.value) and "NVIDIA H200" in str(e.value)


@pytest.mark.parametrize("count", [0, -1])
def test_bad_device_count_is_a_value_error(count):
    with pytest.raises(ValueError, match="positive number"):
        torch_emugpu.configure(device_count=count)


def test_bad_mode_is_a_value_error():
    with pytest.raises(ValueError, match="timing, compute"):
        torch_emugpu.configure(mode="turbo")


def test_device_index_out_of_range_is_an_index_error():
    with pytest.raises(IndexError, match=r"0 <= index < 2, got 5"):
        torch.emugpu.set_device(5)
    with pytest.raises((IndexError, RuntimeError), match="out of range"):
        torch.empty(1, device="emugpu:7")
    with pytest.raises(IndexError):
        torch.emugpu.get_device_properties(9)


def test_reconfiguring_with_live_tensors_is_refused_but_mode_can_change():
    x = torch.empty(10, device="emugpu")
    with pytest.raises(RuntimeError, match="still holds"):
        torch_emugpu.configure(gpu="t4")
    torch_emugpu.configure(mode="compute")
    assert torch_emugpu.config().mode == "compute"
    del x
    torch_emugpu.configure(gpu="t4")
    assert torch.emugpu.get_device_name() == "Tesla T4"


def test_catalog_has_the_gpus_the_docs_name():
    names = torch_emugpu.gpu_names()
    for needed in [
        "Tesla K80",
        "Tesla M40",
        "Tesla P100-PCIE-16GB",
        "Tesla V100-SXM2-16GB",
        "Tesla V100-PCIE-32GB",
        "Tesla T4",
        "Quadro RTX 6000",
        "NVIDIA A10",
        "NVIDIA A100-SXM4-40GB",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA L4",
        "NVIDIA H100 80GB HBM3",
        "NVIDIA H100 PCIe",
        "NVIDIA H200",
    ]:
        assert needed in names


@pytest.mark.slow
def test_more_devices_after_autograd_ran_is_refused_with_a_clear_error():
    # PyTorch's autograd engine sizes its device threads at the first backward; more devices after that
    # used to end in its INTERNAL ASSERT (engine.cpp) at the next backward on a new device.
    r = run_python(
        """
import torch, torch_emugpu
torch_emugpu.configure(device_count=1)
x = torch.ones(2, device="emugpu", requires_grad=True)
x.sum().backward()
del x
try:
    torch_emugpu.configure(device_count=4)
except RuntimeError as e:
    print("refused:", e)
torch_emugpu.configure(device_count=1)  # as many as the engine has: fine
y = torch.ones(2, device="emugpu", requires_grad=True)
y.sum().backward()
print("backward ok")
"""
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused: configure(): expected at most 1 emulated GPUs once autograd has run, got 4" in r.stdout
    assert "EMUGPU_DEVICE_COUNT=4" in r.stdout and "INTERNAL ASSERT" not in r.stdout + r.stderr
    assert "backward ok" in r.stdout
