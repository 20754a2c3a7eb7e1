"""One replica group (a node's workers) as torchft sees it: its Manager, counting the bytes and
timing the phases of each outer synchronisation, and the replica's own state (its checkpoint
share).  Fault tolerance is off: every node joins each quorum and a failed commit ends the
run, which an elastic restart resumes from its last checkpoint."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

os.environ.setdefault("RUST_LOG", "warn")  # torchft's servers log every quorum otherwise

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torchft.local_sgd import DiLoCo, LocalSGD  # noqa: E402
from torchft.manager import Manager  # noqa: E402

from bench.comm import CommStats  # noqa: E402
from bench.comm.cost import Stage, Traffic  # noqa: E402

#: where an outer synchronisation spends its time, each a curve column ``sync/<phase>_s``
#: (s per sync): every node meeting at the Lighthouse, the pseudo-gradient made and its
#: allreduce started, waiting for that allreduce with the outer step and the commit
SYNC_PHASES = ("quorum", "send", "finish")
#: a sparse exchange's packet, each a curve column ``sync/packet_<section>_bytes`` (per sync)
PACKET = ("values", "indices", "scales")


class CountingManager(Manager):
    """torchft's Manager, counting each outer collective into ``stats`` (a worker's ring bytes,
    ``link_share`` times that leaving its node) and timing each sync's phases."""

    def __init__(
        self,
        *args: Any,
        stats: CommStats | None,
        link_share: int,
        node_group: Any = None,
        **kw: Any,
    ) -> None:
        super().__init__(*args, **kw)
        self.stats = stats
        self.link_share = link_share  # m: the node's workers, each running its own ring
        self.local_world, self.local_rank = self._group_world_size, self._group_rank
        self.node_group = node_group  # the node's workers' process group (None: one a node)
        self.syncs = 0  # outer synchronisations (commits) since the last pop
        self.sync_bytes = 0.0  # bytes this worker sent in them
        self.packet = dict.fromkeys(PACKET, 0.0)  # a sparse exchange's packets, by section
        self.phase_s = dict.fromkeys(SYNC_PHASES, 0.0)  # host seconds in each, summed

    def start_quorum(self, *args: Any, **kw: Any) -> None:
        self.timed("quorum", super().start_quorum)(*args, **kw)

    def timed(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, its host time added to ``phase``."""
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

    def count(self, stage: Stage) -> None:
        """This worker's bytes of one collective, into the sync's and the run's stats."""
        self.sync_bytes += stage.worker_bytes
        if self.stats is not None and stage.worker_bytes > 0:
            self.stats.count(Traffic((stage,)), sent=0.0, numel=0.0)  # density unchanged

    def allreduce(self, tensor: torch.Tensor, *args: Any, **kw: Any) -> Any:
        self.wait_quorum()
        n = max(1, self.num_participants())
        b = 2 * (n - 1) / n * tensor.numel() * tensor.element_size()
        self.count(Stage("outer_allreduce", b, b * self.link_share, 2 * (n - 1), True))
        return super().allreduce(tensor, *args, **kw)

    def allgather(self, packet: torch.Tensor) -> tuple[Any, list[torch.Tensor]]:
        """``packet`` (uint8) to this local rank's worker on every node, as torchft's
        ``allreduce`` runs: its Work, and the packets in replica rank order."""
        from torch.distributed.distributed_c10d import AllgatherOptions
        from torchft.manager import _ManagedWork
        from torchft.work import _DummyWork

        if self.errored():
            return _DummyWork(None), [packet.new_zeros(packet.numel())]
        self.wait_quorum()
        n = max(1, self.num_participants())
        if not self.is_participating():
            packet.zero_()
        b = float((n - 1) * packet.numel())
        self.count(Stage("outer_allgather", b, b * self.link_share, n - 1, True))
        out = [packet.new_empty(packet.numel()) for _ in range(n)]
        try:
            work = self._pg.allgather([out], [packet], AllgatherOptions())
            return _ManagedWork(self, work, out), out
        except Exception as e:  # as torchft's allreduce: the commit fails, the run ends
            self._logger.exception(f"got exception in all gather -- skipping remaining: {e}")
            self.report_error(e)
            return _DummyWork(None), out

    def note_packet(self, packet: Any) -> None:
        for k in PACKET:
            self.packet[k] += getattr(packet, k)

    def should_commit(self, *args: Any, **kw: Any) -> bool:
        self.syncs += 1
        return super().should_commit(*args, **kw)

    def pop_stats(self) -> dict[str, float]:
        """Syncs since the last pop; bytes and seconds of each phase per sync."""
        per = max(1, self.syncs)
        out = {
            "sync/outer_syncs": float(self.syncs),
            "sync/outer_bytes_per_sync": self.sync_bytes / per,
            **{f"sync/{k}_s": v / per for k, v in self.phase_s.items()},
        }
        if any(self.packet.values()):  # a sparse exchange: its packet by section
            out.update({f"sync/packet_{k}_bytes": v / per for k, v in self.packet.items()})
        self.syncs, self.sync_bytes = 0, 0.0
        self.packet = dict.fromkeys(PACKET, 0.0)
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
    node_group: Any = None,
) -> CountingManager:
    """The Manager of worker ``local_rank`` of node ``node`` (``store``: its group's TCP store;
    ``node_group``: the node's workers)."""
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
        node_group=node_group,
    )


