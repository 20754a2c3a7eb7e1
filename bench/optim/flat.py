"""Flat-buffer optimizer base: parameters, gradients and state as views into one buffer.

The paper's "parallel tensor operator" (Shi et al., MLSys 2021, section 4) speeds up the
update over the hundreds of small tensors of a CNN.  The known way to do that is the one
of apex's ``FusedSGD``/``multi_tensor_apply`` and of Megatron/DeepSpeed's contiguous
gradient buffers: lay every parameter, its gradient and its optimizer state out as views
into ONE contiguous buffer per (device, dtype), so that the update is a handful of
vectorized operations over a single buffer instead of a kernel chain per tensor.

Layout (one :class:`FlatBucket` per (device, model dtype)):

* ``model``  flat tensor in the model's dtype; every ``p.data`` is a view into it;
* ``master`` fp32 flat copy when a low-precision (bf16/fp16) model copy is kept (for
  parameters of 2 or more dimensions; norm parameters and biases stay fp32, as apex's
  ``keep_batchnorm_fp32``), else the same tensor as ``model``; the update runs on it and
  is copied back to ``model``;
* ``grad``   flat tensor in the model's dtype; every ``p.grad`` is a view into it, so
  autograd accumulates into it in place and DDP (``gradient_as_bucket_view=False``)
  copies its all-reduced bucket back into it;
* ``state[name]`` one flat fp32 buffer per state name (momentum, exp_avg ...);
* parameters are ordered by param group, so every group is one contiguous range.

``zero_grad`` zeroes the flat gradient buffer (one memset) instead of dropping the
views, whatever ``set_to_none`` says.  ``state_dict``/``load_state_dict`` use the standard
torch format (per-parameter tensors keyed by index), so a state saved in ``flat`` mode
loads in ``naive``/``foreach``/``fused`` mode and vice versa.
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
    groups += state_dict["param_groups"][len(groups):]  # length mismatch: torch reports it
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
        total = sum(self.numels)
        self.numel = total

        master = torch.empty(total, dtype=self.master_dtype, device=self.device)
        for p, off in zip(params, self.offsets, strict=False):
            if not _is_dense(p):
                raise ConfigError("optim.update=flat needs dense (contiguous or channels_last) parameters")
            _dense_view(master, off, p).copy_(p.detach())
        if self.master_dtype != self.dtype:
            self.model = master.to(self.dtype)
            self.master = master
        else:
            self.model = self.master = master
        self.grad = torch.zeros(total, dtype=self.dtype, device=self.device)
        # the update reads fp32 gradients: an upcast copy when the model copy is bf16/fp16
        self.grad32 = torch.empty_like(master) if self.master is not self.model else None
        self.state = {name: torch.zeros_like(master) for name in state_names}
        self.scratch: dict[str, torch.Tensor] = {}  # allocated once on first use

        self.grad_views = []
        with torch.no_grad():
            for p, off in zip(params, self.offsets, strict=False):
                p.data = _dense_view(self.model, off, p)  # same Parameter object, new storage
                g = _dense_view(self.grad, off, p)
                p.grad = g
                self.grad_views.append(g)
        self.model_ptrs = [p.data_ptr() for p in params]

        # contiguous ranges per param group: [(group index, start, end, first, last param)]
        self.ranges: list[tuple[int, int, int, int, int]] = []
        i = 0
        while i < len(params):
            j = i
            while j < len(params) and group_ids[j] == group_ids[i]:
                j += 1
            end = self.offsets[j - 1] + self.numels[j - 1]
            self.ranges.append((group_ids[i], self.offsets[i], end, i, j))
            i = j
        self.copies = 0  # gradients that had to be copied into the buffer (not views)

    def buffer(self, name: str) -> torch.Tensor:
        """A scratch buffer of the master dtype, allocated on first use and kept."""
        if name not in self.scratch:
            self.scratch[name] = torch.empty_like(self.master)
        return self.scratch[name]

    def small_buffer(self, name: str, numel: int) -> torch.Tensor:
        """A scratch buffer of at least ``numel`` values of the master dtype, kept."""
        buf = self.scratch.get(name)
        if buf is None or buf.numel() < numel:
            buf = self.scratch[name] = torch.empty(numel, dtype=self.master_dtype, device=self.device)
        return buf

    def view(self, flat: torch.Tensor, i: int) -> torch.Tensor:
        """Parameter ``i``'s view into a flat buffer (state, master ...)."""
        return _dense_view(flat, self.offsets[i], self.params[i])

    def gather_grads(self) -> None:
        """Make sure every ``p.grad`` is (or is copied into) its view of the flat grad buffer."""
        for k, (p, g) in enumerate(zip(self.params, self.grad_views, strict=False)):
            if p.data_ptr() != self.model_ptrs[k]:
                raise RuntimeError(
                    "a parameter was moved or replaced after its flat optimizer was built; "
                    "build the optimizer after model.to(device)"
                )
            pg = p.grad
            if pg is g:
                continue
            # someone replaced the view (set_to_none, DDP gradient_as_bucket_view=True):
            # copy it in (counted) and point p.grad back at the buffer
            if pg is None:
                g.zero_()
            else:
                g.copy_(pg)
                self.copies += 1
            p.grad = g


