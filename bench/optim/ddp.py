"""Flat optimizers under DistributedDataParallel: masters after DDP's broadcast."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from bench.optim.flat import FlatOptimizer


def after_ddp_broadcast(optimizer: torch.optim.Optimizer, process_group: Any = None) -> None:
    """Call on every rank right after ``DistributedDataParallel(model, ...)`` is built.

    DDP broadcasts rank 0's parameters into the model only: the fp32 masters of a flat
    optimizer stay as each rank built them.  This gives every rank the masters of rank 0
    of ``process_group`` (the group DDP was given; None: the default group), or, without
    an initialized multi-process group, re-derives stale masters from the model.  A
    no-op for optimizers without master weights.
    """
    if not isinstance(optimizer, FlatOptimizer):
        return
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(process_group) > 1:
        src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
        broadcast_masters(optimizer, src, process_group)
    else:
        optimizer.sync_master_from_model()


@torch.no_grad()
def broadcast_masters(optimizer: FlatOptimizer, src: int = 0, group: Any = None) -> None:
    """Every rank takes rank ``src``'s masters and model copy (a collective: call it on
    every rank of ``group``)."""
    optimizer.sync_master_from_model()
    for b in optimizer.buckets:
        if b.has_master:
            dist.broadcast(b.master, src=src, group=group)
            b.model.copy_(b.master)
            b.record_versions()
