"""``nocomm``: a DDP communication hook that communicates nothing -- a measurement device,
not a training method.

Each worker's bucket comes back as it went in: its own local gradient, not averaged, no
collective issued, no byte sent.  The workers' models then drift apart (every one trains
on its own shard alone), so a run with it is no data-parallel training and its accuracy
means nothing.  What it measures is the step time of the same ``N`` workers, on the same
cores and with the same per-worker batch, with the gradient exchange removed: the
compute-only step that the scaling study (:mod:`bench.sweeps.scaling`) divides by each
method's step time to get a scaling efficiency that means on one shared machine what it
means on a cluster.  DDP's one broadcast of the initial parameters (at wrapping) still
happens; nothing else crosses a link.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from bench.comm.futures import done
from bench.comm.stats import CommStats


@dataclass
class NoCommState:
    """What the training controller and the saved state read of a hook's state."""

    stats: CommStats = field(default_factory=CommStats)
    step: int = 0
    density: float = 1.0  # unused: nothing is sent
    force_dense: bool = False  # unused
    # no ``nan_check``: the loop then checks the (local) gradients themselves, as for PowerSGD


def nocomm_hook(state: NoCommState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The bucket's own (local) gradient as a completed future: no collective, no bytes."""
    buf = bucket.buffer()
    state.stats.count((0.0, 0.0), 0, buf.numel())
    if bucket.is_last():
        state.step += 1
        state.stats.steps += 1
    return done(buf)


def build_nocomm(opts: Any, topo_groups: Any, pg: Any) -> tuple[NoCommState, Any]:
    """The ``HookSpec.build`` of ``nocomm`` (options, groups and process group unused)."""
    return NoCommState(), nocomm_hook
