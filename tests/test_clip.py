"""optim.clip_norm: the global gradient norm is clipped before the update, bad values refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from bench.optim import build_optimizer, validate
from bench.optim.config import OptimConfig
from bench.registry import ConfigError
from bench.train.runtime import clip_gradients


def _cfg(**kw):
    return SimpleNamespace(**{**OptimConfig().__dict__, **kw})


@pytest.mark.parametrize("update", ["foreach", "flat"])
def test_clip_limits_the_global_norm_and_scales_every_gradient_alike(update):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = build_optimizer(model, _cfg(name="sgd", update=update))
    (model(torch.randn(32, 8)).square().sum() * 1e3).backward()
    before = [p.grad.clone() for p in model.parameters()]
    norm = clip_gradients(model, opt, None, 1.0)
    assert float(norm) > 1.0  # it had something to clip
    after = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert float(after.norm()) == pytest.approx(1.0, rel=1e-4)
    ratio = float(norm) / 1.0
    for b, p in zip(before, model.parameters(), strict=True):
        torch.testing.assert_close(p.grad * ratio, b, rtol=1e-4, atol=1e-6)


def test_negative_clip_norm_is_refused():
    with pytest.raises(ConfigError, match="optim.clip_norm must be >= 0"):
        validate(_cfg(clip_norm=-1.0))