class FlatOptimizer(torch.optim.Optimizer):
    """Base class: builds the flat layout; subclasses implement :meth:`_update_range`."""

    state_names: tuple[str, ...] = ()
    # GradScaler passes grad_scale/found_inf attributes instead of unscaling fp16 grads itself
    _step_supports_amp_scaling = True

    def __init__(self, params: Any, defaults: dict[str, Any], model_dtype: torch.dtype | None = None) -> None:
        super().__init__(params, defaults)
        keyed: dict[tuple[torch.device, torch.dtype, torch.dtype | None], tuple[list, list]] = {}
        seen: set[int] = set()
        for gi, group in enumerate(self.param_groups):
            group["flat"] = True
            for p in group["params"]:
                if id(p) in seen:
                    raise ConfigError("a parameter appears in two optimizer param groups")
                seen.add(id(p))
                # low-precision model copy for weight matrices/filters only: 1-D parameters
                # (norm affine, biases) stay fp32, as apex's keep_batchnorm_fp32
                low = model_dtype if model_dtype is not None and p.ndim >= 2 and p.dtype == torch.float32 else None
                ps, gids = keyed.setdefault((p.device, p.dtype, low), ([], []))
                ps.append(p)
                gids.append(gi)
        self.buckets = [FlatBucket(ps, gids, self.state_names, key[2]) for key, (ps, gids) in keyed.items()]
        self._initialized: dict[tuple[int, int], bool] = {}  # (bucket, group) -> state exists

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "buckets", None) is not None:
            raise RuntimeError("a flat optimizer cannot take new param groups after construction")
        super().add_param_group(param_group)

    @torch.no_grad()
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the flat gradient buffers; ``p.grad`` stay views (``set_to_none`` is ignored)."""
        for b in self.buckets:
            b.grad.zero_()
            for p, g in zip(b.params, b.grad_views, strict=False):
                if p.grad is not g:
                    p.grad = g

    def _prepare(self) -> bool:
        """Gather grads, handle GradScaler's scale; False when the step must be skipped."""
        found_inf = getattr(self, "found_inf", None)
        if found_inf is not None and bool(found_inf.item() > 0):
            return False
        grad_scale = getattr(self, "grad_scale", None)
        for b in self.buckets:
            b.gather_grads()
            if b.grad32 is not None:
                b.grad32.copy_(b.grad)  # upcast bf16/fp16 -> fp32, one pass
            if grad_scale is not None:
                (b.grad32 if b.grad32 is not None else b.grad).div_(grad_scale.to(b.device))
        return True

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._prepare():
            return loss
        for bi, b in enumerate(self.buckets):
            grad = b.grad32 if b.grad32 is not None else b.grad
            for gi, start, end, i, j in b.ranges:
                first = not self._initialized.get((bi, gi), False)
                self._update_range(b, self.param_groups[gi], grad[start:end], start, end, i, j, first)
                if first:
                    self._initialized[(bi, gi)] = True
                    self._expose_state(b, i, j)
            if b.master is not b.model:
                b.model.copy_(b.master)  # fp32 master -> bf16/fp16 model copy, one pass
        return loss

    def _update_range(
        self, b: FlatBucket, group: dict, grad: torch.Tensor, start: int, end: int, i: int, j: int, first: bool
    ) -> None:
        raise NotImplementedError

    # ---- checkpoints in the standard torch format ----------------------------------
    def _expose_state(self, b: FlatBucket, i: int, j: int) -> None:
        """Per-parameter views of the flat state, as torch.optim keeps them in ``self.state``."""
        for k in range(i, j):
            p = b.params[k]
            st = {name: b.view(buf, k) for name, buf in b.state.items()}
            st.update(self._extra_state(b, p))
            if b.master is not b.model:
                st["master_param"] = b.view(b.master, k)
            self.state[p] = st

    def _extra_state(self, b: FlatBucket, p: torch.nn.Parameter) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        # a torch optimizer increments each "step" tensor separately: never share them
        for st in sd["state"].values():
            if isinstance(st.get("step"), torch.Tensor):
                st["step"] = st["step"].clone()
        return sd

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        sd = keep_mode_keys(self, state_dict)
        if len(sd["param_groups"]) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        index: dict[int, tuple[dict, torch.nn.Parameter]] = {}
        for own, saved in zip(self.param_groups, sd["param_groups"], strict=False):
            if len(own["params"]) != len(saved["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't match the size of optimizer's group")
            for idx, p in zip(saved["params"], own["params"], strict=False):
                index[idx] = (saved, p)
            own.update({k: v for k, v in saved.items() if k != "params"})
        where = {id(p): (bi, k) for bi, b in enumerate(self.buckets) for k, p in enumerate(b.params)}
        loaded_ranges: set[tuple[int, int, int, int]] = set()
        for idx, st in sd["state"].items():
            _, p = index[idx]
            bi, k = where[id(p)]
            b = self.buckets[bi]
            for name, buf in b.state.items():
                v = st.get(name)
                if v is not None:
                    b.view(buf, k).copy_(v)
            if b.master is not b.model:
                # no saved master (a state from an fp32 run): start from the model copy
                src = st.get("master_param", b.view(b.model, k))
                b.view(b.master, k).copy_(src)
                b.view(b.model, k).copy_(src)
            self._load_extra_state(b, k, st)
            for gi, _start, _end, i, j in b.ranges:
                if i <= k < j:
                    loaded_ranges.add((bi, gi, i, j))
        for bi, gi, i, j in loaded_ranges:
            self._initialized[(bi, gi)] = True
            self._expose_state(self.buckets[bi], i, j)

    def _load_extra_state(self, b: FlatBucket, k: int, st: dict[str, Any]) -> None:
        pass

    @torch.no_grad()
    def sync_master_from_model(self) -> None:
        """After ``model.load_state_dict`` without optimizer state: master := model copy."""
        for b in self.buckets:
            if b.master is not b.model:
                b.master.copy_(b.model)
