"""The optimizer settings the optimizer tests share, and their config without Hydra (the
GPU machine's tests run where omegaconf is missing)."""

from __future__ import annotations

import dataclasses
import enum

import torch

from bench.optim.config import OptimConfig

OPTS = {
    "sgd": dict(name="sgd", lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4),
    "sgd_plain": dict(name="sgd", lr=0.1, momentum=0.9, nesterov=False, weight_decay=1e-3),
    "lars": dict(
        name="lars", lr=2.0, momentum=0.9, nesterov=False, weight_decay=5e-4, trust_coefficient=0.01
    ),
    "lars_nesterov": dict(
        name="lars", lr=2.0, momentum=0.9, nesterov=True, weight_decay=5e-4, trust_coefficient=0.01
    ),
    "adamw": dict(name="adamw", lr=1e-3, weight_decay=0.05, betas=[0.9, 0.98], eps=1e-8),
    "adam": dict(name="adam", lr=1e-3, weight_decay=1e-4, betas=[0.9, 0.999], eps=1e-8),
}


def plain_cfg(**kw) -> OptimConfig:
    """An OptimConfig with the strings of ``kw`` made the typed choices, as composing it
    does (``tests/test_optim.py``'s ``cfg`` composes it with Hydra's omegaconf)."""
    typed = {
        f.name: type(f.default)(kw[f.name])
        for f in dataclasses.fields(OptimConfig)
        if f.name in kw and isinstance(f.default, enum.Enum)
    }
    return OptimConfig(**{**kw, **typed})


def rel_err(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(
        ((x.float() - y.float()).norm() / y.float().norm().clamp_min(1e-30)).item()
        for x, y in zip(a.parameters(), b.parameters(), strict=False)
    )
