"""Communicators, how a compressed bucket moves (GRACE's third piece): ``AllReduce``,
``AllGather`` (flat sparse) and ``HiTopK`` (HiTopKComm, Shi et al., MLSys 2021).  ``reduce``
returns a future of the averaged bucket without waiting, so DDP overlaps it with the backward.
"""

from __future__ import annotations

from collections.abc import Hashable
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from bench.comm import cost
from bench.comm.compressors import Compressed, Compressor, Memory, torch_dtype
from bench.comm.config import ValueDtype
from bench.comm.futures import Future, collective, done
from bench.comm.selection_core import deferred_finite
from bench.comm.stats import CommStats, ring
from bench.comm.topology import Groups, check_hierarchical
from bench.comm.wire import accumulator, pack, to_wire, unpack, widened
from bench.registry import ConfigError

# torch >= 2.10 renamed the tensor-in/tensor-out collectives; keep older releases working
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def uses_gloo(group: Any, device: torch.device) -> bool:
    """Whether ``group`` runs ``device``'s collectives on gloo (``"cpu:gloo,cuda:nccl"``
    sends CUDA tensors over NCCL)."""
    backend = str(dist.get_backend(group))
    if ":" not in backend:
        return backend == "gloo"
    per_device = dict(part.split(":", 1) for part in backend.split(","))
    return per_device.get(device.type) == "gloo"


class Communicator:
    """``reduce(flat, key, density, stats) -> Future[averaged flat tensor]``, not waiting."""

    sparse: bool = False  # needs a sparse compressor

    def __init__(
        self,
        compressor: Compressor,
        memory: Memory,
        groups: Groups | None = None,
        process_group: Any = None,
        value_dtype_name: ValueDtype | str = ValueDtype.float32,
    ) -> None:
        if compressor.sparse != self.sparse:
            kind = "sparse (topk, mstopk, randomk)" if self.sparse else "dense (dense, fp16, bf16)"
            raise ConfigError(f"communicator {type(self).__name__} needs a {kind} compressor")
        self.compressor = compressor
        self.memory = memory
        self.groups = groups
        self.pg = process_group
        self.vdtype = torch_dtype(value_dtype_name)
        # device "input finite" flags of the selections not yet taken (list.append is
        # atomic: callbacks of several process groups' threads append)
        self.flags: list[torch.Tensor] = []

    def take_flags(self) -> list[torch.Tensor]:
        flags, self.flags = self.flags, []
        return flags

    @property
    def world(self) -> int:
        return dist.get_world_size(self.pg)

    @property
    def multinode(self) -> bool:
        return self.groups is not None and self.groups.topo.nnodes > 1

    def compress(self, flat: torch.Tensor, key: Hashable, density: float) -> Compressed:
        comp = self.memory.compensate(flat, key)
        # no host read here: the loop checks the flags once a step
        with deferred_finite(self.flags):
            c = self.compressor.compress(comp, density)
        if c.sparse:
            c.values = to_wire(c.values, self.vdtype, flat.dtype)
        self.memory.update(key, comp, c)
        return c

    def reduce(self, flat: torch.Tensor, key: Hashable, density: float, stats: CommStats) -> Future:
        raise NotImplementedError

    def pieces(
        self, key: Hashable, places: list[tuple[int, int, int]], numel: int
    ) -> tuple[Hashable, list[tuple[int, int, int, int]]]:
        """The memory key of bucket ``key``'s residual and its ``ResidualMemory.pieces``."""
        return key, [(pid, off, 0, n) for pid, off, n in places]


def used_here(*tensors: torch.Tensor) -> None:
    """Tell the caching allocator that ``tensors``, made on the hook's stream, are used on
    the current (a callback's) stream: not reused before its work is done."""
    for t in tensors:
        if t.is_cuda:
            t.record_stream(torch.cuda.current_stream(t.device))


