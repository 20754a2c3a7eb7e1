"""Flat-buffer optimizer base: parameters, gradients and state as views into one buffer.

The "parallel tensor operator" of Shi et al. (MLSys 2021, section 4; docs/algorithms.md),
done as apex's ``multi_tensor_apply`` and Megatron/DeepSpeed's contiguous buffers: every
parameter, gradient and optimizer state is a view into ONE buffer per (device, dtype),
so the update is a handful of vector operations instead of a kernel chain per tensor.

Layout (one :class:`FlatBucket` per (device, model dtype)):

* ``model``  flat tensor in the model's dtype; every ``p.data`` is a view into it;
* ``master`` fp32 flat copy when a low-precision (bf16/fp16) model copy is kept (for
  parameters of 2 or more dimensions; norm parameters and biases stay fp32, as apex's
  ``keep_batchnorm_fp32``), else the same tensor as ``model``; the update runs on it and
  is copied back to ``model``;
* ``grad``   flat tensor in the model's dtype: ``p.grad`` is its view, except under DDP;
* ``state[name]`` one flat fp32 buffer per state name (momentum, exp_avg ...).

Zero-copy under DDP (``gradient_as_bucket_view=True``, :func:`bench.optim.ddp_kwargs`):
DDP makes every ``p.grad`` a view into its bucket; at the first step (and whenever the
gradients are other tensors than at the last step: DDP's bucket rebuild) the buffers are
re-laid in DDP's bucket order (:mod:`bench.optim.layout`), each bucket one contiguous
range, and the update reads the bucket tensors themselves: no gradient copy.  Param
groups interleaved within a bucket become sub-ranges.  Elsewhere (no DDP) parameters are
ordered by param group and ``p.grad`` are views of ``grad``; a gradient that is neither
(autograd's after ``zero_grad(set_to_none=True)``) is copied in, counted in
``FlatBucket.copies``.

Parameters without a gradient, as torch: a parameter whose ``p.grad`` is None when
:meth:`FlatOptimizer.step` runs is skipped (no weight decay, momentum or Adam step) and
has no state until its first gradient.  ``zero_grad(set_to_none=True)`` drops gradients,
except those in DDP's buckets, which are zeroed in place (dropping them would make DDP
copy every new gradient into its bucket; so under DDP a parameter that had a gradient
and is unused in a later step gets a zero gradient, as with ``set_to_none=False``);
``set_to_none=False`` zeroes and keeps None as None.  The update runs over maximal runs
of neighbouring parameters of one group and one bucket with a gradient and the same
state age.

Master weights follow the model: a master that no longer rounds to its model tensor
(the model was written in place without it: ``model.load_state_dict``, DDP's broadcast)
is re-derived from the model, checked by the parameters' version counters at every step
and at ``load_state_dict``.  ``state_dict``/``load_state_dict`` use the standard torch
format (per-parameter tensors keyed by index), so a state saved in ``flat`` mode loads in
``naive``/``foreach``/``fused`` mode and vice versa; a saved ``master_param`` is used
only when a flat optimizer wrote it and it rounds to the model's current values (other
optimizers carry it through their state dicts unchanged, however the weights moved).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from bench.optim import layout
from bench.optim.checkpoint import FlatCheckpoint
from bench.optim.layout import dense_view as _dense_view
from bench.optim.layout import is_dense as _is_dense
from bench.optim.modes import MODE_KEYS, fused_kernels_available, keep_mode_keys
from bench.registry import ConfigError

CPU_FUSED_MIN = 1 << 17  # values: smaller ranges take the vector-op path on CPU

__all__ = ["MODE_KEYS", "FlatBucket", "FlatOptimizer", "fused_kernels_available", "keep_mode_keys"]


class FlatBucket:
    """The flat buffers of the parameters of one (device, dtype, low-precision model dtype)."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        group_ids: list[int],
        state_names: Iterable[str],
        model_dtype: torch.dtype | None,
    ) -> None:
        first = params[0]
        self.device = first.device
        src_dtype = first.dtype
        self.dtype = model_dtype or src_dtype  # dtype of the model copy and of its grads
        self.master_dtype = src_dtype  # fp32 master weights when the model copy is bf16/fp16
        self.params = params
        self.numels = [p.numel() for p in params]
        self.offsets = [0]
        for n in self.numels[:-1]:
            self.offsets.append(self.offsets[-1] + n)
        self.numel = sum(self.numels)
        master = torch.empty(self.numel, dtype=self.master_dtype, device=self.device)
        for p, off in zip(params, self.offsets, strict=True):
            if not _is_dense(p):
                raise ConfigError(
                    "optim.update=flat needs dense (contiguous or channels_last) parameters"
                )
            _dense_view(master, off, p).copy_(p.detach())
        if self.master_dtype != self.dtype:
            self.model = master.to(self.dtype)
            self.master = master
        else:
            self.model = self.master = master
        self.grad = torch.zeros(self.numel, dtype=self.dtype, device=self.device)
        # the update reads fp32 gradients: an upcast copy when the model copy is bf16/fp16
        self.grad32 = torch.empty_like(master) if self.has_master else None
        self.state = {name: torch.zeros_like(master) for name in state_names}
        self.scratch: dict[str, torch.Tensor] = {}  # allocated once on first use
        self.grad_views = [_dense_view(self.grad, off, p) for p, off in zip(params, self.offsets)]
        with torch.no_grad():
            for p, off, g in zip(params, self.offsets, self.grad_views, strict=True):
                old = p.grad
                p.data = _dense_view(self.model, off, p)  # same Parameter object, new storage
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
        self.seen: list[torch.Tensor | None] = [p.grad for p in params]
        self.whole_cache: dict[Any, Any] = {}  # layout.schedule's, for this layout
        self.on_relayout: Callable[[list[int]], None] | None = None
        self.relayouts = 0  # times the buffers were re-laid after DDP's buckets
        self._build_ranges()
        self.copies = 0  # gradients that had to be copied into the buffer (not views)

    def _build_ranges(self) -> None:
        # contiguous ranges of one param group and one gradient segment:
        # [(group index, start, end, first, last param)]
        self.ranges: list[tuple[int, int, int, int, int]] = []
        n, gid, seg = len(self.params), self.group_ids, self.seg_of
        i = 0
        while i < n:
            j = i
            while j < n and gid[j] == gid[i] and seg[j] == seg[i]:
                j += 1
            self.ranges.append((gid[i], self.offsets[i], self.end(j), i, j))
            i = j

    @property
    def has_master(self) -> bool:
        """Whether the update runs on fp32 masters of a low-precision model copy."""
        return self.master is not self.model

    def end(self, j: int) -> int:
        """Offset just past parameter ``j - 1``."""
        return self.offsets[j - 1] + self.numels[j - 1]

    def buffer(self, name: str) -> torch.Tensor:
        """A scratch buffer of the master dtype, allocated on first use and kept."""
        if name not in self.scratch:  # sized by numel: self.master may be a compact swap
            self.scratch[name] = torch.empty(
                self.numel, dtype=self.master_dtype, device=self.device
            )
        return self.scratch[name]

    def small_buffer(self, name: str, numel: int) -> torch.Tensor:
        """A scratch buffer of at least ``numel`` values of the master dtype, kept."""
        buf = self.scratch.get(name)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=self.master_dtype, device=self.device)
            self.scratch[name] = buf
        return buf

    def view(self, flat: torch.Tensor, i: int) -> torch.Tensor:
        """Parameter ``i``'s view into a flat buffer (state, master ...)."""
        return _dense_view(flat, self.offsets[i], self.params[i])

    def gather_grads(self) -> list[bool]:
        """Find every gradient, without copying DDP's; which parameters have one.

        Gradients in DDP's buckets (``gradient_as_bucket_view=True``) are used where they
        are: when they are not the ones seen at the last step, :meth:`check_layout`
        re-lays the buffers after them.  Any other gradient that is not the parameter's
        view of ``self.grad`` (autograd's after ``set_to_none``) is copied in (counted in
        ``copies``); a parameter whose ``p.grad`` is None keeps it None (it is skipped).
        """
        grads = [p.grad for p in self.params]
        if any(g is not s for g, s in zip(grads, self.seen, strict=True)):
            self.check_layout(grads)
            grads = self.seen
        has = []
        moved = []
        for k, (p, g) in enumerate(zip(self.params, self.grad_views, strict=True)):
            if p.data_ptr() != self.model_ptrs[k]:
                raise RuntimeError(
                    "a parameter was moved or replaced after its flat optimizer was built; "
                    "build the optimizer after model.to(device)"
                )
            if p._version != self.versions[k]:
                moved.append(k)
            pg = grads[k]
            has.append(pg is not None)
            if pg is g or self.seg_of[k] >= 0:
                continue
            if pg is None:
                g.zero_()
            else:
                g.copy_(pg)
                self.copies += 1
                p.grad = self.seen[k] = g
        if moved:
            self.refresh_masters(moved)
        return has

    def check_layout(self, grads: list[torch.Tensor | None]) -> None:
        """Lay the buffers out after the storages of ``grads`` (:func:`layout.plan`):
        re-laid when the order changes (DDP's first step, its bucket rebuild)."""
        order, lengths = layout.plan(self.params, grads, self.group_ids, self.dtype, self.grad)
        if order != list(range(len(order))):
            self.relayout(order)
            grads = [grads[k] for k in order]
        self.segments = layout.segments(grads, self.offsets, self.numels, lengths)
        self.seg_of = [-1] * len(self.params)
        for s, seg in enumerate(self.segments):
            self.seg_of[seg.i : seg.j] = [s] * (seg.j - seg.i)
        self._build_ranges()
        self.seen = list(grads)
        self.whole_cache: dict[Any, Any] = {}  # layout.schedule's, for this layout

    def relayout(self, perm: list[int]) -> None:
        """New buffers whose parameter ``n`` is the old parameter ``perm[n]``."""
        stale = [k for k, p in enumerate(self.params) if p._version != self.versions[k]]
        self.refresh_masters(stale)  # before the version counters are taken again
        layout.relayout(self, perm)
        self.model_ptrs = [p.data_ptr() for p in self.params]
        self.record_versions()
        self.relayouts += 1
        if self.on_relayout is not None:
            self.on_relayout(perm)

    def run_grad(self, i: int, start: int, end: int) -> torch.Tensor:
        """The gradient of the range ``start:end`` (parameters from ``i`` on, in one
        segment): the fp32 upcast, a slice of a DDP bucket, or of ``self.grad``."""
        if self.grad32 is not None:
            return self.grad32[start:end]
        s = self.seg_of[i]
        if s < 0:
            return self.grad[start:end]
        seg = self.segments[s]
        return seg.grad[start - seg.start : end - seg.start]

    def prepare(self, grad_scale: torch.Tensor | None) -> None:
        """fp32 upcast of bf16/fp16 gradients (one pass per segment), GradScaler's
        unscaling (in place, as torch's GradScaler.unscale_)."""
        rest = self.segments[-1].end if self.segments else 0
        if self.grad32 is not None:
            for seg in self.segments:
                self.grad32[seg.start : seg.end].copy_(seg.grad)
            self.grad32[rest:].copy_(self.grad[rest:])
            grads = [self.grad32]
        else:
            grads = [seg.grad for seg in self.segments] + [self.grad[rest:]]
        if grad_scale is not None:
            for g in grads:
                g.div_(grad_scale.to(self.device))

    def zero_grad(self, set_to_none: bool) -> None:
        """Gradients in DDP's buckets are zeroed in place, with either ``set_to_none``
        (dropping them would make DDP copy every gradient into its bucket again);
        the others are dropped or zeroed (their view of ``self.grad``) as torch's."""
        for seg in self.segments:
            seg.grad.zero_()
        if not set_to_none:
            self.grad.zero_()
        for k, (p, g) in enumerate(zip(self.params, self.grad_views, strict=True)):
            if self.seg_of[k] >= 0 or p.grad is None:
                continue
            p.grad = self.seen[k] = None if set_to_none else g

    @torch.no_grad()
    def refresh_masters(self, ks: Iterable[int]) -> None:
        """Re-derive from the model copy the masters of parameters ``ks`` that no longer
        round to it; a master that does is kept (it holds the precision the copy lacks)."""
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
        self.versions = [p._version for p in self.params]

    def runs(self, has: list[bool], keys: list[Any]) -> list[tuple[int, int, int]]:
        """``(group, i, j)``: maximal runs of parameters ``i..j-1`` of one group that all
        have a gradient and the same ``keys`` value (their optimizer state's age)."""
        out = []
        for gi, _start, _end, i, j in self.ranges:
            k = i
            while k < j:
                if not has[k]:
                    k += 1
                    continue
                s = k
                while k < j and has[k] and keys[k] == keys[s]:
                    k += 1
                out.append((gi, s, k))
        return out