class LocalSGDSync(LocalSGD):
    """torchft's LocalSGD, its averages timed; its state: the step within the period."""

    def __init__(self, manager: Any, model: nn.Module, opt: Any, *, sync_every: int) -> None:
        super().__init__(manager, model, opt, sync_every=sync_every)
        self._perform_sync = manager.timed("finish", self._perform_sync)  # average, wait, commit

    def state_dict(self) -> dict[str, Any]:
        return {"local_step": int(self._local_step)}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self._local_step = int(d["local_step"])


class DiLoCoSync(DiLoCo):
    """torchft's DiLoCo, each fragment's send and finish timed; its state: the step within the
    period, and per fragment its global weights, outer optimizer, pending averaged
    pseudo-gradient and exchange; ``exchanges`` replace the fragments' dense allreduce."""

    def __init__(
        self,
        manager: Any,
        fragments: list[nn.Module],
        inner: Any,
        outer: list[Any],
        *,
        sync_every: int,
        fragment_sync_delay: int = 0,
        exchanges: list[Any] | None = None,
    ) -> None:
        super().__init__(
            manager, fragments, inner, outer, sync_every, fragment_sync_delay=fragment_sync_delay
        )
        self.exchanges = list(exchanges or [])
        for f, ex in zip(self._fragments, self.exchanges, strict=bool(self.exchanges)):
            f._average_grads = functools.partial(ex.send, f)
        for f in self._fragments:  # each fragment's send, and its wait, outer step, commit
            f.prepare_sync = manager.timed("send", f.prepare_sync)
            f.perform_sync = manager.timed("finish", f.perform_sync)

    def state_dict(self) -> dict[str, Any]:
        out = [
            {
                "global": {k: v.clone() for k, v in f.original_parameters.items()},
                "outer_optimizer": f._outer_optimizer.state_dict(),
                "pending": _pending(f),
                **({"exchange": self.exchanges[i].state_dict()} if self.exchanges else {}),
            }
            for i, f in enumerate(self._fragments)
        ]
        return {"local_step": int(self._local_step), "fragments": out}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """After the Manager's (whose step says which fragment is next)."""
        from torchft.work import _DummyWork

        self._local_step = int(d["local_step"])
        pending = False
        for i, (f, saved) in enumerate(zip(self._fragments, d["fragments"], strict=True)):
            for k, v in saved["global"].items():
                f.original_parameters[k].copy_(v)
            f._outer_optimizer.load_state_dict(saved["outer_optimizer"])
            if self.exchanges:
                self.exchanges[i].load_state_dict(saved["exchange"])
            if saved["pending"] is not None:  # its outer step is still to come
                f._grads = {k: g.clone() for k, g in saved["pending"].items()}
                f._allreduce_work = [_DummyWork(None)]
                pending = True
        if pending:  # the quorum its send joined: every replica meets again, as it resumes
            self._manager.start_quorum()


def _pending(fragment: Any) -> dict[str, torch.Tensor] | None:
    """A fragment's averaged pseudo-gradient whose outer step is to come, or None."""
    if not fragment._allreduce_work:
        return None
    for work in fragment._allreduce_work:
        work.wait()
    return {k: g.clone() for k, g in fragment._grads.items()}


@dataclass
class ReplicaState:
    """What a replica holds that the others do not, as a ``Stateful``: model, inner optimizer,
    the Manager's step (which fragment is next) and the strategy's state."""

    strategy: Any
    manager: Manager
    model: nn.Module
    optimizer: torch.optim.Optimizer

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "manager": self.manager.state_dict(),
            **self.strategy.state_dict(),
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.model.load_state_dict(d["model"])
        self.optimizer.load_state_dict(d["optimizer"])
        self.manager.load_state_dict(d["manager"])
        self.strategy.load_state_dict(d)