def _scatter_mean(
    flat: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor, world: int, padded: int
) -> None:
    """``flat`` = (sum of the received pairs) / ``world``, summed in float32 or wider."""
    in_place = padded == flat.numel() and widened(flat.dtype) == flat.dtype
    acc = flat.zero_() if in_place else accumulator(flat, padded)
    idx, vals = idx.reshape(-1), vals.reshape(-1).to(acc.dtype)
    if acc.is_cuda:
        # deterministic: CUDA's index_add_ adds with atomics in no fixed order, so an index
        # sent by 3 or more workers could sum to other last bits on each rank (and the
        # replicas drift apart); index_put_ with accumulate sorts the indices first
        acc.index_put_((idx,), vals, accumulate=True)
    else:  # the CPU's index_add_ adds in index order
        acc.index_add_(0, idx, vals)
    if in_place:
        flat.div_(world)
    else:
        flat.copy_(acc[: flat.numel()].div_(world))


class AllReduce(Communicator):
    def reduce(self, flat: torch.Tensor, key: Hashable, density: float, stats: CommStats) -> Future:
        w, times = self.world, stats.times
        t0 = times.now(flat)
        c = self.compress(flat, key, density)
        # divide before the sum (as DDP's hooks do): fp16 sums of w gradients overflow less
        vals = c.values.div_(w) if c.values.data_ptr() != flat.data_ptr() else flat.div_(w)
        times.add_select(t0, times.now(flat))
        nbytes = vals.numel() * vals.element_size()
        stats.count(cost.allreduce(nbytes, *ring(w, self.multinode), 1), flat.numel(), flat.numel())
        fut = collective(stats, flat, partial(dist.all_reduce, vals, group=self.pg, async_op=True))

        def finish(f: Future) -> torch.Tensor:
            out = f.value()[0]
            if out.data_ptr() != flat.data_ptr():
                used_here(out)  # the cast values, made on the hook's stream
                t1 = times.now(flat)
                flat.copy_(out)
                times.add_select(t1, times.now(flat))
            return flat

        return fut.then(finish)


class AllGather(Communicator):
    sparse = True

    def reduce(self, flat: torch.Tensor, key: Hashable, density: float, stats: CommStats) -> Future:
        w, n, times = self.world, flat.numel(), stats.times
        t0 = times.now(flat)
        c = self.compress(flat, key, density)
        assert c.indices is not None
        k, vdtype = c.values.numel(), c.values.dtype
        pkt = pack(c.values, c.indices, n)
        times.add_select(t0, times.now(flat))
        stats.count(cost.allgather(pkt.numel(), *ring(w, self.multinode)), k, n)
        out = pkt.new_empty(w * pkt.numel())
        fut = collective(stats, flat, partial(_all_gather, out, pkt, group=self.pg, async_op=True))

        def finish(_: Future) -> torch.Tensor:
            used_here(out)
            t1 = times.now(flat)
            vals, idx = unpack(out, w, k, n, vdtype)
            _scatter_mean(flat, idx, vals, w, n)
            times.add_select(t1, times.now(flat))
            return flat

        return fut.then(finish)


