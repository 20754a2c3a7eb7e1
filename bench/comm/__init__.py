"""Gradient communication for DDP: top-k selection, error feedback, communicators, hooks.

The library's public surface, for any DDP training::

    state, hook = bench.comm.make_hook("hitopk", density=0.001, model=model)
    ddp_model.register_comm_hook(state, hook)
    torch.save(state.state_dict(), f"hook-rank{rank}.pt")   # and state.load_state_dict(...)
    values, indices = bench.comm.mstopk(x, k)
"""

from __future__ import annotations

from bench.comm.compressors import COMPRESSORS
from bench.comm.config import HookOptions
from bench.comm.hooks import HOOKS, HookSpec, is_sparse, make_hook
from bench.comm.selection import SELECTORS, mstopk, randomk, topk
from bench.comm.state import CommHookState, comm_hook
from bench.comm.stats import CommStats

__all__ = [
    "COMPRESSORS",
    "HOOKS",
    "SELECTORS",
    "CommHookState",
    "CommStats",
    "HookOptions",
    "HookSpec",
    "comm_hook",
    "is_sparse",
    "make_hook",
    "mstopk",
    "randomk",
    "topk",
]
