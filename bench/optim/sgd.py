"""SGD with momentum / Nesterov / weight decay in the four update modes.

``naive``, ``foreach`` and ``fused`` are ``torch.optim.SGD`` (a per-tensor loop,
multi-tensor ``_foreach_*`` ops, and the fused per-tensor kernels).  ``flat`` is
:class:`FlatSGD`: the same arithmetic as ``torch.optim.SGD`` (PyTorch convention, lr
applied after the momentum buffer)::

    d = g + wd * p;  buf = d (first step) or m * buf + (1 - dampening) * d
    d = d + m * buf (nesterov) or buf;  p -= lr * d

computed once per param group over ONE contiguous range of the flat buffer: with torch's
fused SGD kernel (one pass over p, g, buf: the memory-traffic minimum) where the device
has it, else with four in-place vector operations over the range.
"""

from __future__ import annotations

from typing import Any

import torch

from bench.optim.config import OptimConfig
from bench.optim.flat import FlatBucket, FlatOptimizer, keep_mode_keys
from bench.optim.spec import OptimizerSpec, check_nesterov, register


class SGD(torch.optim.SGD):
    """``torch.optim.SGD`` whose ``load_state_dict`` keeps its own update mode."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(keep_mode_keys(self, state_dict))


def sgd_range(
    b: FlatBucket,
    p: torch.Tensor,
    g: torch.Tensor,
    buf: torch.Tensor | None,
    *,
    lr: float,
    momentum: float,
    dampening: float,
    weight_decay: float,
    nesterov: bool,
    first: bool,
    use_fused: bool,
    scratch_slice: slice,
) -> None:
    """One SGD update of the flat ranges ``p`` (master), ``g``, ``buf`` (same length)."""
    if use_fused:
        torch._fused_sgd_(
            [p],
            [g],
            [] if buf is None else [buf],
            weight_decay=weight_decay,
            momentum=momentum,
            lr=lr,
            dampening=dampening,
            nesterov=nesterov,
            maximize=False,
            is_first_step=first,
        )
        return
    # portable path: in-place ops on one scratch range, never on the user's gradients
    d = b.buffer("d")[scratch_slice]
    if weight_decay:
        torch.add(g, p, alpha=weight_decay, out=d)
    else:
        d.copy_(g)
    if buf is not None:
        if first:
            buf.copy_(d)
        else:
            buf.mul_(momentum).add_(d, alpha=1.0 - dampening)
        if nesterov:
            d.add_(buf, alpha=momentum)
        else:
            d = buf
    p.add_(d, alpha=-lr)


class FlatSGD(FlatOptimizer):
    """SGD over flat buffers (``optim.update=flat``); see the module docstring."""

    def __init__(
        self,
        params: Any,
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        model_dtype: torch.dtype | None = None,
    ) -> None:
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        self.state_names = ("momentum_buffer",) if momentum != 0 else ()
        defaults = dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            maximize=False,
            foreach=None,
            differentiable=False,
            fused=None,
        )
        super().__init__(params, defaults, model_dtype)

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
        b = self.buckets[bi]
        if group["momentum"] != 0 and "momentum_buffer" not in b.state:
            raise RuntimeError("momentum was switched on after a flat SGD was built without it")
        buf = b.state["momentum_buffer"][start:end] if group["momentum"] != 0 else None
        sgd_range(
            b,
            b.master[start:end],
            grad,
            buf,
            lr=group["lr"],
            momentum=group["momentum"],
            dampening=group["dampening"],
            weight_decay=group["weight_decay"],
            nesterov=group["nesterov"],
            first=first,
            use_fused=self.fused(bi, end - start),
            scratch_slice=slice(start, end),
        )


def _sgd_kwargs(cfg: OptimConfig) -> dict[str, Any]:
    return dict(lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)


register(
    OptimizerSpec(
        name="sgd",
        build_torch=lambda groups, cfg, mode: SGD(groups, **_sgd_kwargs(cfg), **mode),
        build_flat=lambda groups, cfg, low: FlatSGD(groups, model_dtype=low, **_sgd_kwargs(cfg)),
        validate=check_nesterov,
    )
)
