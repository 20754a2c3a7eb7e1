"""Optimizers, update modes and learning-rate schedules.

Training integration (used by :mod:`bench.train`)::

    optimizer = build_optimizer(model, cfg.optim)     # after model.to(device), BEFORE DDP
    ddp = DDP(model, **ddp_kwargs(optimizer))          # flat mode owns the gradient buffer
    scheduler = build_scheduler(optimizer, cfg.optim, steps_per_epoch, epochs)  # step() per step

``cfg.update`` chooses how the same arithmetic is computed (the paper's "parallel tensor
operator", section 4): ``naive`` a per-tensor Python loop, ``foreach`` torch's
multi-tensor ops, ``fused`` torch's fused kernels, ``flat`` this package's flat-buffer
optimizers (:mod:`bench.optim.flat`).  Which optimizer supports which mode is in
:data:`MODES`; an unsupported pair is refused by :func:`validate` at configuration time.
Every mode saves and loads the standard torch state-dict format, interchangeably.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from bench.optim.adam import Adam, AdamW, FlatAdam
from bench.optim.flat import FlatOptimizer
from bench.optim.lars import LARS, FlatLARS
from bench.optim.sgd import SGD, FlatSGD
from bench.registry import ConfigError, Registry

OPTIMIZERS: Registry = Registry("optimizer")
UPDATE_MODES = ("naive", "foreach", "fused", "flat")
# update modes each optimizer is built for (LARS has no fused kernel in torch)
MODES: dict[str, tuple[str, ...]] = {
    "sgd": UPDATE_MODES,
    "lars": ("naive", "foreach", "flat"),
    "adam": UPDATE_MODES,
    "adamw": UPDATE_MODES,
}
MASTER_DTYPES = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def param_groups(model: torch.nn.Module, weight_decay: float, no_decay_bn_bias: bool) -> list[dict]:
    """Two groups: decayed weights, and (when excluded) BN parameters and biases with wd 0."""
    if not no_decay_bn_bias:
        return [{"params": [p for p in model.parameters() if p.requires_grad], "weight_decay": weight_decay}]
    decay, no_decay = [], []
    seen: set[int] = set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:  # tied weights appear once
                continue
            seen.add(id(p))
            is_norm = isinstance(module, (torch.nn.modules.batchnorm._NormBase, torch.nn.GroupNorm, torch.nn.LayerNorm))
            (no_decay if is_norm or name == "bias" or p.ndim <= 1 else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def _torch_mode(update: str) -> dict[str, Any]:
    return {"naive": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[update]


def _model_dtype(cfg: Any) -> torch.dtype | None:
    return MASTER_DTYPES[cfg.master_weights]


@OPTIMIZERS.register("sgd")
def _sgd(groups: list[dict], cfg: Any) -> torch.optim.Optimizer:
    kw: dict[str, Any] = dict(lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
    if cfg.update == "flat":
        return FlatSGD(groups, model_dtype=_model_dtype(cfg), **kw)
    return SGD(groups, **kw, **_torch_mode(cfg.update))


@OPTIMIZERS.register("lars")
def _lars(groups: list[dict], cfg: Any) -> torch.optim.Optimizer:
    # BN parameters and biases (the no-decay group) are not layer-adapted either
    for i, g in enumerate(groups):  # param_groups: [decay, no_decay]
        g["lars_adapt"] = i == 0 or not cfg.no_decay_bn_bias
    kw: dict[str, Any] = dict(
        lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
        trust_coefficient=cfg.trust_coefficient, eps=cfg.eps,
    )
    if cfg.update == "flat":
        return FlatLARS(groups, model_dtype=_model_dtype(cfg), **kw)
    return LARS(groups, foreach=cfg.update == "foreach", **kw)


def _adam_family(groups: list[dict], cfg: Any, decoupled: bool) -> torch.optim.Optimizer:
    kw: dict[str, Any] = dict(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)
    if cfg.update == "flat":
        return FlatAdam(groups, decoupled=decoupled, model_dtype=_model_dtype(cfg), **kw)
    return (AdamW if decoupled else Adam)(groups, **kw, **_torch_mode(cfg.update))


@OPTIMIZERS.register("adam")
def _adam(groups: list[dict], cfg: Any) -> torch.optim.Optimizer:
    return _adam_family(groups, cfg, decoupled=False)


@OPTIMIZERS.register("adamw")
def _adamw(groups: list[dict], cfg: Any) -> torch.optim.Optimizer:
    return _adam_family(groups, cfg, decoupled=True)


def validate(cfg: Any) -> None:
    """Configuration-time checks (before any worker starts)."""
    OPTIMIZERS.get(cfg.name)
    if cfg.update not in UPDATE_MODES:
        raise ConfigError(f"optim.update={cfg.update!r}; choose one of: {', '.join(UPDATE_MODES)}")
    modes = MODES.get(cfg.name, UPDATE_MODES)
    if cfg.update not in modes:
        raise ConfigError(
            f"optim.update={cfg.update!r} is not available for optim={cfg.name}; choose one of: {', '.join(modes)}"
        )
    if not cfg.lr > 0:
        raise ConfigError(f"optim.lr must be positive, got {cfg.lr}")
    if cfg.momentum < 0 or cfg.weight_decay < 0:
        raise ConfigError("optim.momentum and optim.weight_decay must be >= 0")
    if cfg.nesterov and cfg.momentum <= 0 and cfg.name in ("sgd", "lars"):
        raise ConfigError("optim.nesterov=true needs optim.momentum > 0")
    if cfg.name == "lars" and not cfg.trust_coefficient > 0:
        raise ConfigError(f"optim.trust_coefficient must be positive, got {cfg.trust_coefficient}")
    if not cfg.eps > 0:
        raise ConfigError(f"optim.eps must be positive, got {cfg.eps}")
    if len(cfg.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.betas):
        raise ConfigError(f"optim.betas must be two numbers in [0, 1), got {list(cfg.betas)}")
    if cfg.master_weights not in MASTER_DTYPES:
        raise ConfigError(f"optim.master_weights={cfg.master_weights!r}; choose one of: off, bf16, fp16")
    if cfg.master_weights != "off" and cfg.update != "flat":
        raise ConfigError(
            f"optim.master_weights={cfg.master_weights} needs optim.update=flat "
            f"(or master_weights=off with optim.update={cfg.update})"
        )
    if cfg.schedule not in ("cosine", "step", "constant"):
        raise ConfigError(f"optim.schedule={cfg.schedule!r}; choose cosine, step or constant")
    if cfg.warmup_epochs < 0:
        raise ConfigError("optim.warmup_epochs must be >= 0")


def build_optimizer(model: torch.nn.Module, cfg: Any) -> torch.optim.Optimizer:
    """The configured optimizer over ``model``'s parameters (call before wrapping in DDP).

    In ``flat`` mode this moves every parameter (same Parameter objects) into the flat
    buffer, and with ``master_weights`` turns the model's parameters into bf16/fp16.
    """
    validate(cfg)
    groups = param_groups(model, cfg.weight_decay, cfg.no_decay_bn_bias)
    return OPTIMIZERS.get(cfg.name)(groups, cfg)


def ddp_kwargs(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Extra ``DistributedDataParallel`` keyword arguments this optimizer needs.

    ``flat``: ``p.grad`` must stay views into the flat gradient buffer, so DDP must copy
    its all-reduced buckets back into ``p.grad`` (its default) instead of re-pointing
    ``p.grad`` at its buckets (``gradient_as_bucket_view=True``; that would still work,
    at the price of one gathering copy per step in :meth:`FlatBucket.gather_grads`).
    """
    if isinstance(optimizer, FlatOptimizer):
        return {"gradient_as_bucket_view": False}
    return {}


