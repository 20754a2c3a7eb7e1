"""How the replicas of a run meet: every step through DDP's comm hook (``ddp``), or one
replica per node trained locally and synchronised every H steps through torchft
(LocalSGD, DiLoCo, Streaming DiLoCo, and DiLoCo with a sparse outer exchange: SparseLoCo
and the paper's hierarchical top-k, ``bench.sync.sparse``; torchft is imported by
``bench.sync.replica`` only, in the workers).  The public surface::

    SYNCS.names()                       # the registered strategies (a user adds more)
    validate(cfg.sync, param_tensors=n) # before launch: one line per bad value
    manager = bench.sync.replica.open_manager(...)   # torchft's Manager across the nodes
    strategy = build(cfg.sync, manager, model, optimizer)   # torchft's LocalSGD / DiLoCo
    strategy.state_dict(); strategy.load_state_dict(d)      # its share of a checkpoint
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bench.sync.config import SyncConfig
from bench.sync.strategies import (
    SYNCS,
    SyncSpec,
    is_outer,
    parameter_tensors,
    split_fragments,
    validate,
)


def build(cfg: SyncConfig, manager: Any, model: nn.Module, optimizer: torch.optim.Optimizer) -> Any:
    """torchft's strategy of ``cfg.name`` around ``model`` and its inner ``optimizer``, its
    hooks on the optimizer's step registered (``__exit__`` removes them)."""
    spec = SYNCS.get(cfg.name)
    if spec.build is None:
        raise ValueError(f"sync={cfg.name} has no outer synchronisation")
    return spec.build(manager, model, optimizer, cfg).__enter__()


__all__ = [
    "SYNCS",
    "SyncConfig",
    "SyncSpec",
    "build",
    "is_outer",
    "parameter_tensors",
    "split_fragments",
    "validate",
]
