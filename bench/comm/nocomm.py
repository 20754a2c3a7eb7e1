"""``nocomm``: a DDP communication hook that communicates nothing -- a measurement device,
not a training method.

Each worker's bucket comes back as it went in: its own local gradient, not averaged, no
collective issued, no byte sent.  The workers' models then drift apart (every one trains
on its own shard alone), so a run with it is no data-parallel training and its accuracy
means nothing.  What it measures is the step time of the same ``N`` workers, on the same
cores and with the same per-worker batch, with the gradient exchange removed: the
compute-only step that the scaling study (:mod:`bench.sweeps.scaling`) divides by each
method's step time to get a scaling efficiency that means on one shared machine what it
means on a cluster.

The workers are kept in step: the step's last bucket waits for one 4-byte allreduce (a
step barrier, counted as sent), as every method's step waits for its collectives.  Without
it the workers drift apart on the shared cores, and the first scaling runs measured such
drifting compute-only steps at 1.2-3x the step of runs that did communicate (sweeps
``scaling-20261201-231356-194478`` and ``-234403-45ec6c``): no reference.  DDP's one
broadcast of the initial parameters (at wrapping) still happens.
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
    group: Any = None  # the process group of the step barrier (None: the default group)
    multinode: bool = False  # the barrier's bytes cross a node's link
    # no ``nan_check``: the loop then checks the (local) gradients themselves, as for PowerSGD


BARRIER_BYTES = 4  # the step barrier: one float32 element


def nocomm_hook(state: NoCommState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The bucket's own (local) gradient: no gradient sent.  The step's last bucket
    resolves after a one-element allreduce, which keeps the workers in step."""
    buf = bucket.buffer()
    if not bucket.is_last():
        state.stats.count((0.0, 0.0), 0, buf.numel())
        return done(buf)
    state.step += 1
    state.stats.steps += 1
    world = dist.get_world_size(state.group) if dist.is_initialized() else 1
    if world == 1:
        state.stats.count((0.0, 0.0), 0, buf.numel())
        return done(buf)
    traffic = (float(BARRIER_BYTES), float(BARRIER_BYTES) if state.multinode else 0.0)
    state.stats.count(traffic, 1, buf.numel())
    flag = torch.zeros(1, dtype=torch.float32, device=buf.device)
    fut = dist.all_reduce(flag, group=state.group, async_op=True).get_future()
    return fut.then(lambda _: buf)


def build_nocomm(opts: Any, topo_groups: Any, pg: Any) -> tuple[NoCommState, Any]:
    """The ``HookSpec.build`` of ``nocomm`` (options unused; the process group carries the
    step barrier)."""
    multinode = topo_groups is not None and topo_groups.topo.nnodes > 1
    return NoCommState(group=pg, multinode=multinode), nocomm_hook
