"""Update-mode keys of param groups, and where torch has fused optimizer kernels."""

from __future__ import annotations

from typing import Any

import torch

# Group keys that say HOW the update is computed, not what it computes: when a state
# dict moves between update modes these keep the values of the optimizer loading it.
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
    try:  # deferred: a private torch helper that older torch releases lack
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        return device.type in _get_fused_kernels_supported_devices()
    except ImportError:  # older torch: CUDA only
        return device.type == "cuda"
