"""One replica group (a node's workers) as torchft sees it: the Manager that meets the
other nodes through a Lighthouse, counting the bytes of each outer allreduce, and the
state a replica holds that the others do not (its checkpoint share).

Fault tolerance is off: every node must join each quorum (``min_replica_size`` = the
nodes) and a failed commit ends the run (``max_retries=0``); the run's elastic restart
resumes it from its last checkpoint instead.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

os.environ.setdefault("RUST_LOG", "warn")  # torchft's servers log every quorum otherwise

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torchft.manager import Manager  # noqa: E402

from bench.comm import CommStats  # noqa: E402
from bench.comm.cost import Stage, Traffic  # noqa: E402

#: where an outer synchronisation spends its time, each a curve column ``sync/<phase>_s``
#: (seconds per synchronisation): ``quorum`` every node meeting at the Lighthouse (it waits
#: for the slowest), ``send`` the pseudo-gradient made and its allreduce started, ``finish``
#: waiting for that allreduce, the outer step and the commit
SYNC_PHASES = ("quorum", "send", "finish")


class CountingManager(Manager):
    """torchft's Manager, counting every outer allreduce into ``stats`` (the run's comm
    statistics): a worker's ring bytes among the nodes, and ``link_share`` times that
    leaving its node (each of the node's workers runs its own ring across the nodes); and
    timing each synchronisation's phases (:data:`SYNC_PHASES`)."""

    def __init__(self, *args: Any, stats: CommStats | None, link_share: int, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.stats = stats
        self.link_share = link_share
        self.syncs = 0  # outer synchronisations (commits) since the last pop
        self.sync_bytes = 0.0  # bytes this worker sent in them
        self.phase_s = dict.fromkeys(SYNC_PHASES, 0.0)  # host seconds in each, summed

    def start_quorum(self, *args: Any, **kw: Any) -> None:
        t0 = time.perf_counter()
        try:
            super().start_quorum(*args, **kw)
        finally:
            self.phase_s["quorum"] += time.perf_counter() - t0

    def timed(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, its host time added to ``phase`` (one of :data:`SYNC_PHASES`)."""
        if phase not in self.phase_s:
            raise ValueError(f"unknown sync phase {phase!r}; the phases are {SYNC_PHASES}")

        @functools.wraps(fn)
        def run(*args: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.phase_s[phase] += time.perf_counter() - t0

        return run

    def allreduce(self, tensor: torch.Tensor, *args: Any, **kw: Any) -> Any:
        self.wait_quorum()
        n = max(1, self.num_participants())
        b = 2 * (n - 1) / n * tensor.numel() * tensor.element_size()
        self.sync_bytes += b
        if self.stats is not None and n > 1:
            stage = Stage("outer_allreduce", b, b * self.link_share, 2 * (n - 1), True)
            self.stats.count(Traffic((stage,)), sent=0.0, numel=0.0)  # density unchanged
        return super().allreduce(tensor, *args, **kw)

    def should_commit(self, *args: Any, **kw: Any) -> bool:
        self.syncs += 1
        return super().should_commit(*args, **kw)

    def pop_stats(self) -> dict[str, float]:
        """Outer synchronisations since the last pop, the bytes each sent and the seconds
        each spent in each phase."""
        per = max(1, self.syncs)
        out = {
            "sync/outer_syncs": float(self.syncs),
            "sync/outer_bytes_per_sync": self.sync_bytes / per,
            **{f"sync/{k}_s": v / per for k, v in self.phase_s.items()},
        }
        self.syncs, self.sync_bytes = 0, 0.0
        self.phase_s = dict.fromkeys(SYNC_PHASES, 0.0)
        return out


def open_manager(
    *,
    node: int,
    nnodes: int,
    local_rank: int,
    local_world: int,
    lighthouse: str,
    store: tuple[str, int],
    hostname: str,
    backend: str = "gloo",
    timeout_s: float = 600.0,
    quorum_timeout_s: float = 1800.0,
    stats: CommStats | None = None,
) -> CountingManager:
    """The Manager of worker ``local_rank`` of node ``node``'s replica group: its group's
    own TCP ``store`` (host, port), the cross-node process group of ``backend`` (the
    workers of this local rank on every node), reached at ``hostname``."""
    from torchft import ProcessGroupGloo, ProcessGroupNCCL

    timeout = timedelta(seconds=timeout_s)
    pg = ProcessGroupNCCL(timeout) if backend == "nccl" else ProcessGroupGloo(timeout)
    return CountingManager(
        pg=pg,
        load_state_dict=None,
        state_dict=None,
        min_replica_size=nnodes,  # fault tolerance off: every node, every time
        use_async_quorum=False,  # DiLoCo's requirement
        timeout=timeout,
        quorum_timeout=timedelta(seconds=quorum_timeout_s),
        connect_timeout=timeout,
        rank=local_rank,
        world_size=local_world,
        store_addr=store[0],
        store_port=store[1],
        lighthouse_addr=lighthouse,
        replica_id=f"node{node}",
        hostname=hostname,
        init_sync=False,  # every replica starts from the same seeded weights
        max_retries=0,  # a failed commit ends the run
        stats=stats,
        link_share=local_world,
    )


class ReplicaState:
    """What one replica holds that the others do not, as torch's ``Stateful``: its model
    and inner optimizer (they drift apart between synchronisations), the step within the
    period, the Manager's step (which fragment is next) and, for DiLoCo, each fragment's
    last global weights, outer optimizer and an averaged pseudo-gradient not yet applied.
    (torchft keeps these in its objects without a state dict of its own: read here.)"""

    def __init__(
        self, strategy: Any, manager: Manager, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        self.strategy, self.manager, self.model, self.optimizer = (
            strategy,
            manager,
            model,
            optimizer,
        )

    def _fragments(self) -> list[Any]:
        return list(getattr(self.strategy, "_fragments", []))  # torchft DiLoCo's

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "local_step": int(self.strategy._local_step),
            "manager": self.manager.state_dict(),
            "fragments": [
                {
                    "global": {k: v.clone() for k, v in f.original_parameters.items()},
                    "outer_optimizer": f._outer_optimizer.state_dict(),
                    "pending": self._pending(f),
                }
                for f in self._fragments()
            ],
        }

    @staticmethod
    def _pending(fragment: Any) -> dict[str, torch.Tensor] | None:
        """The averaged pseudo-gradient of a fragment whose allreduce is in flight (Streaming
        DiLoCo between a fragment's send and its outer step), waited for; else None."""
        if not fragment._allreduce_work:
            return None
        for work in fragment._allreduce_work:
            work.wait()
        return {k: g.clone() for k, g in fragment._grads.items()}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.model.load_state_dict(d["model"])
        self.optimizer.load_state_dict(d["optimizer"])
        self.strategy._local_step = int(d["local_step"])
        self.manager.load_state_dict(d["manager"])
        pending = False
        for f, saved in zip(self._fragments(), d["fragments"], strict=True):
            for k, v in saved["global"].items():
                f.original_parameters[k].copy_(v)
            f._outer_optimizer.load_state_dict(saved["outer_optimizer"])
            if saved.get("pending") is not None:  # its outer step is still to come
                from torchft.work import _DummyWork

                f._grads = {k: g.clone() for k, g in saved["pending"].items()}
                f._allreduce_work = [_DummyWork(None)]
                pending = True
        if pending:  # the quorum its send joined: every replica meets again, as it resumes
            self.manager.start_quorum()
