"""Flat-buffer optimizer base: parameters, gradients and state as views into one buffer.

A faster optimizer update over the hundreds of small tensors of a CNN (the "parallel
tensor operator" of Shi et al., MLSys 2021, section 4; see docs/algorithms.md).  The
known way to do that is the one of apex's ``FusedSGD``/``multi_tensor_apply`` and of
Megatron/DeepSpeed's contiguous gradient buffers: lay every parameter, its gradient and
its optimizer state out as views into ONE contiguous buffer per (device, dtype), so that
the update is a handful of vectorized operations over a single buffer instead of a
kernel chain per tensor.

Layout (one :class:`FlatBucket` per (device, model dtype)):

* ``model``  flat tensor in the model's dtype; every ``p.data`` is a view into it;
* ``master`` fp32 flat copy when a low-precision (bf16/fp16) model copy is kept (for
  parameters of 2 or more dimensions; norm parameters and biases stay fp32, as apex's
  ``keep_batchnorm_fp32``), else the same tensor as ``model``; the update runs on it and
  is copied back to ``model``;
* ``grad``   flat tensor in the model's dtype; once a parameter has a gradient, ``p.grad``
  is its view into this buffer, so autograd accumulates into it in place and DDP
  (``gradient_as_bucket_view=False``) copies its all-reduced bucket back into it;
* ``state[name]`` one flat fp32 buffer per state name (momentum, exp_avg ...);
* parameters are ordered by param group, so every group is one contiguous range.

Parameters without a gradient, as torch: a parameter has a gradient in a step when its
``p.grad`` is not None when :meth:`FlatOptimizer.step` runs; the others are skipped (no
weight decay, no momentum, no Adam step) and have no optimizer state until their first
gradient.  ``zero_grad(set_to_none=True)`` sets every ``p.grad`` to None (autograd then
allocates fresh gradients, which the next step copies into the buffer, counted in
``FlatBucket.copies``); ``set_to_none=False`` zeroes the buffer and keeps None as None.
A new optimizer leaves ``p.grad`` None (the first step copies), so a layer that is never
used is never touched, with either ``zero_grad``.  The update runs over maximal runs of
neighbouring parameters that have a gradient and the same state age: one run per param
group in the usual step where every parameter has one.

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

from bench.registry import ConfigError

# Group keys that say HOW the update is computed, not what it computes: when a state
# dict moves between update modes these keep the values of the optimizer loading it.
MODE_KEYS = ("foreach", "fused", "flat", "differentiable", "capturable")


def keep_mode_keys(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``state_dict`` whose param groups keep ``optimizer``'s own mode keys."""
    groups = []
    for saved, own in zip(state_dict["param_groups"], optimizer.param_groups, strict=False):
        g = {k: v for k, v in saved.items() if k not in MODE_KEYS}
        g.update({k: own[k] for k in MODE_KEYS if k in own})
        groups.append(g)
    groups += state_dict["param_groups"][len(groups) :]  # length mismatch: torch reports it
    return {"state": state_dict["state"], "param_groups": groups}


def fused_kernels_available(device: torch.device) -> bool:
    """Whether torch ships ``_fused_sgd_``/``_fused_adamw_`` kernels for this device type."""
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        return device.type in _get_fused_kernels_supported_devices()
    except ImportError:  # older torch: CUDA only
        return device.type == "cuda"


