"""Communicators: how compressed gradient buckets move between workers.

The third GRACE piece (see ``compressors.py``).  A communicator takes one flat bucket,
applies error-feedback memory and a compressor, runs *one collective per bucket and
stage* and returns a future holding the bucket averaged over all workers (what a DDP
communication hook must return).

``allreduce``
    Dense ring allreduce of the (possibly fp16/bf16-cast) bucket.  Asynchronous, like
    DDP's built-in reduction.
``allgather``
    Flat sparse allgather: every worker sends its ``k`` (index, value) pairs to every
    other worker, which scatter-adds them.  Traffic per worker grows with the world size.
``hitopk``
    HiTopKComm (Shi et al., MLSys 2021; ``docs/algorithms.md``), with ``n`` nodes of
    ``m`` workers:
    (1) intra-node reduce-scatter of the dense bucket, so each local worker holds its
    node's sum of one 1/m shard; (2) error feedback on that shard; (3) top-k of the shard
    with ``k = density * numel / m``; (4) inter-node allgather of the packed pairs among
    the workers with the same local rank (m small allgathers in parallel, one per shard);
    (5) intra-node allgather of the ``n`` packets each local worker received; scatter-add
    into the dense bucket and divide by the world size.  On a single node there is no
    slow link to save: it refuses (ConfigError) rather than silently running a flat
    scheme under the hierarchical name; pass ``procs_per_node=1`` to treat every worker as
    a node, or use ``allgather``.

Wire format (``pack``/``unpack``): one uint8 buffer per worker and bucket holding the
indices first (int32 when the bucket has < 2**31 elements, else int64) and then the values
(float32, or float16/bfloat16 with ``value_dtype``), padded to a multiple of 8 bytes so
gathered packets stay aligned.  ``k`` is the same on every worker, so no header is needed.

Byte accounting (per worker per step, what it sends): ring allreduce ``2 (w-1)/w`` of the
bucket; ring allgather ``(w-1)`` packets; hitopk ``(m-1)/m`` of the bucket (intra) +
``(n-1)`` packets (inter) + ``(m-1) n`` packets (intra).  Inter-node bytes are those on
the slow links: for the flat rings every node boundary carries the whole ring traffic, so
they equal the worker's total when ``n > 1``; for hitopk only stage (4) crosses nodes.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from bench.comm.compressors import Compressed, Compressor, Memory, torch_dtype
from bench.comm.config import ValueDtype
from bench.comm.selection import k_for
from bench.comm.topology import Groups
from bench.registry import ConfigError, Registry

COMMUNICATORS: Registry = Registry("communicator")

_ALIGN = 8  # bytes: largest element size in a packet (int64 indices)

# torch >= 2.10 renamed the tensor-in/tensor-out collectives; keep older releases working
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass
class CommStats:
    """Sums since the last :meth:`pop`; ``pop`` turns them into per-step means."""

    steps: int = 0
    bytes: float = 0.0  # bytes sent by this worker, all buckets
    inter_bytes: float = 0.0  # of which across nodes
    select_s: float = 0.0  # error feedback + selection + packing (s)
    comm_s: float = 0.0  # collectives, from launch to completion (s)
    sent: float = 0.0  # elements sent (k per sparse bucket, numel per dense bucket)
    numel: float = 0.0  # elements reduced

    def pop(self) -> dict[str, float]:
        s = max(self.steps, 1)
        out = {
            "comm/bytes_per_step": self.bytes / s,
            "comm/inter_node_bytes_per_step": self.inter_bytes / s,
            "comm/density": self.sent / self.numel if self.numel else 1.0,
            "time/select_s": self.select_s / s,
            "time/comm_s": self.comm_s / s,
        }
        self.__init__()  # type: ignore[misc]
        return out


def _sync(t: torch.Tensor) -> None:
    if t.is_cuda:  # wall-clock phases need the GPU queue drained
        torch.cuda.synchronize(t.device)


def _done(t: torch.Tensor) -> torch.futures.Future:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(t)
    return fut


def index_dtype(numel: int) -> torch.dtype:
    return torch.int32 if numel < 2**31 else torch.int64


def packet_bytes(k: int, numel: int, vdtype: torch.dtype) -> int:
    isz = torch.empty(0, dtype=index_dtype(numel)).element_size()
    vsz = torch.empty(0, dtype=vdtype).element_size()
    raw = k * (isz + vsz)
    return -(-raw // _ALIGN) * _ALIGN


def pack(c: Compressed, vdtype: torch.dtype) -> torch.Tensor:
    """One uint8 buffer: indices (int32/int64), then values (``vdtype``), then padding."""
    assert c.indices is not None
    k = c.values.numel()
    idx = c.indices.to(index_dtype(c.numel))
    vals = c.values.to(vdtype)
    out = torch.zeros(packet_bytes(k, c.numel, vdtype), dtype=torch.uint8, device=vals.device)
    ib = k * idx.element_size()
    out[:ib] = idx.view(torch.uint8)
    out[ib : ib + k * vals.element_size()] = vals.view(torch.uint8)
    return out


def unpack(
    buf: torch.Tensor, packets: int, k: int, numel: int, vdtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``packets`` gathered packets -> values and int64 indices, both ``(packets, k)``."""
    idt = index_dtype(numel)
    rows = buf.view(packets, -1)
    ib = k * torch.empty(0, dtype=idt).element_size()
    vb = k * torch.empty(0, dtype=vdtype).element_size()
    idx = rows[:, :ib].contiguous().view(idt).long()
    vals = rows[:, ib : ib + vb].contiguous().view(vdtype)
    return vals, idx


