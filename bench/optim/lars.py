"""LARS (You, Gitman and Ginsburg 2017, as in the MLPerf ResNet-50 reference): per layer
``trust = eta |p| / (|g| + wd |p| + eps)``, ``d = trust (g + wd p)``, then SGD momentum in
PyTorch's convention; in the ``naive``, ``foreach`` and ``flat`` modes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from bench.optim.bucket import Span
from bench.optim.config import OptimConfig, UpdateMode
from bench.optim.flat import FlatOptimizer
from bench.optim.sgd import sgd_update
from bench.optim.spec import OptimizerSpec, check_nesterov, keep_mode_keys, register
from bench.registry import ConfigError


def trust_ratio(pn: Tensor, gn: Tensor, eta: float, wd: float, eps: float) -> Tensor:
    """Per-layer trust ratios from parameter and gradient norms (any shape)."""
    ratio = eta * pn / (gn + wd * pn + eps)
    return torch.where((pn > 0) & (gn > 0), ratio, torch.ones_like(ratio))


class LARS(torch.optim.Optimizer):
    """Reference LARS (``naive``: per-tensor loop; ``foreach``: multi-tensor ops)."""

    def __init__(
        self,
        params: Any,
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        trust_coefficient: float = 0.001,
        eps: float = 1e-9,
        foreach: bool = False,
    ) -> None:
        defaults = dict(lr=lr, momentum=momentum, dampening=0.0, weight_decay=weight_decay)
        defaults.update(nesterov=nesterov, trust_coefficient=trust_coefficient, eps=eps)
        super().__init__(params, {**defaults, "lars_adapt": True, "foreach": foreach})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(keep_mode_keys(self, state_dict))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if group["foreach"]:
                self._foreach(group, params)
            else:
                self._naive(group, params)
        return loss

    def _naive(self, group: dict, params: list[torch.Tensor]) -> None:
        wd, m, lr = group["weight_decay"], group["momentum"], group["lr"]
        for p in params:
            g = p.grad
            d = g.add(p, alpha=wd) if wd else g.clone()
            if group["lars_adapt"]:
                d.mul_(
                    trust_ratio(p.norm(), g.norm(), group["trust_coefficient"], wd, group["eps"])
                )
            if m:
                st = self.state[p]
                buf = st.get("momentum_buffer")
                if buf is None:
                    buf = st["momentum_buffer"] = d.clone()
                else:
                    buf.mul_(m).add_(d)
                d = d.add_(buf, alpha=m) if group["nesterov"] else buf
            p.add_(d, alpha=-lr)

    def _foreach(self, group: dict, params: list[torch.Tensor]) -> None:
        wd, m, lr = group["weight_decay"], group["momentum"], group["lr"]
        grads = [p.grad for p in params]
        d = torch._foreach_add(grads, params, alpha=wd) if wd else [g.clone() for g in grads]
        if group["lars_adapt"]:
            pn = torch.stack(torch._foreach_norm(params))
            gn = torch.stack(torch._foreach_norm(grads))
            trust = trust_ratio(pn, gn, group["trust_coefficient"], wd, group["eps"])
            torch._foreach_mul_(d, list(trust.unbind()))
        if m:
            bufs = [self.state[p].get("momentum_buffer") for p in params]
            old = [k for k, b in enumerate(bufs) if b is not None]
            if old:  # a parameter's first gradient starts its buffer, as torch's SGD
                torch._foreach_mul_([bufs[k] for k in old], m)
                torch._foreach_add_([bufs[k] for k in old], [d[k] for k in old])
            for k, p in enumerate(params):
                if bufs[k] is None:
                    bufs[k] = self.state[p]["momentum_buffer"] = d[k].clone()
            if group["nesterov"]:
                torch._foreach_add_(d, bufs, alpha=m)
            else:
                d = bufs
        torch._foreach_add_(params, d, alpha=-lr)


class FlatLARS(FlatOptimizer):
    def __init__(
        self,
        params: Any,
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        trust_coefficient: float = 0.001,
        eps: float = 1e-9,
        model_dtype: torch.dtype | None = None,
    ) -> None:
        self.state_names = ("momentum_buffer",) if momentum != 0 else ()
        defaults = dict(lr=lr, momentum=momentum, dampening=0.0, weight_decay=weight_decay)
        defaults.update(nesterov=nesterov, trust_coefficient=trust_coefficient, eps=eps)
        super().__init__(params, {**defaults, "lars_adapt": True, "foreach": None}, model_dtype)
        # per (bucket, span positions): the layer index of every value (GPUs only)
        self._segments: dict[tuple[int, tuple[tuple[int, int], ...]], torch.Tensor] = {}

    def _layer_ids(self, span: Span, sizes: list[int]) -> torch.Tensor:
        """The layer index of every value of ``span`` (int32, built once per layout)."""
        key = (span.bucket, tuple(span.where))
        if key not in self._segments:
            dev = span.flat.device
            lengths = torch.tensor(sizes, dtype=torch.int64, device=dev)
            layer = torch.arange(len(sizes), dtype=torch.int32, device=dev)
            self._segments[key] = torch.repeat_interleave(layer, lengths)
        return self._segments[key]

    def _compact_ok(self, group: dict) -> bool:
        return not group["lars_adapt"]  # per-layer norms need the layers' own ranges

    def _permute_extra(self, bi: int, perm: list[int]) -> None:
        self._segments = {k: v for k, v in self._segments.items() if k[0] != bi}

    def _update(self, group: dict, span: Span) -> None:
        wd, fused = group["weight_decay"], self.fused(span)
        if not group["lars_adapt"]:
            sgd_update(span, span.grads, group, wd, fused)
            return
        pl, gl, bl, sizes = _layer_views(span)
        # pass 1: per-layer norms of p and g, one multi-tensor op each
        pn = torch.stack(torch._foreach_norm(pl))
        gn = torch.stack(torch._foreach_norm(gl))
        trust = trust_ratio(pn, gn, group["trust_coefficient"], wd, group["eps"])
        cpu = span.flat.device.type == "cpu"
        if cpu and self.use_fused[span.bucket] and span.grads[0].dtype == span.params[0].dtype:
            # pass 2 as one fused SGD pass per layer, the trust ratio as the gradient's scale
            hyper = dict(momentum=group["momentum"], lr=group["lr"], nesterov=group["nesterov"])
            hyper.update(dampening=0.0, maximize=False, is_first_step=span.first)
            for p, g, b, t in zip(pl, gl, bl or [None] * len(pl), trust.tolist(), strict=True):
                scale = torch.tensor(1.0 / t, dtype=torch.float32)
                mom = [] if b is None else [b]
                torch._fused_sgd_([p], [g], mom, weight_decay=wd * t, grad_scale=scale, **hyper)
            return
        # pass 2: d = trust * (g + wd * p) in a scratch buffer, then one fused momentum
        # pass without decay.  The per-layer scale: on CPU one multi-tensor op over the
        # layer views (per-element gathers run at ~1.5 ns/value there, 6x a streaming
        # pass); on GPUs one gather of the trust ratios by layer id over the span.
        d = span.scratch("lars_d")
        torch._foreach_copy_(d, span.grads)
        if wd:
            torch._foreach_add_(d, span.params, alpha=wd)
        if cpu:
            if "d_layers" not in span.cache:
                assert span.layers is not None
                span.cache["d_layers"] = _split_entries(d, span.layers)
            torch._foreach_mul_(span.cache["d_layers"], trust.tolist())
        else:
            s = span.flat.buffer("s")[: span.numel]
            torch.index_select(trust, 0, self._layer_ids(span, sizes), out=s)
            torch._foreach_mul_(d, list(s.split([e - a for a, e in span.where])))
        sgd_update(span, d, group, 0.0, fused)


def _split_entries(xs: list[torch.Tensor], layers: list[list[int]]) -> list[torch.Tensor]:
    """Every layer's view: the entries ``xs`` split by the layer sizes of each."""
    return [v for x, sizes in zip(xs, layers, strict=True) for v in x.split(sizes)]


