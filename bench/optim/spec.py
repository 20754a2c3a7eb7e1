"""The optimizer registry: one :class:`OptimizerSpec` per name (its builders per update
mode, its modes and checks), and what every mode shares: the group keys that name a mode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from bench.optim.config import MasterWeights, OptimConfig, UpdateMode
from bench.registry import ConfigError, Registry

# groups, config, torch keyword arguments of the mode -> a torch optimizer
TorchBuilder = Callable[[list[dict], OptimConfig, dict[str, bool]], torch.optim.Optimizer]
# groups, config, low-precision model dtype (None: no master weights) -> a flat optimizer
FlatBuilder = Callable[[list[dict], OptimConfig, torch.dtype | None], torch.optim.Optimizer]


@dataclass(frozen=True)
class OptimizerSpec:
    name: str
    build_torch: TorchBuilder
    build_flat: FlatBuilder
    modes: frozenset[UpdateMode] = frozenset(UpdateMode)
    validate: Callable[[OptimConfig], None] = lambda cfg: None  # its own fields' checks
    # exchanges its own compressed state in ``step``: trains on each worker's local
    # gradient, so DDP's own gradient allreduce must stay off (comm=nocomm)
    local_gradients: bool = False

    def build(self, groups: list[dict], cfg: OptimConfig) -> torch.optim.Optimizer:
        kwargs = UpdateMode(cfg.update).torch_kwargs
        if kwargs is None:
            return self.build_flat(groups, cfg, MasterWeights(cfg.master_weights).dtype)
        return self.build_torch(groups, cfg, kwargs)

    def mode_names(self) -> list[str]:
        """Supported update modes, in the order of :class:`UpdateMode`."""
        return [m.value for m in UpdateMode if m in self.modes]


OPTIMIZERS: Registry[OptimizerSpec] = Registry("optimizer")

# Group keys that say how the update is computed: a state dict loaded across update modes
# keeps the loading optimizer's values.
MODE_KEYS = ("foreach", "fused", "flat", "differentiable", "capturable")


def keep_mode_keys(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``state_dict`` whose param groups keep ``optimizer``'s own mode keys."""
    groups = []
    for saved, own in zip(state_dict["param_groups"], optimizer.param_groups, strict=False):
        g = {k: v for k, v in saved.items() if k not in MODE_KEYS}
        g.update({k: own[k] for k in MODE_KEYS if k in own})
        groups.append(g)
    groups += state_dict["param_groups"][len(groups) :]  # length mismatch: torch reports it
    return {"state": state_dict["state"], "param_groups": groups}


def fused_kernels_available(device: torch.device) -> bool:
    """Whether torch ships ``_fused_sgd_``/``_fused_adamw_`` kernels for this device type."""
    from torch.optim.optimizer import _get_fused_kernels_supported_devices  # private

    return device.type in _get_fused_kernels_supported_devices()


def register(spec: OptimizerSpec) -> OptimizerSpec:
    return OPTIMIZERS.register(spec.name)(spec)


def check_nesterov(cfg: OptimConfig) -> None:
    if cfg.nesterov and cfg.momentum <= 0:
        raise ConfigError("optim.nesterov=true needs optim.momentum > 0")


def check_betas(cfg: OptimConfig) -> None:
    if len(cfg.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.betas):
        raise ConfigError(f"optim.betas must be two numbers in [0, 1), got {list(cfg.betas)}")
