"""The flat buffers of a flat optimizer (a :class:`FlatBucket` per device and dtype: model
copy, fp32 masters, gradients and state) and the :class:`Span` one update call takes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter, is_
from typing import Any

import torch

from bench.optim import layout
from bench.optim.layout import dense_view, is_dense
from bench.registry import ConfigError

_grad_of = attrgetter("grad")
_version_of = attrgetter("_version")
_data_ptr_of = torch.Tensor.data_ptr


@dataclass(eq=False)
class Span:
    """Values of one flat bucket that one update call takes, with their gradients and state."""

    bucket: int  # index of the bucket in its optimizer's ``buckets``
    flat: FlatBucket
    params: list[torch.Tensor]
    grads: list[torch.Tensor]
    state: dict[str, list[torch.Tensor]]
    where: list[tuple[int, int]]
    layers: list[list[int]] | None
    first: bool = False
    age: int = 0
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def numel(self) -> int:
        return sum(e - s for s, e in self.where)

    @property
    def smallest(self) -> int:  # values in the shortest entry (CPU kernels choose by it)
        return min(e - s for s, e in self.where)

    def scratch(self, name: str) -> list[torch.Tensor]:
        """The span's positions in the bucket's scratch buffer ``name`` (kept per span)."""
        key = "scratch:" + name
        if key not in self.cache:
            buf = self.flat.buffer(name)
            self.cache[key] = [buf[s:e] for s, e in self.where]
        return self.cache[key]


class FlatBucket:
    """The flat buffers of the parameters of one (device, dtype, low-precision model dtype)."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        group_ids: list[int],
        state_names: Iterable[str],
        model_dtype: torch.dtype | None,
    ) -> None:
        self.device, self.master_dtype = params[0].device, params[0].dtype
        self.dtype = model_dtype or self.master_dtype  # of the model copy and its gradients
        self.params = params
        self.numels = [p.numel() for p in params]
        self.offsets = list(itertools.accumulate(self.numels[:-1], initial=0))
        self.numel = sum(self.numels)
        master = torch.empty(self.numel, dtype=self.master_dtype, device=self.device)
        for p, off in zip(params, self.offsets, strict=True):
            if not is_dense(p):
                raise ConfigError(
                    "optim.update=flat needs dense (contiguous or channels_last) parameters"
                )
            dense_view(master, off, p).copy_(p.detach())
        self.master = master  # fp32 masters when the model copy is bf16/fp16, else the copy
        self.model = master.to(self.dtype)
        self.grad = torch.zeros(self.numel, dtype=self.dtype, device=self.device)
        # the update reads fp32 gradients: an upcast copy when the model copy is bf16/fp16
        self.grad32 = torch.empty_like(master) if self.has_master else None
        self.state = {name: torch.zeros_like(master) for name in state_names}
        self.scratch: dict[str, torch.Tensor] = {}  # allocated once on first use
        self.grad_views = [dense_view(self.grad, off, p) for p, off in zip(params, self.offsets)]
        with torch.no_grad():
            for p, off, g in zip(params, self.offsets, self.grad_views, strict=True):
                old = p.grad
                p.data = dense_view(self.model, off, p)  # same Parameter object, new storage
                if old is not None:  # an existing gradient moves into the buffer
                    g.copy_(old)
                    p.grad = g
        self.model_ptrs = [p.data_ptr() for p in params]
        self.initialized = [False] * len(params)  # has optimizer state, as torch's self.state
        self.versions: list[int] = []  # p._version when the master last matched the model
        self.record_versions()
        self.group_ids = list(group_ids)
        # gradients that live in DDP's buckets (layout.Segment), the segment of each
        # parameter (-1: its gradient is its view of self.grad), the grads last seen
        self.segments: list[layout.Segment] = []
        self.seg_of = [-1] * len(params)
        self.on_relayout: Callable[[list[int]], None] | None = None
        self.relayouts = 0  # times the buffers were re-laid after DDP's buckets
        self._new_layout([p.grad for p in params])
        self.copies = 0  # gradients that had to be copied into the buffer (not views)

    def _new_layout(self, seen: list[torch.Tensor | None]) -> None:
        # parameters whose gradient is (or becomes) their view of self.grad
        self.own = [k for k in range(len(self.params)) if self.seg_of[k] < 0]
        self._note_seen(seen)
        self.whole_cache: dict[Any, Any] = {}  # layout.schedule's, for this layout
        self._group_spans: dict[int, list[tuple[int, Span]]] = {}
        # contiguous ranges of one param group and one gradient segment:
        # (group index, start, end, first parameter, end parameter)
        self.ranges: list[tuple[int, int, int, int, int]] = []
        i = 0
        for (gi, _), run in itertools.groupby(zip(self.group_ids, self.seg_of)):
            j = i + len(list(run))
            self.ranges.append((gi, self.offsets[i], self.end(j), i, j))
            i = j
        rest = self.segments[-1].end if self.segments else 0
        srcs = [seg.grad for seg in self.segments] + [self.grad[rest:]]
        if self.grad32 is not None:  # one upcast copy per segment and one for the rest
            dsts = [self.grad32[s.start : s.end] for s in self.segments] + [self.grad32[rest:]]
            self._upcast: tuple[list[torch.Tensor], list[torch.Tensor]] | None = (dsts, srcs)
            self._step_grads = [self.grad32]
        else:
            self._upcast = None
            self._step_grads = srcs

    def _note_seen(self, seen: list[torch.Tensor | None]) -> None:
        """The gradients of this step's parameters, and what follows from them."""
        self.seen = list(seen)
        self.has = [g is not None for g in self.seen]
        self.all_grads = all(self.has)
        # own views of parameters without a gradient: zeroed at every step
        self._empty_views = [self.grad_views[k] for k in self.own if self.seen[k] is None]

    @property
    def has_master(self) -> bool:  # fp32 masters of a low-precision model copy
        return self.master is not self.model

    def end(self, j: int) -> int:  # offset just past parameter j - 1
        return self.offsets[j - 1] + self.numels[j - 1]

    def buffer(self, name: str) -> torch.Tensor:
        if name not in self.scratch:
            self.scratch[name] = torch.empty(
                self.numel, dtype=self.master_dtype, device=self.device
            )
        return self.scratch[name]

    def view(self, flat: torch.Tensor, i: int) -> torch.Tensor:
        return dense_view(flat, self.offsets[i], self.params[i])

    def span(self, bi: int, ranges: list[tuple[int, int, int, int]]) -> Span:
        """The span over ``ranges``: ``(start, end, i, j)``, parameters ``i..j-1`` each."""
        return Span(
            bucket=bi,
            flat=self,
            params=[self.master[s:e] for s, e, _, _ in ranges],
            grads=[self.run_grad(i, s, e) for s, e, i, _ in ranges],
            state={n: [buf[s:e] for s, e, _, _ in ranges] for n, buf in self.state.items()},
            where=[(s, e) for s, e, _, _ in ranges],
            layers=[self.numels[i:j] for _, _, i, j in ranges],
            age=ranges[0][2],
        )

    def group_spans(self, bi: int, split_below: int) -> list[tuple[int, Span]]:
        """``(group index, span)``: one span per param group over all its ranges, built
        once per layout; ranges shorter than ``split_below`` in a second span of their group
        (CPU kernels that thread each tensor pay for it on short ones)."""
        if split_below not in self._group_spans:
            by_group: dict[int, list[tuple[int, int, int, int]]] = {}
            for gi, s, e, i, j in self.ranges:
                if e > s:
                    by_group.setdefault(gi, []).append((s, e, i, j))
            out = []
            for gi, rs in by_group.items():
                long = [r for r in rs if r[1] - r[0] >= split_below]
                short = [r for r in rs if r[1] - r[0] < split_below]
                out += [(gi, self.span(bi, part)) for part in (long, short) if part]
            self._group_spans[split_below] = out
        return self._group_spans[split_below]

    def gather_grads(self) -> list[bool]:
        """Find every gradient, copying none of DDP's; which parameters have one."""
        grads = list(map(_grad_of, self.params))
        if not all(map(is_, grads, self.seen)):
            self.check_layout(grads)
            self._take_grads()
        params = self.params  # re-laid above: a new order
        if list(map(_data_ptr_of, params)) != self.model_ptrs:
            raise RuntimeError(
                "a parameter was moved or replaced after its flat optimizer was built; "
                "build the optimizer after model.to(device)"
            )
        if self._empty_views:
            torch._foreach_zero_(self._empty_views)
        versions = list(map(_version_of, params))
        if versions != self.versions:
            self.refresh_masters([k for k, v in enumerate(versions) if v != self.versions[k]])
        return self.has

    def _take_grads(self) -> None:
        """Gradients that are neither DDP's nor views of ``self.grad`` are copied in."""
        for k in self.own:
            p, g, pg = self.params[k], self.grad_views[k], self.seen[k]
            if pg is not g and pg is not None:
                g.copy_(pg)
                self.copies += 1
                p.grad = self.seen[k] = g

    def check_layout(self, grads: list[torch.Tensor | None]) -> None:
        """Lay the buffers out after the storages of ``grads`` (DDP's buckets)."""
        order, lengths = layout.plan(self.params, grads, self.group_ids, self.dtype, self.grad)
        if order != list(range(len(order))):
            self.relayout(order)
            grads = [grads[k] for k in order]
        self.segments = layout.segments(grads, self.offsets, self.numels, lengths)
        self.seg_of = [-1] * len(self.params)
        for s, seg in enumerate(self.segments):
            self.seg_of[seg.i : seg.j] = [s] * (seg.j - seg.i)
        self._new_layout(grads)

    @torch.no_grad()
    def relayout(self, perm: list[int]) -> None:
        """New buffers whose parameter ``n`` is the old ``perm[n]``; views follow."""
        stale = [k for k, p in enumerate(self.params) if p._version != self.versions[k]]
        self.refresh_masters(stale)  # before the version counters are taken again
        old_offsets, numels, old_views = self.offsets, self.numels, self.grad_views
        self.params = [self.params[k] for k in perm]
        self.numels = [numels[k] for k in perm]
        self.group_ids = [self.group_ids[k] for k in perm]
        self.initialized = [self.initialized[k] for k in perm]
        self.offsets = list(itertools.accumulate(self.numels[:-1], initial=0))

        def moved(flat: torch.Tensor) -> torch.Tensor:
            out = torch.empty_like(flat)
            for n, k in enumerate(perm):
                new, old = self.offsets[n], old_offsets[k]
                out[new : new + numels[k]].copy_(flat[old : old + numels[k]])
            return out

        master = moved(self.master)
        self.model = moved(self.model) if self.has_master else master
        self.master, self.grad = master, moved(self.grad)
        self.grad32 = torch.empty_like(master) if self.grad32 is not None else None
        self.state = {name: moved(buf) for name, buf in self.state.items()}
        self.grad_views = [dense_view(self.grad, o, p) for p, o in zip(self.params, self.offsets)]
        for n, p in enumerate(self.params):
            own = p.grad is not None and p.grad is old_views[perm[n]]
            p.data = dense_view(self.model, self.offsets[n], p)
            if own:
                p.grad = self.grad_views[n]
        self.model_ptrs = [p.data_ptr() for p in self.params]
        self.record_versions()
        self.relayouts += 1
        if self.on_relayout is not None:
            self.on_relayout(perm)

    def run_grad(self, i: int, start: int, end: int) -> torch.Tensor:
        """The gradient of ``start:end`` (parameters from ``i`` on, in one segment)."""
        if self.grad32 is not None:
            return self.grad32[start:end]
        s = self.seg_of[i]
        if s < 0:
            return self.grad[start:end]
        seg = self.segments[s]
        return seg.grad[start - seg.start : end - seg.start]

    def prepare(self, grad_scale: torch.Tensor | None) -> None:
        """fp32 upcast of bf16/fp16 gradients, GradScaler's unscaling (in place)."""
        if self._upcast is not None:
            torch._foreach_copy_(*self._upcast)
        if grad_scale is not None:
            torch._foreach_div_(self._step_grads, grad_scale.to(self.device))

    def zero_grad(self, set_to_none: bool) -> None:
        """Gradients in DDP's buckets are zeroed in place either way (dropped, DDP would
        copy every gradient again); the others as torch's."""
        if self.segments:
            torch._foreach_zero_([seg.grad for seg in self.segments])
        if not self.own:
            return
        if not set_to_none:
            self.grad.zero_()
        for k in self.own:
            p = self.params[k]
            if p.grad is not None:
                p.grad = self.seen[k] = None if set_to_none else self.grad_views[k]
        self._note_seen(self.seen)

    @torch.no_grad()
    def refresh_masters(self, ks: Iterable[int]) -> None:
        """Masters of parameters ``ks`` that no longer round to the model copy follow it; the
        others keep the precision the copy lacks."""
        if self.has_master:
            for k in ks:
                m, md = self.view(self.master, k), self.view(self.model, k)
                if not torch.equal(m.to(self.dtype), md):
                    m.copy_(md)
        self.record_versions()

    @torch.no_grad()
    def load_master(self, k: int, saved: torch.Tensor | None) -> None:
        """Parameter ``k``'s master from a checkpoint, if it belongs to the model's values."""
        md = self.view(self.model, k)
        if saved is not None and torch.equal(saved.to(self.device, self.dtype), md):
            self.view(self.master, k).copy_(saved)

    def record_versions(self) -> None:
        # in-place writes through a parameter (load_state_dict, a broadcast) bump its
        # version counter; writes into the flat buffers themselves do not
        self.versions = list(map(_version_of, self.params))

    def runs(self, has: list[bool], keys: list[Any]) -> list[tuple[int, int, int]]:
        """``(group, i, j)``: maximal runs with a gradient and one ``keys`` value (age)."""
        out = []
        for gi, _, _, i, j in self.ranges:
            for (ok, _), run in itertools.groupby(zip(has[i:j], keys[i:j])):
                n = len(list(run))
                if ok:
                    out.append((gi, i, i + n))
                i += n
        return out
