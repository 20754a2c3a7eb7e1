"""Gradient communication for DDP: top-k selection, error feedback, communicators, hooks.

The library's public surface, for any DDP training::

    state, hook = bench.comm.make_hook("hitopk", density=0.001, model=model)
    ddp_model.register_comm_hook(state, hook)
    torch.save(state.state_dict(), f"hook-rank{rank}.pt")   # and state.load_state_dict(...)
    values, indices = bench.comm.mstopk(x, k)
"""

from __future__ import annotations

from bench.comm.compressors import COMPRESSORS  # noqa: F401 - the public surface
from bench.comm.config import HookOptions  # noqa: F401
from bench.comm.hooks import HOOKS, HookSpec, is_sparse, make_hook  # noqa: F401
from bench.comm.selection import SELECTORS, mstopk, randomk, topk  # noqa: F401
from bench.comm.state import CommHookState, comm_hook  # noqa: F401
from bench.comm.stats import CommStats  # noqa: F401
