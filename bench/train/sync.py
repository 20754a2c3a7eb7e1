"""The outer synchronisation in a worker (``sync`` other than ``ddp``): one replica group per
node, DDP over the node's process group, and torchft's strategy across the nodes every H
steps, its Manager meeting the others at rank 0's Lighthouse (docs/algorithms.md)."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from bench.cluster.lighthouse import ENV, Lighthouse, node_address
from bench.comm.state import stateful
from bench.config import Config
from bench.sync import build, is_outer
from bench.train import runtime


class OuterSync:
    """Nothing for ``ddp`` or one process: :attr:`group` is None and every method does nothing."""

    def __init__(self, cfg: Config | None = None, rank: int = 0, world: int = 1) -> None:
        self.cfg, self.rank = cfg, rank
        self.outer = cfg is not None and is_outer(cfg.sync.name) and dist.is_initialized()
        self.group: Any = None  # DDP's process group: the node's workers
        self.manager: Any = None
        self.strategy: Any = None
        self.state: Any = None  # bench.sync.replica.ReplicaState: the checkpoint's share
        self._seen = -1  # the Manager's step (outer synchronisations) at the last synced()
        self.lighthouse: Lighthouse | None = None
        self._store: Any = None  # the replica group's TCP store (its first worker hosts it)
        if not self.outer:
            return
        self.local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        self.nnodes = world // self.local_world
        self.node, self.local_rank = divmod(rank, self.local_world)
        m = self.local_world
        ranks = [[n * m + j for j in range(m)] for n in range(self.nnodes)]
        self.group, _ = dist.new_subgroups_by_enumeration(ranks)

    def start(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, stats: Any, device: Any
    ) -> OuterSync:
        """Every rank, after DDP: the same weights everywhere, the Lighthouse (rank 0), the
        node's store, the Manager and the strategy's hooks on ``optimizer``'s step."""
        if not self.outer:
            return self
        from bench.sync.replica import ReplicaState, open_manager  # torchft: only here

        for t in model.state_dict().values():  # seeded alike; DDP only broadcast in the node
            dist.broadcast(t, 0)
        host = node_address(os.environ.get("MASTER_ADDR", "127.0.0.1"))
        address = os.environ.get(ENV)
        if not address:
            if self.rank == 0:
                self.lighthouse = Lighthouse(min_replicas=self.nnodes, host=host)
            address = runtime.broadcast_object(self.lighthouse.address if self.lighthouse else None)
        if self.local_rank == 0:
            self._store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
        box = [(host, self._store.port) if self._store is not None else None]
        dist.broadcast_object_list(box, src=self.node * self.local_world, group=self.group)
        cfg = self.cfg
        backend = "nccl" if device.type == "cuda" and cfg.cluster.backend != "gloo" else "gloo"
        self.manager = open_manager(
            node=self.node,
            nnodes=self.nnodes,
            local_rank=self.local_rank,
            local_world=self.local_world,
            lighthouse=address,
            store=box[0],
            hostname=host,
            backend=backend,
            timeout_s=float(cfg.comm.timeout_s),
            quorum_timeout_s=float(cfg.sync.quorum_timeout_s),
            stats=stats,
            node_group=self.group,
        )
        self.strategy = build(cfg.sync, self.manager, model, optimizer)
        stateful(self.strategy, f"sync={cfg.sync.name}: its strategy")
        self.state = ReplicaState(self.strategy, self.manager, model, optimizer)
        return self

    def synced(self) -> bool:
        """Whether an outer synchronisation committed since the last call (the model is global)."""
        if self.manager is None:
            return True
        seen, self._seen = self._seen, self.syncs()
        return self._seen != seen

    def syncs(self) -> int:
        """Outer synchronisations committed (each fragment's, for Streaming DiLoCo)."""
        return self.manager.current_step() if self.manager is not None else 0

    def global_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """Every rank: the model a user would keep (None without an outer sync), each fragment's
        outer parameters at its last sync and the workers' mean of the float buffers."""
        if not self.outer:
            return None
        from torchft.local_sgd import DiLoCo

        frags = self.strategy._fragments if isinstance(self.strategy, DiLoCo) else []
        outer = {
            id(p): f.original_parameters[n]
            for f in frags
            for n, p in f._model_fragment.named_parameters()
        }
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for n, p in model.named_parameters():
            if id(p) in outer:
                state[n] = outer[id(p)].to(p.device, p.dtype, copy=True)
        floats = [n for n, b in model.named_buffers() if b.is_floating_point() and n in state]
        if floats:
            flat = torch.cat([state[n].flatten() for n in floats])
            dist.all_reduce(flat)
            parts = flat.div_(dist.get_world_size()).split([state[n].numel() for n in floats])
            state.update({n: v.view_as(state[n]) for n, v in zip(floats, parts, strict=True)})
        return state

    def pop_stats(self) -> dict[str, float]:
        return self.manager.pop_stats() if self.manager is not None else {}

    def close(self) -> None:
        """Every rank: the strategy's hooks off, the Manager down, then the Lighthouse."""
        if self.strategy is not None:
            self.strategy.__exit__(None, None, None)
            self.strategy = None
        if self.manager is not None:
            dist.barrier()  # no replica still talks to another's Manager
            self.manager.shutdown(wait=False)
            self.manager = None
            dist.barrier()  # every Manager has left the Lighthouse
        if self.lighthouse is not None:
            self.lighthouse.stop()
            self.lighthouse = None
        self._store = None