class FlatOptimizer(FlatCheckpoint, torch.optim.Optimizer):
    """Base class: builds the flat layout; subclasses implement :meth:`_update_range`."""

    state_names: tuple[str, ...] = ()
    # False: the portable vector-op path even where torch has fused kernels (tests use it)
    allow_fused = True
    # GradScaler passes grad_scale/found_inf attributes instead of unscaling fp16 grads itself
    _step_supports_amp_scaling = True

    def __init__(
        self, params: Any, defaults: dict[str, Any], model_dtype: torch.dtype | None = None
    ) -> None:
        super().__init__(params, defaults)
        Key = tuple[torch.device, torch.dtype, torch.dtype | None]
        keyed: dict[Key, tuple[list, list]] = {}
        seen: set[int] = set()
        for gi, group in enumerate(self.param_groups):
            group["flat"] = True
            for p in group["params"]:
                if id(p) in seen:
                    raise ConfigError("a parameter appears in two optimizer param groups")
                seen.add(id(p))
                # low-precision model copy for weight matrices/filters only: 1-D parameters
                # (norm affine, biases) stay fp32, as apex's keep_batchnorm_fp32
                lowp = model_dtype is not None and p.ndim >= 2 and p.dtype == torch.float32
                ps, gids = keyed.setdefault(
                    (p.device, p.dtype, model_dtype if lowp else None), ([], [])
                )
                ps.append(p)
                gids.append(gi)
        self.buckets = [
            FlatBucket(ps, gids, self.state_names, key[2]) for key, (ps, gids) in keyed.items()
        ]
        self.use_fused = [
            self.allow_fused and fused_kernels_available(b.device) for b in self.buckets
        ]
        for bi, b in enumerate(self.buckets):
            b.on_relayout = lambda perm, bi=bi: self._relaid(bi, perm)

    def fused(self, bi: int, numel: int) -> bool:
        """Whether to update ``numel`` values of bucket ``bi`` with torch's fused kernel:
        on CPU only for large ranges (it splits even a few values over all threads: a
        fork-join that costs milliseconds on a loaded machine; small ranges run inline)."""
        cpu = self.buckets[bi].device.type == "cpu"
        return self.use_fused[bi] and (not cpu or numel >= CPU_FUSED_MIN)

    def _relaid(self, bi: int, perm: list[int]) -> None:
        """Bucket ``bi`` was re-laid (parameter n is the old perm[n]): follow it."""
        self._permute_extra(bi, perm)
        b = self.buckets[bi]
        for k in range(len(b.params)):
            if b.initialized[k]:
                self._expose_state(bi, k)

    def _permute_extra(self, bi: int, perm: list[int]) -> None:
        pass

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "buckets", None) is not None:
            raise RuntimeError("a flat optimizer cannot take new param groups after construction")
        super().add_param_group(param_group)

    @torch.no_grad()
    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch, but gradients in DDP's buckets are zeroed (:meth:`FlatBucket.zero_grad`)."""
        for b in self.buckets:
            b.zero_grad(set_to_none)

    def _prepare(self) -> list[list[bool]] | None:
        """Gather grads, handle GradScaler's scale; which parameters have a gradient, per
        bucket, or None when the step must be skipped."""
        found_inf = getattr(self, "found_inf", None)
        if found_inf is not None and bool(found_inf.item() > 0):
            return None
        grad_scale = getattr(self, "grad_scale", None)
        has = []
        for b in self.buckets:
            has.append(b.gather_grads())
            b.prepare(grad_scale)
        return has

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        has = self._prepare()
        if has is None:
            return loss
        for bi, b in enumerate(self.buckets):
            keys = self._run_keys(bi)
            for gi, i, j, whole in layout.schedule(b, b.runs(has[bi], keys), keys):
                if whole is not None:  # one update over a whole DDP bucket, see schedule
                    self._whole_segment(bi, gi, i, whole)
                    continue
                start, end = b.offsets[i], b.end(j)
                grad = b.run_grad(i, start, end)
                first = not b.initialized[i]
                self._update_range(bi, self.param_groups[gi], grad, start, end, i, j, first, i)
                self._ran(bi, i, j, first)
            if b.has_master:
                b.model.copy_(b.master)  # fp32 master -> bf16/fp16 model copy, one pass
        return loss

    def _whole_segment(self, bi: int, gi: int, age: int, w: layout.Whole) -> None:
        """Update a DDP bucket (segment) as if all of it were the major runs ``w.runs``
        of group ``gi``, then put back the values outside them and update those (the
        ``w.minor`` runs): gathered into compact buffers when they are one group of one
        state age, else run by run.  A handful of operations instead of one per run."""
        b = self.buckets[bi]
        seg = b.segments[w.segment]
        kept = [b.master, *b.state.values()]
        saved = [buf.index_select(0, w.others) for buf in kept]
        grad = b.run_grad(seg.i, seg.start, seg.end)
        minor = w.minor[0] if w.minor else None
        compact = w.compact and minor is not None and self._compact_ok(self.param_groups[minor[0]])
        small_g = grad.index_select(0, w.local) if compact else None
        first = not b.initialized[age]
        group = self.param_groups[gi]
        self._update_range(bi, group, grad, seg.start, seg.end, seg.i, seg.j, first, age)
        if not compact:
            for buf, v in zip(kept, saved, strict=True):
                buf.index_copy_(0, w.others, v)
        for _, i, j in w.runs:
            self._ran(bi, i, j, first)
        if not compact:
            for g2, i, j in w.minor:
                start, end = b.offsets[i], b.end(j)
                grad = b.run_grad(i, start, end)
                first = not b.initialized[i]
                self._update_range(bi, self.param_groups[g2], grad, start, end, i, j, first, i)
                self._ran(bi, i, j, first)
            return
        # one update of the gathered values, then scattered back in place
        g2, i2 = minor[0], minor[1]
        first = not b.initialized[i2]
        master, state = b.master, b.state
        b.master, b.state = saved[0], dict(zip(state, saved[1:], strict=True))
        try:
            n = w.others.numel()
            self._update_range(bi, self.param_groups[g2], small_g, 0, n, i2, i2, first, i2)
        finally:
            b.master, b.state = master, state
        for buf, v in zip(kept, saved, strict=True):
            buf.index_copy_(0, w.others, v)
        for _, i, j in w.minor:
            self._ran(bi, i, j, first)

    def _compact_ok(self, group: dict) -> bool:
        """Whether a group's update may run on gathered values (no per-tensor terms)."""
        return True

    def _ran(self, bi: int, i: int, j: int, first: bool) -> None:
        """Parameters ``i..j-1`` of bucket ``bi`` took one step."""
        if first:
            for k in range(i, j):
                self.buckets[bi].initialized[k] = True
                self._expose_state(bi, k)

    def _run_keys(self, bi: int) -> list[Any]:
        """Per parameter of bucket ``bi``: what must be equal along a run (state age)."""
        return self.buckets[bi].initialized

    def _update_range(
        self,
        bi: int,
        group: dict,
        grad: torch.Tensor,
        start: int,
        end: int,
        i: int,
        j: int,
        first: bool,
        age: int,
    ) -> None:
        """Update parameters ``i..j-1`` of bucket ``bi`` (flat range ``start:end``);
        ``first``: none of them has optimizer state yet; ``age``: a parameter whose
        state age (step count) is the range's."""
        raise NotImplementedError

    @torch.no_grad()
    def sync_master_from_model(self) -> None:
        """Masters follow the model copy wherever it was written without them (a
        ``model.load_state_dict``, a broadcast); a master that still rounds to its model
        tensor is kept, with the precision that the model copy lacks."""
        for b in self.buckets:
            b.refresh_masters(range(len(b.params)))