class Communicator:
    """``reduce(flat, key, density, stats) -> Future[averaged flat tensor]``."""

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

    @property
    def world(self) -> int:
        return dist.get_world_size(self.pg)

    @property
    def multinode(self) -> bool:
        return self.groups is not None and self.groups.topo.nnodes > 1

    def compress(self, flat: torch.Tensor, key: Hashable, density: float) -> Compressed:
        """What this worker sends for one bucket: error feedback, then compression.

        The compressor must see the *compensated* gradient (this step's plus the residual of
        the earlier ones): selecting from ``flat`` alone would keep the residual but never
        send it (``tests/test_comm_feedback.py`` checks that it is sent).
        """
        comp = self.memory.compensate(flat, key)
        c = self.compressor.compress(comp, density)
        self.memory.update(key, comp, c)
        return c

    def reduce(
        self, flat: torch.Tensor, key: Hashable, density: float, stats: CommStats
    ) -> torch.futures.Future:
        raise NotImplementedError


@COMMUNICATORS.register("allreduce")
class AllReduce(Communicator):
    def reduce(
        self, flat: torch.Tensor, key: Hashable, density: float, stats: CommStats
    ) -> torch.futures.Future:
        w = self.world
        t0 = time.perf_counter()
        c = self.compress(flat, key, density)
        # divide before the sum (as DDP's hooks do): fp16 sums of w gradients overflow less
        vals = c.values.div_(w) if c.values.data_ptr() != flat.data_ptr() else flat.div_(w)
        t1 = time.perf_counter()
        stats.select_s += t1 - t0
        nbytes = 2.0 * (w - 1) / w * vals.numel() * vals.element_size()
        stats.bytes += nbytes
        stats.inter_bytes += nbytes if self.multinode else 0.0
        stats.sent += flat.numel()
        stats.numel += flat.numel()
        fut = dist.all_reduce(vals, group=self.pg, async_op=True).get_future()

        def finish(f: torch.futures.Future) -> torch.Tensor:
            out = f.value()[0]
            if out.data_ptr() != flat.data_ptr():
                flat.copy_(out)
            stats.comm_s += time.perf_counter() - t1
            return flat

        return fut.then(finish)