def _layer_views(
    span: Span,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor] | None, list[int]]:
    """Per-layer views of the span's values, gradients and momentum, and the layer sizes."""
    if "layers" not in span.cache:
        assert span.layers is not None  # _compact_ok: adapted values are never gathered
        bufs = span.state.get("momentum_buffer")
        span.cache["layers"] = (
            _split_entries(span.params, span.layers),
            _split_entries(span.grads, span.layers),
            None if bufs is None else _split_entries(bufs, span.layers),
            [n for sizes in span.layers for n in sizes],
        )
    return span.cache["layers"]


def _lars_groups(groups: list[dict], cfg: OptimConfig) -> list[dict]:
    """BN parameters and biases (the no-decay group) are not layer-adapted either."""
    for i, g in enumerate(groups):  # param_groups: [decay, no_decay]
        g["lars_adapt"] = i == 0 or not cfg.no_decay_bn_bias
    return groups


def _lars_kwargs(cfg: OptimConfig) -> dict[str, Any]:
    return dict(
        lr=cfg.lr,
        momentum=cfg.momentum,
        nesterov=cfg.nesterov,
        trust_coefficient=cfg.trust_coefficient,
        eps=cfg.eps,
    )


def _check_lars(cfg: OptimConfig) -> None:
    check_nesterov(cfg)
    if not cfg.trust_coefficient > 0:
        raise ConfigError(f"optim.trust_coefficient must be positive, got {cfg.trust_coefficient}")


register(
    OptimizerSpec(
        name="lars",
        build_torch=lambda groups, cfg, mode: LARS(
            _lars_groups(groups, cfg), foreach=mode.get("foreach", False), **_lars_kwargs(cfg)
        ),
        build_flat=lambda groups, cfg, low: FlatLARS(
            _lars_groups(groups, cfg), model_dtype=low, **_lars_kwargs(cfg)
        ),
        modes=frozenset(UpdateMode) - {UpdateMode.fused},  # torch has no fused LARS kernel
        validate=_check_lars,
    )
)
