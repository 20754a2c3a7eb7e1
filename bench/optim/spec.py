"""The optimizer registry: one frozen :class:`OptimizerSpec` per optimizer name.

A spec carries everything the suite needs to know about an optimizer: how to build it in
torch's update modes (``naive``/``foreach``/``fused``: keyword arguments of a torch
optimizer) and in ``flat`` mode, which modes it supports, and its own configuration
checks.  Each optimizer module (:mod:`bench.optim.sgd`, ``lars``, ``adam``) registers
its specs beside its implementation, so adding an optimizer touches that module only
(and the import in :mod:`bench.optim`); adding an update mode touches
:class:`~bench.optim.config.UpdateMode`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from bench.optim.config import MasterWeights, OptimConfig, UpdateMode
from bench.registry import ConfigError, Registry

# groups, config, torch keyword arguments of the mode -> a torch optimizer
TorchBuilder = Callable[[list[dict], OptimConfig, dict[str, bool]], torch.optim.Optimizer]
# groups, config, low-precision model dtype (None: no master weights) -> a flat optimizer
FlatBuilder = Callable[[list[dict], OptimConfig, torch.dtype | None], torch.optim.Optimizer]


def no_checks(cfg: OptimConfig) -> None:
    """The validator of an optimizer without fields of its own."""


@dataclass(frozen=True)
class OptimizerSpec:
    """How one optimizer is built and checked."""

    name: str
    build_torch: TorchBuilder
    build_flat: FlatBuilder
    modes: frozenset[UpdateMode] = frozenset(UpdateMode)
    validate: Callable[[OptimConfig], None] = no_checks

    def build(self, groups: list[dict], cfg: OptimConfig) -> torch.optim.Optimizer:
        """The optimizer over ``groups`` in the configured update mode."""
        kwargs = UpdateMode(cfg.update).torch_kwargs
        if kwargs is None:
            return self.build_flat(groups, cfg, MasterWeights(cfg.master_weights).dtype)
        return self.build_torch(groups, cfg, kwargs)

    def mode_names(self) -> list[str]:
        """Supported update modes, in the order of :class:`UpdateMode`."""
        return [m.value for m in UpdateMode if m in self.modes]


OPTIMIZERS: Registry[OptimizerSpec] = Registry("optimizer")


def register(spec: OptimizerSpec) -> OptimizerSpec:
    """Add ``spec`` to :data:`OPTIMIZERS` (a second spec of the same name is refused)."""
    return OPTIMIZERS.register(spec.name)(spec)


def check_nesterov(cfg: OptimConfig) -> None:
    """Nesterov momentum needs a momentum (sgd, lars)."""
    if cfg.nesterov and cfg.momentum <= 0:
        raise ConfigError("optim.nesterov=true needs optim.momentum > 0")


def check_betas(cfg: OptimConfig) -> None:
    """Adam's two moment decay rates, each in [0, 1)."""
    if len(cfg.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.betas):
        raise ConfigError(f"optim.betas must be two numbers in [0, 1), got {list(cfg.betas)}")