def lr_factor(step: int, cfg: Any, steps_per_epoch: int, epochs: int) -> float:
    """Multiplier of the peak lr at a (0-based) optimizer step: linear warm-up then decay."""
    total = max(1, steps_per_epoch * epochs)
    warm = int(round(cfg.warmup_epochs * steps_per_epoch))
    if step < warm:
        s = cfg.warmup_start_factor
        return s + (1.0 - s) * step / warm
    if cfg.schedule == "constant":
        return 1.0
    if cfg.schedule == "step":
        frac = step / total
        return cfg.gamma ** sum(frac >= m for m in cfg.milestones)
    # cosine from the end of the warm-up to the end of the run
    t = min(1.0, (step - warm) / max(1, total - warm))
    f = cfg.final_lr_factor
    return f + (1.0 - f) * 0.5 * (1.0 + math.cos(math.pi * t))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: Any, steps_per_epoch: int, epochs: int):
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, cfg, steps_per_epoch, epochs)
    )


__all__ = [
    "OPTIMIZERS", "UPDATE_MODES", "MODES", "param_groups", "validate", "build_optimizer",
    "build_scheduler", "ddp_kwargs", "lr_factor", "FlatOptimizer", "FlatSGD", "FlatLARS",
    "FlatAdam", "LARS", "SGD", "Adam", "AdamW",
]
