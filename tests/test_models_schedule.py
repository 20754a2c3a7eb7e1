"""Models build by name with the right shapes; the lr schedule warms up then decays."""

from __future__ import annotations

import pytest
import torch

from bench.models import MODELS, build_model, validate
from bench.models.config import ModelConfig
from bench.optim import lr_factor
from bench.optim.config import OptimConfig
from bench.registry import ConfigError, Registry


@pytest.mark.parametrize("name", ["resnet9", "resnet18", "resnet50"])
def test_models_forward(name: str) -> None:
    m = build_model(ModelConfig(name=name, width=4), num_classes=7)
    out = m(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 7)


def test_resnet50_is_v15_with_161_parameter_tensors() -> None:
    m = build_model(ModelConfig(name="resnet50", zero_init_residual=True), 1000)
    params = list(m.parameters())
    assert len(params) == 161 and sum(p.numel() for p in params) == 25_557_032
    assert m.layer2[0].conv2.stride == (2, 2)  # v1.5: stride in the 3x3 convolution
    assert torch.all(m.layer1[0].bn3.weight == 0)  # zero-init of the last BN gamma


def test_resnet9_zero_init_residual() -> None:
    m = build_model(ModelConfig(name="resnet9", width=8, zero_init_residual=True), 10)
    zeroed = [mod.res2[1].weight for mod in m.modules() if mod.__class__.__name__ == "Residual"]
    assert len(zeroed) == 2 and all(torch.all(w == 0) for w in zeroed)


def test_registry_refuses_duplicates_and_names_choices() -> None:
    with pytest.raises(KeyError):
        MODELS.register("resnet9")(lambda *a: None)
    r: Registry = Registry("thing")
    with pytest.raises(ConfigError, match="choose one of"):
        r.get("x")


def test_validate_refuses_an_unknown_model_and_a_width_below_one() -> None:
    validate(ModelConfig(name="resnet50"))
    with pytest.raises(ConfigError, match="unknown model 'vgg'; choose one of: resnet18"):
        validate(ModelConfig(name="vgg"))
    with pytest.raises(ConfigError, match="model.width must be >= 1, got 0"):
        validate(ModelConfig(width=0))


def test_warmup_then_cosine_and_step() -> None:
    cfg = OptimConfig(
        warmup_epochs=1, warmup_start_factor=0.1, schedule="cosine", final_lr_factor=0.0
    )
    f = [lr_factor(s, cfg, steps_per_epoch=10, epochs=5) for s in range(50)]
    assert f[0] == pytest.approx(0.1) and f[5] == pytest.approx(0.55)
    assert f[10] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:], f[11:]))  # monotone decay after warm-up
    assert f[49] < 0.01
    cfg = OptimConfig(warmup_epochs=0, schedule="step", milestones=[0.5, 0.75], gamma=0.1)
    assert lr_factor(0, cfg, 10, 4) == 1.0
    assert lr_factor(20, cfg, 10, 4) == pytest.approx(0.1)
    assert lr_factor(30, cfg, 10, 4) == pytest.approx(0.01)
