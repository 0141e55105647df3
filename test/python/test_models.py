"""Real models train on emugpu in timing mode for several iterations."""

import pytest
import torch
import torchvision

from torch_emugpu import _C
from torch_emugpu.measure.models import GPT, GPTConfig, gpt_loss

TORCHVISION = [
    "resnet18",
    "resnet50",
    "resnet152",
    "alexnet",
    "vgg16",
    "densenet121",
    "mobilenet_v2",
    "mobilenet_v3_large",
    "efficientnet_b0",
    "googlenet",
    "inception_v3",
    "squeezenet1_0",
    "shufflenet_v2_x1_0",
    "regnet_y_400mf",
    "vit_b_16",
    "swin_t",
    "convnext_tiny",
]


def train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, iterations: int = 3) -> float:
    model = model.to("emugpu").train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = x.to("emugpu"), y.to("emugpu")
    _C._reset_engine_stats(0)
    for _ in range(iterations):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.emugpu.synchronize()
    return _C._engine_stats(0)["compute"][1] / 1e9


@pytest.mark.parametrize("name", TORCHVISION)
def test_torchvision_classifier_trains(name):
    kwargs = {"aux_logits": False, "init_weights": False} if name in ("googlenet", "inception_v3") else {}
    model = torchvision.models.get_model(name, **kwargs)
    size = 299 if name == "inception_v3" else 224
    busy = train(model, torch.randn(2, 3, size, size), torch.randint(0, 1000, (2,)))
    assert busy > 0
    params = sum(p.numel() * 4 for p in model.parameters())
    assert torch.emugpu.max_memory_allocated() > 2 * params  # weights, grads, momentum


@pytest.mark.slow
def test_gpt2_small_trains_with_adamw_and_sdpa():
    model = GPT().to("emugpu")
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(124.4e6, rel=0.01)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, 50257, (2, 256)).to("emugpu")
    torch.emugpu.reset_peak_memory_stats()
    for _ in range(3):
        loss = gpt_loss(model, idx, idx)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.emugpu.synchronize()
    # weights + grads + two Adam moments, fp32
    assert torch.emugpu.max_memory_allocated() > 4 * 4 * 124e6


def test_attention_uses_the_fused_kernel_without_materializing_scores():
    cfg = GPTConfig(vocab_size=128, context=4096, layers=1, heads=4, width=128)
    model = GPT(cfg).to("emugpu")
    idx = torch.randint(0, 128, (1, 4096)).to("emugpu")
    torch.emugpu.reset_peak_memory_stats()
    base = torch.emugpu.memory_allocated()
    model(idx).sum().backward()
    scores = 4 * 4096 * 4096 * 4  # one head-batch of L x L fp32 scores
    assert torch.emugpu.max_memory_allocated() - base < scores