class HiTopK(Communicator):
    sparse = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.groups is None:
            raise ConfigError("hitopk needs a node topology (intra/inter-node process groups)")
        check_hierarchical(self.groups.topo.nnodes)
        if self.pg is not None:
            raise ConfigError("hitopk runs on the default (world) process group only")
        # bucket key -> its zero-padded copy (m equal shards), reused every step
        self._padded: dict[Hashable, torch.Tensor] = {}

    def reduce(self, flat: torch.Tensor, key: Hashable, density: float, stats: CommStats) -> Future:
        assert self.groups is not None
        g, times = self.groups, stats.times
        m, nn, w = g.topo.procs_per_node, g.topo.nnodes, g.topo.world_size
        d = flat.numel()
        s = -(-d // m)  # shard length (elements); the last shard is zero-padded
        k = cost.k_for(s, density)
        pkt_bytes = cost.packet_bytes(k, s, self.vdtype.itemsize)
        stats.count(cost.hitopk_stages(s * m * flat.element_size(), pkt_bytes, nn, m), k * m, d)
        shard, reduced = self._reduce_scatter(flat, s, stats, key)
        inter = flat.new_empty(nn * pkt_bytes, dtype=torch.uint8)

        def select_and_gather(_: Any) -> Future:  # (2)-(4), once the shard is reduced
            if shard is not flat:
                used_here(shard)
            used_here(inter)
            t0 = times.now(flat)
            c = self.compress(shard, (key, "shard"), density)
            assert c.indices is not None and c.values.numel() == k
            pkt = pack(c.values, c.indices, s)
            times.add_select(t0, times.now(flat))
            issue = partial(_all_gather, inter, pkt, group=g.inter, async_op=True)
            return collective(stats, flat, issue)

        gathered = g.lane("inter").after(reduced, select_and_gather, flat)
        full = inter
        if m > 1:  # (5) every local worker gets the other shards' n packets
            full = inter.new_empty(m * inter.numel())

            def gather_node(_: Any) -> Future:
                used_here(full)
                issue = partial(_all_gather, full, inter, group=g.intra_gather, async_op=True)
                return collective(stats, flat, issue)

            gathered = g.lane("intra_gather").after(gathered, gather_node, flat)

        def finish(_: Future) -> torch.Tensor:
            used_here(full)
            t0 = times.now(flat)
            vals, idx = unpack(full, m * nn, k, s, self.vdtype)
            # packets [j*n, (j+1)*n) came from local rank j: their indices are into shard j
            idx += (torch.arange(m * nn, device=idx.device) // nn * s).unsqueeze(1)
            _scatter_mean(flat, idx, vals, w, s * m)
            times.add_select(t0, times.now(flat))
            return flat

        return gathered.then(finish)

    def pieces(
        self, key: Hashable, places: list[tuple[int, int, int]], numel: int
    ) -> tuple[Hashable, list[tuple[int, int, int, int]]]:
        """The residual is of this worker's shard: the parts of the parameters in it."""
        assert self.groups is not None
        topo = self.groups.topo
        s = -(-numel // topo.procs_per_node)
        lo, hi = topo.local_rank * s, (topo.local_rank + 1) * s
        out = []
        for pid, off, n in places:
            a, b = max(off, lo), min(off + n, hi)
            if a < b:
                out.append((pid, a - lo, a - off, b - a))
        return (key, "shard"), out

    def _reduce_scatter(
        self, flat: torch.Tensor, s: int, stats: CommStats, key: Hashable
    ) -> tuple[torch.Tensor, Future]:
        """(1): this worker's shard and the future of its node sum (issued now); float32
        for a 16-bit bucket: a node sum must not overflow."""
        g, times = self.groups, stats.times
        assert g is not None
        m = g.topo.procs_per_node
        if m == 1:
            return flat, done(flat)
        t0 = times.now(flat)
        d = flat.numel()
        src = flat
        if d != s * m:  # a padded copy, in a buffer kept per bucket (no allocation per step)
            src = self._padded.get(key)
            if src is None or src.dtype != flat.dtype or src.device != flat.device:
                src = self._padded[key] = flat.new_zeros(s * m)
            src[:d].copy_(flat)
        shard = flat.new_empty(s, dtype=widened(flat.dtype))
        times.add_select(t0, times.now(flat))
        return shard, _reduce_scatter_async(stats, flat, shard, src, g.intra)


def _reduce_scatter_async(
    stats: CommStats, like: torch.Tensor, shard: torch.Tensor, src: torch.Tensor, group: Any
) -> Future:
    m = src.numel() // shard.numel()
    if uses_gloo(group, src.device):
        parts = torch.empty_like(src)
        issue = partial(dist.all_to_all_single, parts, src, group=group, async_op=True)

        def add(_: Future) -> torch.Tensor:
            used_here(parts, shard)
            return torch.sum(parts.view(m, -1), dim=0, dtype=shard.dtype, out=shard)

        return collective(stats, like, issue, then=add)
    if shard.dtype == src.dtype:
        issue = partial(_reduce_scatter, shard, src, group=group, async_op=True)
        return collective(stats, like, issue)
    part = src.new_empty(shard.numel())
    avg = dist.ReduceOp.AVG
    issue = partial(_reduce_scatter, part, src, op=avg, group=group, async_op=True)

    def widen(_: Future) -> torch.Tensor:
        used_here(part, shard)
        return shard.copy_(part).mul_(m)

    return collective(stats, like, issue, then=widen)
