"""SGD with momentum, Nesterov and weight decay: ``torch.optim.SGD`` in the ``naive``,
``foreach`` and ``fused`` modes, :class:`FlatSGD` (the same arithmetic) over the flat buffers.
"""

from __future__ import annotations

from typing import Any

import torch

from bench.optim.bucket import Span
from bench.optim.config import OptimConfig
from bench.optim.flat import FlatOptimizer
from bench.optim.spec import OptimizerSpec, check_nesterov, keep_mode_keys, register


class SGD(torch.optim.SGD):
    """``torch.optim.SGD`` whose ``load_state_dict`` keeps its own update mode."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(keep_mode_keys(self, state_dict))


def sgd_update(span: Span, grads: list[torch.Tensor], group: dict, wd: float, fused: bool) -> None:
    """One SGD step of ``span``'s values with ``grads`` (``span.grads``, or LARS's scaled
    ones), ``group``'s hyper-parameters and weight decay ``wd``: one multi-tensor call per
    operation."""
    p, lr, momentum = span.params, group["lr"], group["momentum"]
    dampening, nesterov = group["dampening"], group["nesterov"]
    bufs = span.state["momentum_buffer"] if momentum != 0 else None
    if fused:
        hyper = dict(
            lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov, maximize=False
        )
        torch._fused_sgd_(p, grads, bufs or [], weight_decay=wd, is_first_step=span.first, **hyper)
        return
    # portable path: in-place ops on the span's scratch, never on the user's gradients
    d = span.scratch("d")
    torch._foreach_copy_(d, grads)
    if wd:
        torch._foreach_add_(d, p, alpha=wd)
    if bufs is not None:
        if span.first:
            torch._foreach_copy_(bufs, d)
        else:
            torch._foreach_mul_(bufs, momentum)
            torch._foreach_add_(bufs, d, alpha=1.0 - dampening)
        if nesterov:
            torch._foreach_add_(d, bufs, alpha=momentum)
        else:
            d = bufs
    torch._foreach_add_(p, d, alpha=-lr)


class FlatSGD(FlatOptimizer):
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
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay)
        # torch's group keys too: a state dict loads into torch's SGD and back
        flags = dict(nesterov=nesterov, maximize=False, foreach=None, differentiable=False)
        super().__init__(params, {**defaults, **flags, "fused": None}, model_dtype)

    def _update(self, group: dict, span: Span) -> None:
        if group["momentum"] != 0 and "momentum_buffer" not in span.state:
            raise RuntimeError("momentum was switched on after a flat SGD was built without it")
        sgd_update(span, span.grads, group, group["weight_decay"], self.fused(span))


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
