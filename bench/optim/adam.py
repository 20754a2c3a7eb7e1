"""Adam and AdamW in the four update modes (``naive``/``foreach``/``fused`` are torch's).

:class:`FlatAdam` computes exactly ``torch.optim.Adam``/``AdamW`` (Kingma and Ba 2015;
decoupled weight decay of Loshchilov and Hutter 2019), no amsgrad::

    AdamW: p *= 1 - lr * wd            Adam: g = g + wd * p
    m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g * g
    p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

once per param group over one contiguous range of the flat buffer: torch's fused Adam(W)
kernel where the device has one, else in-place vector ops with one scratch buffer.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from bench.optim.config import OptimConfig
from bench.optim.flat import FlatOptimizer, keep_mode_keys
from bench.optim.spec import OptimizerSpec, check_betas, register


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` whose ``load_state_dict`` keeps its own update mode."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(keep_mode_keys(self, state_dict))


class AdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` whose ``load_state_dict`` keeps its own update mode."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(keep_mode_keys(self, state_dict))


class FlatAdam(FlatOptimizer):
    """Adam (``decoupled=False``) or AdamW (``decoupled=True``) over flat buffers.

    Step counts are per parameter, as torch's (a parameter without a gradient does not
    count a step): one float32 CPU tensor per bucket, whose elements are the ``step``
    tensors of the checkpoint; a run of parameters with equal counts is one update.
    """

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        decoupled: bool = True,
        model_dtype: torch.dtype | None = None,
    ) -> None:
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=False,
            maximize=False,
            foreach=None,
            capturable=False,
            differentiable=False,
            fused=None,
            decoupled_weight_decay=decoupled,
        )
        super().__init__(params, defaults, model_dtype)
        self.decoupled = decoupled
        self._counts = [torch.zeros(len(b.params), dtype=torch.float32) for b in self.buckets]
        # the fused kernels read the step from a float32 tensor on the parameters' device
        self._step_dev = [
            torch.zeros((), dtype=torch.float32, device=b.device) for b in self.buckets
        ]

    def _run_keys(self, bi: int) -> list[Any]:
        return self._counts[bi].tolist()

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
        p = b.master[start:end]
        m, v = b.state["exp_avg"][start:end], b.state["exp_avg_sq"][start:end]
        t = float(self._counts[bi][age]) + 1  # counted in _ran
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if self.fused(bi, end - start):
            step = self._step_dev[bi].fill_(t)
            fn = torch._fused_adamw_ if self.decoupled else torch._fused_adam_
            fn(
                [p],
                [grad],
                [m],
                [v],
                [],
                [step],
                amsgrad=False,
                lr=lr,
                beta1=b1,
                beta2=b2,
                weight_decay=wd,
                eps=eps,
                maximize=False,
            )
            return
        s = b.buffer("s")[start:end]
        g = grad
        if wd:
            if self.decoupled:
                p.mul_(1.0 - lr * wd)
            else:
                g = torch.add(grad, p, alpha=wd, out=s)
        m.lerp_(g, 1.0 - b1)
        v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
        denom = torch.sqrt(v, out=s).div_(math.sqrt(1.0 - b2**t)).add_(eps)
        p.addcdiv_(m, denom, value=-lr / (1.0 - b1**t))

    def _ran(self, bi: int, i: int, j: int, first: bool) -> None:
        self._counts[bi][i:j] += 1
        super()._ran(bi, i, j, first)

    def _permute_extra(self, bi: int, perm: list[int]) -> None:
        self._counts[bi] = self._counts[bi][perm].clone()

    def _extra_state(self, bi: int, k: int) -> dict[str, Any]:
        return {"step": self._counts[bi][k]}  # a view: the live count

    def _reset_state(self) -> None:
        super()._reset_state()
        for c in self._counts:
            c.zero_()

    def _load_extra_state(self, bi: int, k: int, st: dict[str, Any]) -> None:
        if "step" in st:
            self._counts[bi][k] = float(st["step"])


def _adam_kwargs(cfg: OptimConfig) -> dict[str, Any]:
    return dict(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)


def _adam_spec(name: str, decoupled: bool) -> OptimizerSpec:
    torch_cls = AdamW if decoupled else Adam
    return OptimizerSpec(
        name=name,
        build_torch=lambda groups, cfg, mode: torch_cls(groups, **_adam_kwargs(cfg), **mode),
        build_flat=lambda groups, cfg, low: FlatAdam(
            groups, decoupled=decoupled, model_dtype=low, **_adam_kwargs(cfg)
        ),
        validate=check_betas,
    )


register(_adam_spec("adam", decoupled=False))
register(_adam_spec("adamw", decoupled=True))