def _dense_view(flat: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """A view of ``flat[offset : offset + like.numel()]`` with ``like``'s shape and strides."""
    return flat.as_strided(like.size(), like.stride(), flat.storage_offset() + offset)


def _is_dense(p: torch.Tensor) -> bool:
    if p.is_contiguous():
        return True
    if p.ndim == 4 and p.is_contiguous(memory_format=torch.channels_last):
        return True
    return p.ndim == 5 and p.is_contiguous(memory_format=torch.channels_last_3d)


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
        # contiguous ranges per param group: [(group index, start, end, first, last param)]
        self.ranges: list[tuple[int, int, int, int, int]] = []
        i = 0
        while i < len(params):
            j = i
            while j < len(params) and group_ids[j] == group_ids[i]:
                j += 1
            self.ranges.append((group_ids[i], self.offsets[i], self.end(j), i, j))
            i = j
        self.copies = 0  # gradients that had to be copied into the buffer (not views)

    @property
    def has_master(self) -> bool:
        """Whether the update runs on fp32 masters of a low-precision model copy."""
        return self.master is not self.model

    def end(self, j: int) -> int:
        """Offset just past parameter ``j - 1``."""
        return self.offsets[j - 1] + self.numels[j - 1]

    def buffer(self, name: str) -> torch.Tensor:
        """A scratch buffer of the master dtype, allocated on first use and kept."""
        if name not in self.scratch:
            self.scratch[name] = torch.empty_like(self.master)
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
        """Point every gradient at its view of the flat buffer; which parameters have one.

        A gradient that is not the view (autograd's after ``set_to_none``, DDP's with
        ``gradient_as_bucket_view=True``) is copied in (counted); a parameter whose
        ``p.grad`` is None keeps it None and its view is zeroed (it is skipped).
        """
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
            pg = p.grad
            has.append(pg is not None)
            if pg is g:
                continue
            if pg is None:
                g.zero_()
            else:
                g.copy_(pg)
                self.copies += 1
                p.grad = g
        if moved:
            self.refresh_masters(moved)
        return has

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


class FlatOptimizer(torch.optim.Optimizer):
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

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "buckets", None) is not None:
            raise RuntimeError("a flat optimizer cannot take new param groups after construction")
        super().add_param_group(param_group)

    @torch.no_grad()
    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch: ``set_to_none`` drops every gradient; otherwise the existing ones are
        zeroed (one memset of the flat buffer; they become its views) and None stays None."""
        for b in self.buckets:
            if set_to_none:
                for p in b.params:
                    p.grad = None
                continue
            b.grad.zero_()
            for p, g in zip(b.params, b.grad_views, strict=True):
                if p.grad is not None and p.grad is not g:
                    p.grad = g

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
            if b.grad32 is not None:
                b.grad32.copy_(b.grad)  # upcast bf16/fp16 -> fp32, one pass
            if grad_scale is not None:
                (b.grad32 if b.grad32 is not None else b.grad).div_(grad_scale.to(b.device))
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
            grad = b.grad32 if b.grad32 is not None else b.grad
            for gi, i, j in b.runs(has[bi], self._run_keys(bi)):
                start, end = b.offsets[i], b.end(j)
                first = not b.initialized[i]
                group = self.param_groups[gi]
                self._update_range(bi, group, grad[start:end], start, end, i, j, first)
                if first:
                    for k in range(i, j):
                        b.initialized[k] = True
                        self._expose_state(bi, k)
            if b.has_master:
                b.model.copy_(b.master)  # fp32 master -> bf16/fp16 model copy, one pass
        return loss

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
    ) -> None:
        """Update parameters ``i..j-1`` of bucket ``bi`` (flat range ``start:end``);
        ``first``: none of them has optimizer state yet."""
        raise NotImplementedError

    # ---- checkpoints in the standard torch format ----------------------------------
    def _expose_state(self, bi: int, k: int) -> None:
        """Per-parameter views of the flat state, as torch.optim keeps them in ``self.state``."""
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
        """No optimizer state at all, as a new optimizer (before loading a checkpoint)."""
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
        index = self._match_groups(sd)
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

    def _match_groups(self, sd: dict[str, Any]) -> dict[int, torch.nn.Parameter]:
        """Take the saved groups' hyper-parameters; saved parameter index -> parameter."""
        if len(sd["param_groups"]) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        index: dict[int, torch.nn.Parameter] = {}
        for own, saved in zip(self.param_groups, sd["param_groups"], strict=True):
            if len(own["params"]) != len(saved["params"]):
                raise ValueError(
                    "loaded state dict contains a parameter group that doesn't match the size "
                    "of optimizer's group"
                )
            index.update(zip(saved["params"], own["params"], strict=True))
            own.update({k: v for k, v in saved.items() if k != "params"})
        return index

    def _load_extra_state(self, bi: int, k: int, st: dict[str, Any]) -> None:
        pass

    @torch.no_grad()
    def sync_master_from_model(self) -> None:
        """Masters follow the model copy wherever it was written without them (a
        ``model.load_state_dict``, a broadcast); a master that still rounds to its model
        tensor is kept, with the precision that the model copy lacks."""
        for b in self.buckets:
            b.refresh_masters(range(len(b.params)))

    @torch.no_grad()
    def broadcast_masters(self, src: int = 0, group: Any = None) -> None:
        """Every rank takes rank ``src``'s masters and model copy (a collective: call it
        on every rank of ``group``)."""
        import torch.distributed as dist

        self.sync_master_from_model()
        for b in self.buckets:
            if b.has_master:
                dist.broadcast(b.master, src=src, group=group)
                b.model.copy_(b.master)
                b.record_versions()


def after_ddp_broadcast(optimizer: torch.optim.Optimizer, process_group: Any = None) -> None:
    """Call on every rank right after ``DistributedDataParallel(model, ...)`` is built.

    DDP broadcasts rank 0's parameters into the model only: the fp32 masters of a flat
    optimizer stay as each rank built them.  This gives every rank the masters of rank 0
    of ``process_group`` (the group DDP was given; None: the default group), or, without
    an initialized multi-process group, re-derives stale masters from the model.  A
    no-op for optimizers without master weights.
    """
    import torch.distributed as dist

    if not isinstance(optimizer, FlatOptimizer):
        return
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(process_group) > 1:
        src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
        optimizer.broadcast_masters(src, process_group)
    else:
        optimizer.sync_master_from_model()
