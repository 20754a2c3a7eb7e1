"""Node topology (ranks node-major, as torchrun lays them out) and the intra-node and
inter-node process groups of hierarchical collectives.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from bench.comm.futures import Lane
from bench.registry import ConfigError


@dataclass(frozen=True)
class Topology:
    world_size: int
    procs_per_node: int  # m: workers per node
    rank: int

    @property
    def nnodes(self) -> int:  # n
        return self.world_size // self.procs_per_node

    @property
    def node(self) -> int:
        return self.rank // self.procs_per_node

    @property
    def local_rank(self) -> int:
        return self.rank % self.procs_per_node


def check_topology(world_size: int, procs_per_node: int) -> None:
    """Raise ConfigError unless ``procs_per_node`` splits ``world_size`` into whole nodes."""
    if procs_per_node < 1:
        raise ConfigError(f"procs_per_node must be >= 1, got {procs_per_node}")
    if world_size % procs_per_node:
        raise ConfigError(
            f"{procs_per_node} workers per node do not divide the world size {world_size}"
        )


def check_hierarchical(nnodes: int) -> None:
    """Raise ConfigError unless there are 2+ nodes: hitopk saves inter-node traffic only."""
    if nnodes < 2:
        raise ConfigError(
            "hitopk needs at least 2 nodes (it saves inter-node traffic only): run it on 2 "
            "or more nodes, set procs_per_node=1 to treat each worker as a node, or "
            "use mstopk on one node"
        )


def detect(world_size: int, rank: int, procs_per_node: int = 0) -> Topology:
    """The topology from an explicit ``procs_per_node`` (> 0) or from torchrun's environment."""
    if procs_per_node <= 0:
        env = os.environ.get("LOCAL_WORLD_SIZE")
        procs_per_node = int(env) if env else world_size  # no launcher info: one node
        group_rank = os.environ.get("GROUP_RANK")
        if env and group_rank is not None and int(group_rank) != rank // procs_per_node:
            raise ConfigError(
                f"rank {rank} is on node {group_rank} but ranks are not node-major "
                f"with {procs_per_node} per node; pass procs_per_node explicitly"
            )
    check_topology(world_size, procs_per_node)
    return Topology(world_size, procs_per_node, rank)


@dataclass
class Groups:
    topo: Topology
    intra: Any  # ProcessGroup of this node's workers (None when m == 1)
    inter: Any  # ProcessGroup of the workers with this local rank (None when n == 1)
    intra_gather: Any = None  # a second group of this node's workers: its own lane
    lanes: dict[str, Lane] = field(default_factory=dict, repr=False)

    def lane(self, name: str) -> Lane:
        """The issue order of the collectives that callbacks issue on group ``name``."""
        return self.lanes.setdefault(name, Lane())


# (world size, procs per node) -> (the default group they were made under, the groups)
_CACHE: dict[tuple[int, int], tuple[Any, Groups]] = {}


def _node_groups(topo: Topology) -> Any:
    """One new group per node (every rank calls this); this rank's, None when m == 1."""
    m, mine = topo.procs_per_node, None
    for node in range(topo.nnodes):
        g = dist.new_group(list(range(node * m, (node + 1) * m))) if m > 1 else None
        if node == topo.node:
            mine = g
    return mine


def groups(topo: Topology) -> Groups:
    """This rank's process groups, made once per default group (a collective)."""
    key = (topo.world_size, topo.procs_per_node)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is dist.group.WORLD:  # the entry holds it: no id reuse
        return hit[1]
    m, n = topo.procs_per_node, topo.nnodes
    # new_group must be called by all ranks for every group, in the same order
    intra = _node_groups(topo)
    intra_gather = _node_groups(topo)
    inter = None
    for lr in range(m):
        g = dist.new_group(list(range(lr, topo.world_size, m))) if n > 1 else None
        if lr == topo.local_rank:
            inter = g
    out = Groups(topo, intra, inter, intra_gather)
    _CACHE[key] = (dist.group.WORLD, out)
    return out
