"""Bucket layouts by parameter name, and the exact replay of a saved layout: a hook's
state is positional in DDP's buckets, which DDP lays out anew after a restart, so
:class:`Replay` reduces the gradients regrouped into the saved buckets (bit for bit).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from bench.comm.futures import Future, new_future


def places(bucket: Any) -> list[tuple[int, int, int]]:
    """(parameter id, element offset in the bucket's buffer, elements) of its parameters."""
    buf = bucket.buffer()
    es = buf.element_size()
    return [
        (id(p), (g.data_ptr() - buf.data_ptr()) // es, g.numel())
        for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True)
    ]


@dataclass(frozen=True)
class BucketLayout:
    """One DDP bucket: its index, its parameters (names) at their offsets, its size."""

    index: int
    names: tuple[str, ...]
    offsets: tuple[int, ...]  # element offset of each parameter's gradient in the buffer
    shapes: tuple[tuple[int, ...], ...]
    size: int  # elements in the bucket's flat buffer

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "names": list(self.names),
            "offsets": list(self.offsets),
            "shapes": [list(s) for s in self.shapes],
            "size": self.size,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BucketLayout:
        return cls(
            int(d["index"]),
            tuple(str(n) for n in d["names"]),
            tuple(int(o) for o in d["offsets"]),
            tuple(tuple(int(x) for x in s) for s in d["shapes"]),
            int(d["size"]),
        )


#: the buckets of one step, in index order
Layout = list[BucketLayout]


def describe(bucket: Any, names: Mapping[int, str]) -> BucketLayout:
    """The layout of a DDP bucket (``names``: parameter id -> name), with any gap DDP leaves."""
    params = bucket.parameters()
    if any(id(p) not in names for p in params):
        raise ValueError(
            "DDP reduces parameters of another model than the hook state's: give it the "
            "DDP's model (make_hook(..., model=) or state.set_model())"
        )
    return BucketLayout(
        bucket.index(),
        tuple(names[id(p)] for p in params),
        tuple(off for _, off, _ in places(bucket)),
        tuple(tuple(p.shape) for p in params),
        bucket.buffer().numel(),
    )


class _SavedBucket:
    """A bucket of the saved layout: the methods of ``dist.GradBucket`` the hooks call."""

    def __init__(
        self, lay: BucketLayout, buf: torch.Tensor, params: list[torch.Tensor], last: bool
    ) -> None:
        self.lay, self.buf, self.params, self.last = lay, buf, params, last

    def index(self) -> int:
        return self.lay.index

    def buffer(self) -> torch.Tensor:
        return self.buf

    def gradients(self) -> list[torch.Tensor]:
        lay = self.lay
        return [
            self.buf[off : off + math.prod(shape)].view(shape)
            for off, shape in zip(lay.offsets, lay.shapes, strict=True)
        ]

    def parameters(self) -> list[torch.Tensor]:
        return self.params

    def is_last(self) -> bool:
        return self.last


class _Present:
    """One of DDP's buckets of this step: its buffer, its parameters' places, its future."""

    def __init__(self, bucket: Any) -> None:
        self.buf = bucket.buffer()
        self.place = {pid: off for pid, off, _ in places(bucket)}
        self.pending = 0  # saved buckets not yet reduced that cover some of its parameters
        self.fut = new_future(self.buf)


class Replay:
    """Reduces DDP's buckets in a saved layout (module docstring)."""

    def __init__(
        self, layout: Layout, params: Mapping[str, torch.Tensor], hook: Callable[[Any], Future]
    ) -> None:
        missing = sorted({n for b in layout for n in b.names} - set(params))
        if missing:
            raise ValueError(f"the saved layout names parameters this model lacks: {missing}")
        self.layout = sorted(layout, key=lambda b: b.index)
        self.params = params
        self.name_of = {id(p): n for n, p in params.items()}
        self.owner_of = {n: i for i, b in enumerate(self.layout) for n in b.names}
        self.hook = hook
        self.matched = False  # a whole step went through without regrouping
        # completions run in the backend's threads: two may count down one bucket at once
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.present: dict[int, _Present] = {}  # parameter id -> its bucket of this step
        self.next = 0  # the next saved bucket to reduce
        self.regrouped = False

    def __call__(self, bucket: Any) -> Future:
        cur = _Present(bucket)
        covering = set()
        for pid in cur.place:
            name = self.name_of.get(pid)
            if name is None or name not in self.owner_of:  # it would go unreduced
                raise RuntimeError(
                    f"DDP reduces parameter {name or pid!r}, which the saved layout lacks"
                )
            covering.add(self.owner_of[name])
            self.present[pid] = cur
        cur.pending = len(covering)
        last = bucket.is_last()
        while self.next < len(self.layout) and self._ready(self.layout[self.next]):
            self._issue(self.layout[self.next], bucket)
            self.next += 1
        if last:
            if self.next < len(self.layout):  # a parameter DDP never handed over
                raise RuntimeError(
                    "DDP's buckets do not cover the saved layout's parameters: "
                    f"{self.layout[self.next].names[:4]} ..."
                )
            self.matched = not self.regrouped
            self._reset()
        return cur.fut

    def _ready(self, lay: BucketLayout) -> bool:
        return all(id(self.params[n]) in self.present for n in lay.names)

    def _issue(self, lay: BucketLayout, bucket: Any) -> None:
        params = [self.params[n] for n in lay.names]
        owners = [self.present[id(p)] for p in params]
        first = owners[0]
        same = (
            all(o is first for o in owners)
            and first.buf.numel() == lay.size
            and len(first.place) == len(params)
            and all(first.place[id(p)] == off for p, off in zip(params, lay.offsets, strict=True))
        )
        last = lay is self.layout[-1]
        if same:  # DDP's bucket is the saved one: nothing to copy
            fut = self.hook(_SavedBucket(lay, first.buf, params, last))
            fut.add_done_callback(lambda f: self._done(f, [first], None))
            return
        self.regrouped = True
        buf = first.buf.new_zeros(lay.size)
        pieces = []
        for p, off, shape, o in zip(params, lay.offsets, lay.shapes, owners, strict=True):
            n, src = math.prod(shape), o.place[id(p)]
            buf[off : off + n].copy_(o.buf[src : src + n])
            pieces.append((o, src, off, n))
        uniq = list({id(o): o for o in owners}.values())
        fut = self.hook(_SavedBucket(lay, buf, params, last))
        fut.add_done_callback(lambda f: self._done(f, uniq, pieces))

    def _done(self, f: Future, owners: list[_Present], pieces: list[tuple] | None) -> None:
        try:
            out = f.value()
            out = out[0] if isinstance(out, list) else out
            for o, src, off, n in pieces or ():
                o.buf[src : src + n].copy_(out[off : off + n])
            if pieces is None and out.data_ptr() != owners[0].buf.data_ptr():
                owners[0].buf.copy_(out)
        except BaseException as e:  # the step fails with it instead of hanging DDP
            for o in owners:
                if not o.fut.done():
                    o.fut.set_exception(e)
            return
        for o in owners:
            with self._lock:
                o.pending -= 1
                complete = o.pending == 0
            if complete:
                o.fut.set_result(o.buf)