@COMMUNICATORS.register("allgather")
class AllGather(Communicator):
    sparse = True

    def reduce(
        self, flat: torch.Tensor, key: Hashable, density: float, stats: CommStats
    ) -> torch.futures.Future:
        w = self.world
        n = flat.numel()
        _sync(flat)
        t0 = time.perf_counter()
        c = self.compress(flat, key, density)
        k = c.values.numel()
        pkt = pack(c, self.vdtype)
        _sync(pkt)
        t1 = time.perf_counter()
        out = pkt.new_empty(w * pkt.numel())
        _all_gather(out, pkt, group=self.pg)
        _sync(out)
        t2 = time.perf_counter()
        vals, idx = unpack(out, w, k, n, self.vdtype)
        flat.zero_()
        flat.index_add_(0, idx.reshape(-1), vals.reshape(-1).to(flat.dtype))
        flat.div_(w)
        stats.select_s += t1 - t0
        stats.comm_s += t2 - t1
        stats.bytes += (w - 1) * pkt.numel()
        stats.inter_bytes += (w - 1) * pkt.numel() if self.multinode else 0.0
        stats.sent += k
        stats.numel += n
        return _done(flat)


@COMMUNICATORS.register("hitopk")
class HiTopK(Communicator):
    sparse = True

    def __init__(
        self,
        compressor: Compressor,
        memory: Memory,
        groups: Groups | None = None,
        process_group: Any = None,
        value_dtype_name: ValueDtype | str = ValueDtype.float32,
    ) -> None:
        if groups is None:
            raise ConfigError("hitopk needs a node topology (intra/inter-node process groups)")
        if groups.topo.nnodes < 2:
            raise ConfigError(
                "hitopk needs at least 2 nodes (it saves inter-node traffic only); on one node "
                "use comm=mstopk, or set comm.procs_per_node=1 to treat each worker as a node"
            )
        if process_group is not None:
            raise ConfigError("hitopk runs on the default (world) process group only")
        super().__init__(compressor, memory, groups, None, value_dtype_name)

    def reduce(
        self, flat: torch.Tensor, key: Hashable, density: float, stats: CommStats
    ) -> torch.futures.Future:
        assert self.groups is not None
        topo = self.groups.topo
        m, nn, w = topo.procs_per_node, topo.nnodes, topo.world_size
        d = flat.numel()
        s = -(-d // m)  # shard length (elements); the last shard is zero-padded
        _sync(flat)
        t0 = time.perf_counter()
        # (1) intra-node reduce-scatter: this worker gets its node's sum of shard local_rank
        if m > 1:
            src = flat if d == s * m else torch.cat([flat, flat.new_zeros(s * m - d)])
            shard = flat.new_empty(s)
            _reduce_scatter(shard, src, group=self.groups.intra)
        else:
            shard = flat.clone()
        _sync(shard)
        t1 = time.perf_counter()
        # (2)+(3) error feedback and top-k on the shard, k = density * numel / m
        c = self.compress(shard, (key, "shard"), density)
        k = c.values.numel()
        pkt = pack(c, self.vdtype)
        _sync(pkt)
        t2 = time.perf_counter()
        # (4) inter-node allgather among the workers with this local rank
        inter = pkt.new_empty(nn * pkt.numel())
        _all_gather(inter, pkt, group=self.groups.inter)
        # (5) intra-node allgather: every worker gets all m shards' n packets
        if m > 1:
            full = inter.new_empty(m * inter.numel())
            _all_gather(full, inter, group=self.groups.intra)
        else:
            full = inter
        _sync(full)
        t3 = time.perf_counter()
        vals, idx = unpack(full, m * nn, k, s, self.vdtype)
        # packets [j*n, (j+1)*n) came from local rank j: their indices are into shard j
        idx += (torch.arange(m * nn, device=idx.device) // nn * s).unsqueeze(1)
        dense = flat.new_zeros(s * m)
        dense.index_add_(0, idx.reshape(-1), vals.reshape(-1).to(flat.dtype))
        flat.copy_(dense[:d]).div_(w)
        stats.select_s += t2 - t1
        stats.comm_s += (t1 - t0) + (t3 - t2)
        intra_b = (m - 1) / m * s * m * flat.element_size() + (m - 1) * nn * pkt.numel()
        inter_b = (nn - 1) * pkt.numel()
        stats.bytes += intra_b + inter_b
        stats.inter_bytes += inter_b
        stats.sent += k * m  # the node's m shards together send m*k of the bucket's d
        stats.numel += d
        return _done(flat)


def shard_k(numel: int, procs_per_node: int, density: float) -> int:
    """Elements each local worker sends for a bucket of ``numel`` under hitopk."""
    return k_for(-(-numel // procs_per_node), density)
