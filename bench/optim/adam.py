"""Adam and AdamW (Kingma and Ba 2015; Loshchilov and Hutter 2019): torch's in the
``naive``/``foreach``/``fused`` modes, :class:`FlatAdam` (the same arithmetic, no amsgrad)
over the flat buffers.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from bench.optim.bucket import Span
from bench.optim.config import OptimConfig
from bench.optim.flat import FlatOptimizer
from bench.optim.spec import OptimizerSpec, check_betas, keep_mode_keys, register

#: group key set by ``comm.placement=update`` (bench/comm/placement.py): the step count the
#: variance froze at; then ``p.grad`` is the averaged momentum (:func:`frozen_variance_step`)
FROZEN = "frozen_variance"


@torch.no_grad()
def frozen_variance_step(optimizer: torch.optim.Optimizer, decoupled: bool) -> None:
    """Adam's step with the momentum ``p.grad`` and the variance of step ``group[FROZEN]``
    (1-bit Adam's compression stage, Tang et al. 2021), bias-corrected as torch's."""
    for group in optimizer.param_groups:
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        bc2 = math.sqrt(1.0 - b2 ** max(1, int(group[FROZEN])))
        for p in group["params"]:
            if p.grad is None:
                continue
            st = optimizer.state[p]
            if "exp_avg" not in st:  # no warm-up step reached it: a zero variance
                st["step"] = torch.zeros((), dtype=torch.float32)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["step"] += 1
            m = st["exp_avg"].copy_(p.grad)
            if wd and decoupled:
                p.mul_(1.0 - lr * wd)
            denom = (st["exp_avg_sq"].sqrt() / bc2).add_(eps)
            p.addcdiv_(m, denom, value=-lr / (1.0 - b1 ** float(st["step"])))


class _TorchAdam:
    """Added to torch's Adam and AdamW: ``load_state_dict`` keeps the optimizer's update
    mode, and the step keeps the variance once a group is :data:`FROZEN`."""

    decoupled = False

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(keep_mode_keys(self, state_dict))  # type: ignore[misc]

    def frozen_variance_step(self) -> None:
        frozen_variance_step(self, decoupled=self.decoupled)  # type: ignore[arg-type]

    def step(self, closure: Any = None) -> Any:
        if any(FROZEN in g for g in self.param_groups):  # type: ignore[attr-defined]
            return self.frozen_variance_step()
        return super().step(closure)  # type: ignore[misc]


class Adam(_TorchAdam, torch.optim.Adam):
    pass


class AdamW(_TorchAdam, torch.optim.AdamW):
    decoupled = True


class FlatAdam(FlatOptimizer):
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
        # torch's group keys too: a state dict loads into torch's Adam/AdamW and back
        flags = dict(amsgrad=False, maximize=False, foreach=None, capturable=False)
        flags.update(differentiable=False, fused=None, decoupled_weight_decay=decoupled)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, **flags)
        super().__init__(params, defaults, model_dtype)
        self.decoupled = decoupled
        # each parameter's step count (its state's "step" tensors are views of it)
        self._steps = [torch.zeros(len(b.params), dtype=torch.float32) for b in self.buckets]
        # the fused kernels read the step from a float32 tensor on the parameters' device
        self._step_dev = [
            torch.zeros((), dtype=torch.float32, device=b.device) for b in self.buckets
        ]

    def _run_keys(self, bi: int) -> list[Any]:
        return self._steps[bi].tolist()  # a snapshot: the counts move during the step

    def _update(self, group: dict, span: Span) -> None:
        p, grads = span.params, span.grads
        m, v = span.state["exp_avg"], span.state["exp_avg_sq"]
        t = int(self._steps[span.bucket][span.age]) + 1  # counted in _ran
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if self.fused(span):
            # one device tensor read by every entry (the kernels only read their steps)
            step = self._step_dev[span.bucket].fill_(t)
            fn = torch._fused_adamw_ if self.decoupled else torch._fused_adam_
            hyper = dict(lr=lr, beta1=b1, beta2=b2, weight_decay=wd, eps=eps)
            fn(p, grads, m, v, [], [step] * len(p), amsgrad=False, maximize=False, **hyper)
            return
        s = span.scratch("s")
        g = grads
        if wd:
            if self.decoupled:
                torch._foreach_mul_(p, 1.0 - lr * wd)
            else:
                torch._foreach_copy_(s, grads)
                torch._foreach_add_(s, p, alpha=wd)
                g = s
        torch._foreach_lerp_(m, g, 1.0 - b1)
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, g, g, value=1.0 - b2)
        torch._foreach_copy_(s, v)  # g (when it is s) is read for the last time above
        torch._foreach_sqrt_(s)
        torch._foreach_div_(s, math.sqrt(1.0 - b2**t))
        torch._foreach_add_(s, eps)
        torch._foreach_addcdiv_(p, m, s, value=-lr / (1.0 - b1**t))

    def _ran(self, bi: int, i: int, j: int, first: bool) -> None:
        self._steps[bi][i:j] += 1
        super()._ran(bi, i, j, first)

    def _permute_extra(self, bi: int, perm: list[int]) -> None:
        self._steps[bi] = self._steps[bi][perm].clone()

    def _extra_state(self, bi: int, k: int) -> dict[str, Any]:
        return {"step": self._steps[bi][k]}  # a view: the live count

    def _reset_state(self) -> None:
        super()._reset_state()
        for c in self._steps:
            c.zero_()

    def _load_extra_state(self, bi: int, k: int, st: dict[str, Any]) -> None:
        if "step" in st:
            self._steps[bi][k] = float(st["step"])


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
