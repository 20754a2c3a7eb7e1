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


def test_clip_with_a_gradient_scaler_and_fp16_flat_masters() -> None:
    """train.amp=fp16 with optim.update=flat master_weights=fp16: the model's gradients are
    fp16, which GradScaler.unscale_ refuses; the scaled gradients are clipped instead and
    the scaler's step (the flat optimizer unscales in fp32) still applies them."""
    from bench.optim import after_ddp_broadcast

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = build_optimizer(model, _cfg(name="sgd", update="flat", master_weights="fp16"))
    after_ddp_broadcast(opt)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(torch.randn(32, 8).half()).float().square().mean() * 10
    scaler.scale(loss).backward()
    grads = [p.grad for p in model.parameters()]
    assert any(g.dtype == torch.float16 for g in grads)
    unscaled = torch.stack([g.float().norm() for g in grads]).norm() / 1024.0
    before = [p.detach().clone() for p in model.parameters()]
    norm = clip_gradients(model, opt, scaler, 0.1)
    assert float(norm) == pytest.approx(float(unscaled), rel=1e-3)
    assert float(norm) > 0.1  # it had something to clip
    after = torch.stack([g.float().norm() for g in grads]).norm() / 1024.0
    assert float(after) == pytest.approx(0.1, rel=1e-2)
    scaler.step(opt)
    scaler.update()
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
