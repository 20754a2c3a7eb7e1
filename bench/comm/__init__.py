"""Gradient communication for DDP: compressors, error feedback, communicators, hooks.

Training integration (used by :mod:`bench.train`)::

    controller = attach(ddp_model, cfg.comm, steps_per_epoch=n)
    controller.set_epoch(epoch)     # before each epoch: dense warm-up, density schedule
    stats = controller.pop_stats()  # after each epoch: per-step means since the last pop
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class DenseController:
    """Plain DDP allreduce (no hook): the control every compressor is compared with."""

    def __init__(self, ddp_model: torch.nn.Module) -> None:
        numel = sum(p.numel() for p in ddp_model.parameters() if p.requires_grad)
        elem = next(ddp_model.parameters()).element_size()
        w = dist.get_world_size() if dist.is_initialized() else 1
        # ring allreduce: each worker sends 2 (w-1)/w of the gradient
        self.bytes_per_step = 2.0 * (w - 1) / w * numel * elem

    def set_epoch(self, epoch: int) -> None:
        pass

    def pop_stats(self) -> dict[str, Any]:
        return {"comm/bytes_per_step": self.bytes_per_step, "comm/density": 1.0}


def attach(ddp_model: torch.nn.Module, cfg: Any, steps_per_epoch: int) -> DenseController:
    if cfg.name != "dense":
        from bench.registry import ConfigError

        raise ConfigError(f"comm={cfg.name} is not available yet; use comm=dense")
    return DenseController(ddp_model)
