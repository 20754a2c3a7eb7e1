"""DeMo (Peng, Quesnelle and Kingma 2024, Algorithm 1): each worker adds its gradient to
its own momentum, sends the top-k DCT-II coefficients of each chunk of it, takes what it
sent off, and steps by the sign of the decoded average (docs/algorithms.md, "DeMo").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from bench.optim.config import OptimConfig, UpdateMode
from bench.optim.spec import OptimizerSpec, register
from bench.registry import ConfigError

VALUE_BYTES = 4  # float32 coefficients on the wire


@functools.lru_cache(maxsize=64)
def dct_matrix(n: int, device: Any = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The orthonormal DCT-II of length ``n``: ``D @ x`` transforms, ``D.T @ c`` inverts."""
    i = torch.arange(n, dtype=torch.float64)
    d = torch.cos(math.pi * (2 * i[None, :] + 1) * i[:, None] / (2 * n)) * math.sqrt(2.0 / n)
    d[0] /= math.sqrt(2.0)
    return d.to(device=device, dtype=dtype)


@dataclass(frozen=True)
class Block:
    """Rows ``r0:r1`` by columns ``c0:c1`` of a matrix in whole ``cr x cc`` chunks, ``k``
    coefficients of each kept."""

    r0: int
    r1: int
    c0: int
    c1: int
    cr: int
    cc: int
    k: int

    @property
    def grid(self) -> tuple[int, int]:  # chunks along the rows and along the columns
        return (self.r1 - self.r0) // self.cr, (self.c1 - self.c0) // self.cc

    @property
    def chunks(self) -> int:
        return math.prod(self.grid)

    @property
    def elems(self) -> int:  # of one chunk
        return self.cr * self.cc

    @property
    def pairs(self) -> int:  # (index, value) pairs sent per step
        return self.chunks * self.k

    def coefficients(self, matrix: torch.Tensor) -> torch.Tensor:
        """The 2-D DCT-II of each chunk of this block of ``matrix``, ``(chunks, elems)``."""
        nr, nc = self.grid
        x = matrix[self.r0 : self.r1, self.c0 : self.c1]
        blocks = x.reshape(nr, self.cr, nc, self.cc).transpose(1, 2)
        dr = dct_matrix(self.cr, x.device, x.dtype)
        dc = dct_matrix(self.cc, x.device, x.dtype)
        return (dr @ blocks @ dc.T).reshape(nr * nc, self.elems)

    def values(self, coef: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`coefficients`."""
        nr, nc = self.grid
        dr = dct_matrix(self.cr, coef.device, coef.dtype)
        dc = dct_matrix(self.cc, coef.device, coef.dtype)
        blocks = dr.T @ coef.reshape(nr, nc, self.cr, self.cc) @ dc
        return blocks.transpose(1, 2).reshape(nr * self.cr, nc * self.cc)

    def scatter(self, values: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """``(chunks, elems)`` coefficients: ``values`` at ``idx``, zeros elsewhere."""
        return values.new_zeros(self.chunks, self.elems).scatter_(1, idx, values)


@dataclass(frozen=True)
class Chunking:
    """How one tensor is cut: viewed as ``rows x cols`` (a vector is one row), in chunks of
    ``min(chunk, rows) x min(chunk, cols)``, the rows and columns left over in smaller
    chunks at the edges, each with its own DCT (an orthonormal basis of its elements)."""

    shape: tuple[int, ...]
    rows: int
    cols: int
    blocks: tuple[Block, ...]

    @classmethod
    def of(cls, shape: Sequence[int], chunk: int, topk: int) -> Chunking:
        shape = tuple(int(s) for s in shape)
        numel = math.prod(shape)
        rows = shape[0] if len(shape) >= 2 else 1
        cols = numel // rows if rows else 0
        spans = []
        for n in (rows, cols):
            c = min(chunk, n)
            whole = n - n % c if c else 0
            spans.append([(0, whole, c)] + ([(whole, n, n - whole)] if whole < n else []))
        blocks = tuple(
            Block(r0, r1, c0, c1, h, w, min(topk, h * w))
            for r0, r1, h in spans[0]
            for c0, c1, w in spans[1]
            if h and w
        )
        return cls(shape, rows, cols, blocks)

    @property
    def elems(self) -> int:  # of the largest chunk
        return max((b.elems for b in self.blocks), default=1)

    @property
    def pairs(self) -> int:
        return sum(b.pairs for b in self.blocks)

    def coefficients(self, x: torch.Tensor) -> list[torch.Tensor]:
        matrix = x.reshape(self.rows, self.cols)
        return [b.coefficients(matrix) for b in self.blocks]

    def tensor(self, coefs: Sequence[torch.Tensor]) -> torch.Tensor:
        """The inverse of :meth:`coefficients`."""
        out = coefs[0].new_empty(self.rows, self.cols)
        for b, c in zip(self.blocks, coefs, strict=True):
            out[b.r0 : b.r1, b.c0 : b.c1] = b.values(c)
        return out.reshape(self.shape)

    def select(self, x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each block's ``k`` largest coefficients per chunk: ``(chunks, k)`` values, indices."""
        values, indices = [], []
        for coef, b in zip(self.coefficients(x), self.blocks, strict=True):
            idx = coef.abs().topk(b.k, dim=1, sorted=False).indices
            values.append(coef.gather(1, idx))
            indices.append(idx)
        return values, indices

    def scatter(self, values: Sequence[torch.Tensor], idx: Sequence[torch.Tensor]) -> list:
        return [b.scatter(v, i) for b, v, i in zip(self.blocks, values, idx, strict=True)]


def index_dtype(chunkings: Sequence[Chunking]) -> torch.dtype:
    """Indices in a chunk: int16 while every chunk has at most 2**15 elements."""
    most = max((c.elems for c in chunkings), default=1)
    return torch.int16 if most <= 2**15 else torch.int32


def packet_size(chunkings: Sequence[Chunking]) -> int:
    """Bytes of one worker's packet: float32 values and their indices."""
    per_pair = VALUE_BYTES + index_dtype(chunkings).itemsize
    return sum(c.pairs for c in chunkings) * per_pair


def packet_bytes(shapes: Sequence[Sequence[int]], chunk: int, topk: int) -> int:
    """Bytes one worker sends per step for parameters of ``shapes``."""
    return packet_size([Chunking.of(s, chunk, topk) for s in shapes])


class DeMo(torch.optim.Optimizer):
    """DeMo over ``params``: one all-gather per step on ``process_group`` (the world; with
    one worker nothing is sent).  ``on_send(packet_bytes, pairs, elements)`` is told what
    each step sent; ``times`` (a ``PhaseTimes``) gets the transform and decode as selection,
    the all-gather as communication."""

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        momentum: float = 0.999,
        weight_decay: float = 0.0,
        chunk: int = 64,
        topk: int = 32,
        process_group: Any = None,
    ) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"DeMo's momentum decay must be in [0, 1), got {momentum}")
        if chunk < 1 or topk < 1:
            raise ValueError(f"DeMo needs chunk >= 1 and topk >= 1, got {chunk}, {topk}")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.chunk, self.topk = int(chunk), int(topk)
        self.process_group = process_group
        self.on_send: Callable[[int, int, int], None] | None = None
        self.times: Any = None

    @torch.no_grad()
    def extract(self, p: torch.Tensor, decay: float) -> tuple[Chunking, Any, Any, torch.Tensor]:
        """Add ``p``'s gradient to its momentum (decayed by ``decay``) and take the fast
        components out: (chunking, values, indices in the chunks, the part sent)."""
        st = self.state[p]
        if "momentum" not in st:
            st["momentum"] = torch.zeros_like(p, dtype=torch.float32)
        m = st["momentum"]
        m.mul_(decay)
        if p.grad is not None:  # a parameter without a gradient still sends its momentum
            m.add_(p.grad.float())
        ch = Chunking.of(p.shape, self.chunk, self.topk)
        values, idx = ch.select(m)
        sent = ch.tensor(ch.scatter(values, idx))
        m.sub_(sent)  # what stays is the error, kept for the next steps
        return ch, values, idx, sent

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        live = [(g, p) for g in self.param_groups for p in g["params"] if p.numel()]
        if not live:
            return loss
        t0 = self._now(live[0][1])
        parts = [self.extract(p, g["momentum"]) for g, p in live]
        self._select(t0, self._now(live[0][1]))
        chunkings = [ch for ch, *_ in parts]
        ready = dist.is_available() and dist.is_initialized()
        world = dist.get_world_size(self.process_group) if ready else 1
        if world == 1:  # the average of one worker: what it sent
            averages, packet = [sent for *_, sent in parts], packet_size(chunkings)
        else:
            averages, packet = self._exchange(parts, world)
        if self.on_send is not None:
            numel = sum(p.numel() for _, p in live)
            self.on_send(packet, sum(c.pairs for c in chunkings), numel)
        for (group, p), average in zip(live, averages, strict=True):
            lr, wd = group["lr"], group["weight_decay"]
            if wd:
                p.mul_(1.0 - lr * wd)  # decoupled weight decay
            p.add_(average.sign().to(p.dtype), alpha=-lr)
        return loss

    def _exchange(self, parts: list[tuple], world: int) -> tuple[list[torch.Tensor], int]:
        """All-gather every worker's pairs in one byte packet; decode the average."""
        chunkings = [ch for ch, *_ in parts]
        itype = index_dtype(chunkings)
        values = torch.cat([v.float().reshape(-1) for _, vs, _, _ in parts for v in vs])
        idx = torch.cat([i.reshape(-1) for _, _, ids, _ in parts for i in ids]).to(itype)
        packet = torch.cat([values.view(torch.uint8), idx.view(torch.uint8)])
        gathered = [torch.empty_like(packet) for _ in range(world)]
        t0 = self._now(packet)
        dist.all_gather(gathered, packet, group=self.process_group)
        t1 = self._now(packet)
        if self.times is not None:
            self.times.add_comm(t0, t1)
        n = values.numel()
        blocks = [b for ch in chunkings for b in ch.blocks]
        sums = [values.new_zeros(b.chunks, b.elems) for b in blocks]
        for buf in gathered:  # rank order on every worker: the same sums everywhere
            vals = buf[: 4 * n].view(torch.float32)
            ids = buf[4 * n :].view(itype).long()
            at = 0
            for b, acc in zip(blocks, sums, strict=True):
                end = at + b.pairs
                shape = (b.chunks, b.k)
                acc.scatter_add_(1, ids[at:end].view(shape), vals[at:end].view(shape))
                at = end
        averages, at = [], 0
        for ch in chunkings:
            own = sums[at : at + len(ch.blocks)]
            averages.append(ch.tensor([acc / world for acc in own]))
            at += len(ch.blocks)
        self._select(t1, self._now(packet))
        return averages, packet.numel()

    def _now(self, like: torch.Tensor) -> Any:
        return self.times.now(like) if self.times is not None else None

    def _select(self, start: Any, end: Any) -> None:
        if self.times is not None:
            self.times.add_select(start, end)


def check_demo(cfg: OptimConfig) -> None:
    if cfg.demo_chunk < 1:
        raise ConfigError(f"optim.demo_chunk must be >= 1, got {cfg.demo_chunk}")
    most = cfg.demo_chunk * cfg.demo_chunk
    if not 1 <= cfg.demo_topk <= most:
        raise ConfigError(
            f"optim.demo_topk must be in [1, {most}] (the elements of a "
            f"{cfg.demo_chunk} x {cfg.demo_chunk} chunk), got {cfg.demo_topk}"
        )
    if not 0.0 <= cfg.momentum < 1.0:
        raise ConfigError(f"optim.momentum (DeMo's decay) must be in [0, 1), got {cfg.momentum}")


def _build(groups: list[dict], cfg: OptimConfig, *_: Any) -> DeMo:
    return DeMo(groups, lr=cfg.lr, momentum=cfg.momentum, chunk=cfg.demo_chunk, topk=cfg.demo_topk)


register(
    OptimizerSpec(
        name="demo",
        build_torch=_build,
        build_flat=_build,
        modes=frozenset({UpdateMode.naive}),
        validate=check_demo,
        local_gradients=True,
    )
)
