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

from bench.optim.flat import FlatBucket, FlatOptimizer, fused_kernels_available, keep_mode_keys


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` whose ``load_state_dict`` keeps its own update mode."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(keep_mode_keys(self, state_dict))


class AdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` whose ``load_state_dict`` keeps its own update mode."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(keep_mode_keys(self, state_dict))


class FlatAdam(FlatOptimizer):
    """Adam (``decoupled=False``) or AdamW (``decoupled=True``) over flat buffers."""

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
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=False,
            maximize=False, foreach=None, capturable=False, differentiable=False, fused=None,
            decoupled_weight_decay=decoupled,
        )
        super().__init__(params, defaults, model_dtype)
        self.decoupled = decoupled
        self.use_fused = [fused_kernels_available(b.device) for b in self.buckets]
        # step count per (bucket, range start): float32 tensor on the device, as fused torch
        self._steps: dict[tuple[int, int], torch.Tensor] = {}

    def _step_tensor(self, bi: int, i: int) -> torch.Tensor:
        key = (bi, i)
        if key not in self._steps:
            self._steps[key] = torch.zeros((), dtype=torch.float32, device=self.buckets[bi].device)
        return self._steps[key]

    def _update_range(
        self, b: FlatBucket, group: dict, grad: torch.Tensor, start: int, end: int, i: int, j: int, first: bool
    ) -> None:
        bi = self.buckets.index(b)
        p = b.master[start:end]
        m, v = b.state["exp_avg"][start:end], b.state["exp_avg_sq"][start:end]
        step = self._step_tensor(bi, i)
        step += 1
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if self.use_fused[bi]:
            fn = torch._fused_adamw_ if self.decoupled else torch._fused_adam_
            fn([p], [grad], [m], [v], [], [step], amsgrad=False, lr=lr, beta1=b1, beta2=b2,
               weight_decay=wd, eps=eps, maximize=False)
            return
        t = float(step.item())
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

    def _extra_state(self, b: FlatBucket, p: torch.nn.Parameter) -> dict[str, Any]:
        bi = self.buckets.index(b)
        k = next(k for k, q in enumerate(b.params) if q is p)
        start = next(i for _, _, _, i, j in b.ranges if i <= k < j)
        return {"step": self._step_tensor(bi, start)}

    def _load_extra_state(self, b: FlatBucket, k: int, st: dict[str, Any]) -> None:
        if "step" in st:
            bi = self.buckets.index(b)
            start = next(i for _, _, _, i, j in b.ranges if i <= k < j)
            self._step_tensor(bi, start).fill_(float(st["step"]))
