"""DiLoCo's pseudo-gradient sent as a top-k with error feedback in place of its allreduce
(docs/algorithms.md, section 11): SparseLoCo's chunk-wise quantised top-k (:class:`ChunkTopK`,
Sarfi et al. 2025), and HiTopKComm of each local rank's shard (:class:`ShardTopK`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bench.comm.communicators import _all_gather, _scatter_mean
from bench.comm.cost import Stage, k_for, packet_bytes
from bench.comm.selection import mstopk
from bench.comm.wire import pack, unpack


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned ``codes`` below ``2**bits`` as ``ceil(n * bits / 8)`` bytes, LSB first."""
    shifts = torch.arange(bits, device=codes.device)
    stream = ((codes.long().reshape(-1, 1) >> shifts) & 1).reshape(-1)
    stream = torch.nn.functional.pad(stream, (0, -stream.numel() % 8)).view(-1, 8)
    return (stream << torch.arange(8, device=codes.device)).sum(1).to(torch.uint8)


def unpack_bits(buf: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The ``n`` int64 codes of :func:`pack_bits`."""
    stream = (buf.long().reshape(-1, 1) >> torch.arange(8, device=buf.device)) & 1
    stream = stream.reshape(-1)[: n * bits].view(n, bits)
    return (stream << torch.arange(bits, device=buf.device)).sum(1)


@dataclass(frozen=True)
class Chunks:
    """A tensor as ``rows`` chunks of ``width`` (zero-padded), ``k`` sent of each, at ``base``
    in the padded concatenation."""

    name: str
    numel: int
    rows: int
    width: int
    k: int
    base: int


@dataclass(frozen=True)
class Packet:
    """One worker's packet per outer step, by section (bytes)."""

    values: int
    indices: int
    scales: int

    @property
    def total(self) -> int:
        return self.values + self.indices + self.scales


def chunking(numels: dict[str, int], chunk_size: int, density: float) -> list[Chunks]:
    """Tensors cut into chunks of ``chunk_size`` (a smaller one is one), ``density`` sent."""
    out, base = [], 0
    for name, numel in numels.items():
        width = min(chunk_size, numel)
        rows = -(-numel // width)
        out.append(Chunks(name, numel, rows, width, k_for(width, density), base))
        base += rows * width
    return out


def chunk_packet(chunks: list[Chunks], chunk_size: int, bits: int) -> Packet:
    """SparseLoCo's packet: values in ``bits`` bits (0: float32), indices in ``ceil(log2
    chunk_size)`` bits, ``2 ** (bits - 1)`` float32 scales per chunk."""
    sent, rows = sum(t.rows * t.k for t in chunks), sum(t.rows for t in chunks)
    index_bits = max(1, (chunk_size - 1).bit_length())
    return Packet(
        values=-(-sent * bits // 8) if bits else 4 * sent,
        indices=-(-sent * index_bits // 8),
        scales=4 * rows * (1 << max(bits - 1, 0)) if bits else 0,
    )


def shard_packet(numel: int, m: int, density: float) -> Packet:
    """One local rank's HiTopK packet: float32 values, int32 indices of its shard's top."""
    shard = -(-numel // m)
    k = k_for(shard, density)
    return Packet(values=4 * k, indices=packet_bytes(k, shard, 4) - 4 * k, scales=0)


class Exchange:
    """Sparse, error-compensated exchange of one DiLoCo fragment's pseudo-gradient."""

    def __init__(self, manager: Any, fragment: nn.Module, cfg: Any) -> None:
        self.manager, self.density, self.beta = manager, float(cfg.density), float(cfg.ef_beta)
        self.shapes = {n: p.shape for n, p in fragment.named_parameters()}
        self.error: dict[str, torch.Tensor] = {}  # the error-feedback buffers

    def send(self, fragment: Any) -> None:
        """As torchft's ``_average_grads``: start the exchange of ``fragment._grads`` (the
        pseudo-gradients by name), its Work finished by the fragment's ``perform_sync``."""
        grads = fragment._grads
        packet = self.encode(grads)
        assert packet.numel() == self.packet.total, "the packet is not the size the formula says"
        self.manager.note_packet(self.packet)
        work, packets = self.manager.allgather(packet)
        fragment._allreduce_work.append(_Gathered(work, packets, lambda g: self.finish(g, grads)))

    # a subclass's encode(grads): this worker's packet (uint8), each buffer keeping what it
    # does not carry; finish(gathered, grads): the nodes' packets (one a row) decoded, their
    # mean written into ``grads``

    def compensate(self, key: str, delta: torch.Tensor) -> torch.Tensor:
        """``e <- beta * e + delta`` (float32 or wider), the buffer returned."""
        e = self.error.get(key)
        if e is None:
            e = self.error[key] = torch.zeros_like(
                delta, dtype=torch.promote_types(delta.dtype, torch.float32)
            )
        return e.mul_(self.beta).add_(delta)

    def state_dict(self) -> dict[str, Any]:
        return {"error": {k: e.detach().clone() for k, e in self.error.items()}}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.error = {k: e.clone() for k, e in d["error"].items()}


class _Gathered:
    """torchft's Work of a fragment's exchange: ``wait`` decodes the packets (once)."""

    def __init__(self, work: Any, packets: list[torch.Tensor], finish: Callable) -> None:
        self.work, self.packets, self.finish, self.done = work, packets, finish, False

    def wait(self, timeout: Any = None) -> bool:
        if self.done:
            return True
        ok = self.work.wait()
        self.finish(torch.stack(self.packets))
        self.done = True
        return bool(ok)


class ChunkTopK(Exchange):
    """SparseLoCo's compressor: chunk-wise top-k of the error-feedback buffer, quantised."""

    def __init__(self, manager: Any, fragment: nn.Module, cfg: Any) -> None:
        super().__init__(manager, fragment, cfg)
        self.bits, c = int(cfg.quant_bits), int(cfg.chunk_size)
        self.levels = 1 << max(self.bits - 1, 0)  # magnitude levels (scales) per chunk
        self.index_bits = max(1, (c - 1).bit_length())
        self.chunks = chunking({n: s.numel() for n, s in self.shapes.items()}, c, self.density)
        self.padded = sum(t.rows * t.width for t in self.chunks)
        self.packet = chunk_packet(self.chunks, c, self.bits)

    def encode(self, grads: dict[str, torch.Tensor]) -> torch.Tensor:
        """Indices, values, scales; each buffer keeps what the values do not carry (exactly
        the rest with float32 values)."""
        idx_all, val_all, scale_all = [], [], []
        for t in self.chunks:
            e = self.compensate(t.name, grads[t.name]).view(-1)
            x = torch.nn.functional.pad(e, (0, t.rows * t.width - t.numel)).view(t.rows, t.width)
            idx = x.abs().topk(t.k, dim=1, sorted=True).indices  # largest first, per chunk
            vals = x.gather(1, idx)
            if self.bits:
                codes, scales = self._quantise(vals)
                vals = self._dequantise(codes, scales)
                val_all.append(codes.reshape(-1))
                scale_all.append(scales.reshape(-1))
            else:
                val_all.append(vals.float().reshape(-1))
            flat = (idx + torch.arange(t.rows, device=idx.device).unsqueeze(1) * t.width).view(-1)
            real = flat < t.numel  # a padding position may be picked in a chunk of zeros
            e.index_put_((flat[real],), -vals.reshape(-1)[real].to(e.dtype), accumulate=True)
            idx_all.append(idx.reshape(-1))
        parts = [pack_bits(torch.cat(idx_all), self.index_bits)]
        if self.bits:
            parts += [pack_bits(torch.cat(val_all), self.bits), _bytes(torch.cat(scale_all))]
        else:
            parts.append(_bytes(torch.cat(val_all)))
        return torch.cat(parts)

    def _quantise(self, vals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each chunk's ``k`` values (largest first) -> codes (a sign bit above ``bits - 1``
        level bits) and float32 scales: level ``g``, ranks ``[g k / L, (g + 1) k / L)``, their
        mean magnitude."""
        rows, k = vals.shape
        group = torch.arange(k, device=vals.device) * self.levels // k
        mag = vals.abs().float()
        sums = mag.new_zeros(rows, self.levels).index_add_(1, group, mag)
        count = torch.bincount(group, minlength=self.levels).clamp(min=1)
        codes = group.expand(rows, k) + self.levels * (vals < 0).long()
        return codes, sums / count

    def _dequantise(self, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        mag = scales.gather(1, codes % self.levels)
        return torch.where(codes >= self.levels, -mag, mag)

    def decode(self, packet: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One worker's packet -> positions in the padded concatenation and values."""
        p, sent = self.packet, sum(t.rows * t.k for t in self.chunks)
        idx = unpack_bits(packet[: p.indices], self.index_bits, sent)
        body = packet[p.indices :]
        if self.bits:
            codes = unpack_bits(body[: p.values], self.bits, sent)
            scales = body[p.values :].clone().view(torch.float32)  # aligned storage
        else:
            vals = body.clone().view(torch.float32)
        pos, out, at, row = [], [], 0, 0
        for t in self.chunks:
            n = t.rows * t.k
            i = idx[at : at + n].view(t.rows, t.k)
            first = torch.arange(t.rows, device=i.device).unsqueeze(1) * t.width
            pos.append((t.base + first + i).view(-1))
            if self.bits:
                s = scales[row * self.levels : (row + t.rows) * self.levels]
                out.append(
                    self._dequantise(codes[at : at + n].view(t.rows, t.k), s.view(t.rows, -1))
                )
            else:
                out.append(vals[at : at + n])
            at, row = at + n, row + t.rows
        return torch.cat(pos), torch.cat([v.reshape(-1) for v in out])

    def finish(self, gathered: torch.Tensor, grads: dict[str, torch.Tensor]) -> None:
        decoded = [self.decode(row) for row in gathered]
        pos = torch.cat([p for p, _ in decoded])
        vals = torch.cat([v for _, v in decoded])
        acc = gathered.new_zeros(self.padded, dtype=torch.float32)
        _scatter_mean(acc, pos, vals, len(decoded), self.padded)  # in rank order
        for t in self.chunks:
            g = grads[t.name]
            g.copy_(acc[t.base : t.base + t.numel].view_as(g))


class ShardTopK(Exchange):
    """HiTopKComm on the outer step: this local rank's shard as an MSTopK with error
    feedback between the nodes, the node's packets all-gathered inside it."""

    def __init__(self, manager: Any, fragment: nn.Module, cfg: Any) -> None:
        super().__init__(manager, fragment, cfg)
        self.method = str(cfg.mstopk_method)
        self.m, self.j = int(manager.local_world), int(manager.local_rank)
        self.group = manager.node_group  # the node's workers (None: one a node)
        self.numel = sum(s.numel() for s in self.shapes.values())
        self.shard = -(-self.numel // self.m)  # s: elements a local rank owns, padded
        self.k = k_for(self.shard, self.density)
        self.packet = shard_packet(self.numel, self.m, self.density)

    def encode(self, grads: dict[str, torch.Tensor]) -> torch.Tensor:
        """``bench.comm.wire.pack`` of its shard's top; the buffer keeps the rest."""
        flat = torch.cat([grads[n].reshape(-1) for n in self.shapes])
        part = flat[self.j * self.shard : (self.j + 1) * self.shard]
        e = self.compensate("shard", torch.nn.functional.pad(part, (0, self.shard - part.numel())))
        vals, idx = mstopk(e, self.k, self.method)
        e[idx] = 0  # the values sent are e's own (float32 on the wire): nothing of them kept
        return pack(vals.float(), idx, self.shard)

    def finish(self, gathered: torch.Tensor, grads: dict[str, torch.Tensor]) -> None:
        n = gathered.shape[0]
        full = gathered.reshape(-1)
        if self.m > 1:  # every local rank's n packets to every worker of the node
            full = gathered.new_empty(self.m * full.numel())
            _all_gather(full, gathered.reshape(-1).contiguous(), group=self.group)
            b = float((self.m - 1) * gathered.numel())
            self.manager.count(Stage("intra_allgather", b, 0.0, self.m - 1, False))
        vals, idx = unpack(full, self.m * n, self.k, self.shard, torch.float32)
        idx = idx + (torch.arange(self.m * n, device=idx.device) // n * self.shard).unsqueeze(1)
        acc = full.new_zeros(self.m * self.shard, dtype=torch.float32)
        _scatter_mean(acc, idx, vals, n, self.m * self.shard)
        flat = acc[: self.numel].split([s.numel() for s in self.shapes.values()])
        for (name, shape), part in zip(self.shapes.items(), flat):
            grads[name].copy_(part.view(shape))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)
