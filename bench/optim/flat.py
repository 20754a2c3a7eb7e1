"""Flat-buffer optimizer base: parameters, gradients and state as views into one buffer
(Shi et al.'s "parallel tensor operator", as apex's ``multi_tensor_apply``): one multi-tensor
call per param group and bucket, reading DDP's bucket tensors, copying no gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from bench.optim import layout
from bench.optim.bucket import FlatBucket, Span
from bench.optim.spec import fused_kernels_available, keep_mode_keys
from bench.registry import ConfigError

CPU_FUSED_MIN = 1 << 17  # values: smaller ranges take the vector-op path on CPU


def _uniform(xs: list[Any]) -> bool:  # all equal: a C-level count
    return not xs or xs.count(xs[0]) == len(xs)


class FlatOptimizer(torch.optim.Optimizer):
    """Builds the flat layout; subclasses implement :meth:`_update`.  Its state dict is
    torch's format (per-parameter tensors keyed by index), loadable by torch's optimizers."""

    state_names: tuple[str, ...] = ()
    # False: the portable vector-op path even where torch has fused kernels (tests use it)
    allow_fused = True
    # False: every step takes the general path, run by run (tests of that path use it)
    group_steps = True
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
                key = (p.device, p.dtype, model_dtype if lowp else None)
                ps, gids = keyed.setdefault(key, ([], []))
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

    def fused(self, span: Span) -> bool:
        """Whether to update ``span`` with torch's fused kernel: on CPU only when every entry
        is long (the CPU kernel forks all threads even for a few values)."""
        cpu = span.flat.device.type == "cpu"
        return self.use_fused[span.bucket] and (not cpu or span.smallest >= CPU_FUSED_MIN)

    def _relaid(self, bi: int, perm: list[int]) -> None:
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
        for b in self.buckets:
            b.zero_grad(set_to_none)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = getattr(self, "found_inf", None)  # set by GradScaler
        if found_inf is not None and bool(found_inf.item() > 0):
            return loss
        has = [b.gather_grads() for b in self.buckets]  # which parameters have a gradient
        for b in self.buckets:
            b.prepare(getattr(self, "grad_scale", None))
        for bi, b in enumerate(self.buckets):
            keys = self._run_keys(bi)
            if self.group_steps and b.all_grads and _uniform(keys) and _uniform(b.initialized):
                self._step_groups(bi)
            else:
                self._step_runs(bi, has[bi], keys)
            if b.has_master:
                b.model.copy_(b.master)  # fp32 master -> bf16/fp16 model copy, one pass
        return loss

    def _step_groups(self, bi: int) -> None:
        """The steady state: one update per param group over all its ranges."""
        b = self.buckets[bi]
        first = not b.initialized[0]
        split = CPU_FUSED_MIN if b.device.type == "cpu" and self.use_fused[bi] else 0
        for gi, span in b.group_spans(bi, split):
            span.first, span.age = first, 0
            self._update(self.param_groups[gi], span)
        self._ran(bi, 0, len(b.params), first)

    def _step_runs(self, bi: int, has: list[bool], keys: list[Any]) -> None:
        """The general step: run by run, DDP buckets whole (:func:`layout.schedule`)."""
        b = self.buckets[bi]
        for gi, i, j, whole in layout.schedule(b, b.runs(has, keys), keys):
            if whole is not None:  # one update over a whole DDP bucket, see schedule
                self._whole_segment(bi, gi, i, whole)
            else:
                self._step_run(bi, gi, i, j)

    def _step_run(self, bi: int, gi: int, i: int, j: int) -> None:
        b = self.buckets[bi]
        span = b.span(bi, [(b.offsets[i], b.end(j), i, j)])
        span.first = not b.initialized[i]
        self._update(self.param_groups[gi], span)
        self._ran(bi, i, j, span.first)

    def _whole_segment(self, bi: int, gi: int, age: int, w: layout.Whole) -> None:
        """Update a DDP bucket as if all of it were the major runs ``w.runs``, then put back
        the values outside them and update those (``w.minor``): gathered when they are one
        group of one state age, else run by run.  A few operations instead of one per run."""
        b = self.buckets[bi]
        seg = b.segments[w.segment]
        kept = [b.master, *b.state.values()]
        saved = [buf.index_select(0, w.others) for buf in kept]
        minor = w.minor[0] if w.minor else None
        compact = w.compact and minor is not None and self._compact_ok(self.param_groups[minor[0]])
        whole = b.span(bi, [(seg.start, seg.end, seg.i, seg.j)])
        small_g = whole.grads[0].index_select(0, w.local) if compact else None
        whole.first, whole.age = not b.initialized[age], age
        self._update(self.param_groups[gi], whole)
        if not compact:
            for buf, v in zip(kept, saved, strict=True):
                buf.index_copy_(0, w.others, v)
        for _, i, j in w.runs:
            self._ran(bi, i, j, whole.first)
        if minor is None:
            return
        if not compact:
            for g2, i, j in w.minor:
                self._step_run(bi, g2, i, j)
            return
        # one update of the gathered values (no whole layers), then scattered back in place
        g2, i2 = minor[0], minor[1]
        state = {name: [v] for name, v in zip(b.state, saved[1:], strict=True)}
        gathered = Span(bi, b, [saved[0]], [small_g], state, [(0, w.others.numel())], None)
        gathered.first, gathered.age = not b.initialized[i2], i2
        self._update(self.param_groups[g2], gathered)
        for buf, v in zip(kept, saved, strict=True):
            buf.index_copy_(0, w.others, v)
        for _, i, j in w.minor:
            self._ran(bi, i, j, gathered.first)

    def _compact_ok(self, group: dict) -> bool:
        """Whether a group's update may run on gathered values (no per-tensor terms)."""
        return True

    def _ran(self, bi: int, i: int, j: int, first: bool) -> None:
        if first:
            b = self.buckets[bi]
            b.initialized[i:j] = [True] * (j - i)
            for k in range(i, j):
                self._expose_state(bi, k)

    def _run_keys(self, bi: int) -> list[Any]:
        """Per parameter of bucket ``bi``: what must be equal along a run (state age)."""
        return self.buckets[bi].initialized

    def _update(self, group: dict, span: Span) -> None:
        raise NotImplementedError

    def _expose_state(self, bi: int, k: int) -> None:
        """Per-parameter views of the flat state, as torch.optim keeps ``self.state``."""
        b = self.buckets[bi]
        st: dict[str, Any] = {name: b.view(buf, k) for name, buf in b.state.items()}
        st.update(self._extra_state(bi, k))
        if b.has_master:
            st["master_param"] = b.view(b.master, k)
        if st:
            self.state[b.params[k]] = st

    def _extra_state(self, bi: int, k: int) -> dict[str, Any]:
        return {}

    def _reset_state(self) -> None:
        self.state.clear()
        for b in self.buckets:
            b.initialized = [False] * len(b.params)
            for buf in b.state.values():
                buf.zero_()

    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        # a torch optimizer increments each "step" tensor separately: never share them
        for st in sd["state"].values():
            if isinstance(st.get("step"), torch.Tensor):
                st["step"] = st["step"].clone()
        return sd

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # a master_param that another update mode carried through is stale: only a flat
        # optimizer keeps it in step with the weights
        saved_by_flat = all(g.get("flat") for g in state_dict["param_groups"])
        sd = keep_mode_keys(self, state_dict)
        if len(sd["param_groups"]) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        index: dict[int, torch.nn.Parameter] = {}  # saved parameter index -> parameter
        for own, saved in zip(self.param_groups, sd["param_groups"], strict=True):
            if len(own["params"]) != len(saved["params"]):
                raise ValueError(
                    "loaded state dict contains a parameter group that doesn't match the size "
                    "of optimizer's group"
                )
            index.update(zip(saved["params"], own["params"], strict=True))
            own.update({k: v for k, v in saved.items() if k != "params"})  # hyper-parameters
        where = {
            id(p): (bi, k) for bi, b in enumerate(self.buckets) for k, p in enumerate(b.params)
        }
        self._reset_state()
        for idx, st in sd["state"].items():
            bi, k = where[id(index[idx])]
            b = self.buckets[bi]
            for name, buf in b.state.items():
                v = st.get(name)
                if v is not None:
                    b.view(buf, k).copy_(v)
            if b.has_master:
                b.load_master(k, st.get("master_param") if saved_by_flat else None)
            self._load_extra_state(bi, k, st)
            b.initialized[k] = True
            self._expose_state(bi, k)
        self.sync_master_from_model()  # every other master follows the model

    def _load_extra_state(self, bi: int, k: int, st: dict[str, Any]) -> None:
        pass

    @torch.no_grad()
    def sync_master_from_model(self) -> None:
        """Masters follow the model copy where it was written without them (a load)."""
        for b in self.buckets:
            b.refresh_masters(range(len(b.params)))


@torch.no_grad()
def after_ddp_broadcast(optimizer: torch.optim.Optimizer, process_group: Any = None) -> None:
    """Call on every rank right after ``DistributedDataParallel(model, ...)`` is built: every
    rank takes the masters and model copy of the group's first rank (a collective)."""
    if not isinstance(optimizer, FlatOptimizer):
        return
    optimizer.sync_master_from_model()
    ready = dist.is_available() and dist.is_initialized()
    if not ready or dist.get_world_size(process_group) < 2:
        return
    src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
    for b in optimizer.buckets:
        if b.has_master:
            dist.broadcast(b.master, src=src, group=process_group)
            b.model.copy_(b.master)
            b.record_versions()
