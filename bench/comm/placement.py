"""Where a sparse method compresses: the raw gradient (``grad``, the hooks' own), DGC's
velocity (``grad+dgc``, Lin et al., ICLR 2018) or, after a dense warm-up froze Adam's
variance, its momentum (``update``, 1-bit Adam's, Tang et al., ICML 2021); docs/algorithms.md.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from bench.comm.compressors import Compressed, ResidualMemory
from bench.comm.config import Placement
from bench.comm.layout import places
from bench.comm.wire import widened
from bench.registry import ConfigError

#: param-group key of an Adam whose variance is frozen: the step count it froze at
#: (``bench.optim.adam.FROZEN`` reads the same name; comm/ does not import optim/)
FROZEN = "frozen_variance"
#: the optimizers (``optim.name``) each placement fits
FITS = {Placement.grad_dgc: ("sgd",), Placement.update: ("adam", "adamw")}


def check(
    placement: Placement | str,
    *,
    sparse: bool,
    comm: str,
    optim: Any,
    amp: str = "off",
    error_feedback: bool = True,
    warmup: int = 1,
) -> None:
    """Refuse a placement the run cannot train with (ConfigError): ``optim`` is the
    ``optim`` config, ``warmup`` the dense warm-up (epochs or steps)."""
    p = Placement(str(placement))
    if p is Placement.grad:
        return
    what = f"comm.placement={p}"
    if not sparse:
        raise ConfigError(f"{what} applies to the sparse methods (topk, mstopk, hitopk, "
                          f"randomk), not comm={comm}")  # fmt: skip
    if str(optim.name) not in FITS[p]:
        other = "comm.placement=update for Adam" if p is Placement.grad_dgc else (
            "comm.placement=grad+dgc for SGD with momentum")  # fmt: skip
        raise ConfigError(f"{what} does not fit optim={optim.name} (it needs "
                          f"{' or '.join(FITS[p])}; use {other})")  # fmt: skip
    if float(optim.clip_norm) > 0:
        raise ConfigError(f"{what} sends an update, not a gradient: set optim.clip_norm=0")
    if str(amp) == "fp16":
        raise ConfigError(f"{what} keeps momenta of scaled gradients: use train.amp=bf16 or off")
    if p is Placement.grad_dgc:
        if float(optim.momentum) <= 0:
            raise ConfigError(f"{what} corrects SGD's momentum: it needs optim.momentum > 0")
        if not error_feedback:
            raise ConfigError(f"{what} keeps the unsent velocity: set comm.error_feedback=true")
        return
    if str(optim.update) == "flat":
        raise ConfigError(f"{what} runs on torch's Adam: use optim.update=naive, foreach or fused")
    if str(optim.name) == "adam" and float(optim.weight_decay) > 0:
        raise ConfigError(f"{what} decays weights decoupled only: use optim=adamw")
    if warmup <= 0:
        raise ConfigError(f"{what} freezes Adam's variance after a dense warm-up: set "
                          "comm.warmup_steps or comm.warmup_epochs > 0")  # fmt: skip


@dataclass
class DGCMemory(ResidualMemory):
    """DGC's local accumulation as error feedback: per bucket key a momentum ``u`` and the
    velocity (the residual); ``update`` also clears the sent coordinates' ``u``
    (momentum-factor masking)."""

    momentum: float = 0.0
    nesterov: bool = False
    momenta: dict[Hashable, torch.Tensor] = field(default_factory=dict)
    moved: set[Hashable] = field(default_factory=set)  # keys given momentum since the sweep

    def corrected(self, x: torch.Tensor, key: Hashable) -> torch.Tensor:
        """``u = m u + x``; then ``x + m u`` (Nesterov) or ``u``, as torch's SGD computes."""
        u = self.momenta.get(key)
        if u is None or u.shape != x.shape or u.device != x.device:
            u = self.momenta[key] = torch.zeros_like(x, dtype=widened(x.dtype))
        self.moved.add(key)
        u.mul_(self.momentum).add_(x)
        return x.add(u, alpha=self.momentum) if self.nesterov else u

    def compensate(self, x: torch.Tensor, key: Hashable) -> torch.Tensor:
        return super().compensate(self.corrected(x, key), key)

    def update(self, key: Hashable, compensated: torch.Tensor, c: Compressed) -> None:
        super().update(key, compensated, c)
        if c.indices is not None:
            self.momenta[key].view(-1).index_fill_(0, c.indices, 0.0)

    def sweep(self) -> None:
        if self.used or self.moved:  # a step ran: momenta of buckets it did not use go
            for k in [k for k in self.momenta if k not in self.used | self.moved]:
                self.discard(self.momenta.pop(k).numel(), "a momentum the last step did not use")
        self.moved = set()
        super().sweep()

    def state_dict(self) -> dict[str, dict[Hashable, torch.Tensor]]:
        return {**super().state_dict(), "momenta": self.momenta}

    def load_state_dict(self, sd: Mapping[str, Mapping[Hashable, torch.Tensor]]) -> None:
        super().load_state_dict(sd)
        self.momenta, self.moved = {k: v.clone() for k, v in sd.get("momenta", {}).items()}, set()


class DGC:
    """``grad+dgc``: the hook takes SGD's momentum and weight decay over (:meth:`bind`,
    :class:`DGCMemory`); the optimizer steps with the averaged sparse velocity."""

    def __init__(self, memory: DGCMemory) -> None:
        self.memory = memory
        self.decay: dict[int, float] | None = None  # parameter id -> weight decay (bound)
        # bucket key -> (parameter id, offset, numel) of each of its parameters
        self.places: dict[Hashable, list[tuple[int, int, int]]] = {}

    def bind(self, optimizer: torch.optim.Optimizer) -> None:
        """Take ``optimizer``'s (an SGD's) momentum, Nesterov flag and weight decays; it is
        left a plain ``p -= lr * grad``."""
        groups = optimizer.param_groups
        if any("momentum" not in g or "nesterov" not in g for g in groups):
            raise ConfigError("comm.placement=grad+dgc needs an SGD optimizer (optim=sgd)")
        moms = {float(g["momentum"]) for g in groups}
        if len(moms) != 1 or any(float(g.get("dampening", 0.0)) != 0 for g in groups):
            raise ConfigError("comm.placement=grad+dgc needs one momentum and no dampening")
        if self.decay is None:  # a second bind (a rebuilt hook) keeps the first values
            self.memory.momentum = moms.pop()
            self.memory.nesterov = bool(groups[0]["nesterov"])
            self.decay = {id(p): float(g["weight_decay"]) for g in groups for p in g["params"]}
        for g in groups:
            g.update(momentum=0.0, nesterov=False, weight_decay=0.0)

    def before(self, state: Any, bucket: Any, key: Hashable, dense: bool) -> bool:
        """Weight decay into the bucket; a dense bucket's momentum step here, a sparse one's
        in the memory.  Returns ``dense``."""
        if self.decay is None:
            raise RuntimeError("comm.placement=grad+dgc: bind the optimizer first (attach)")
        buf = bucket.buffer()
        grads, params = bucket.gradients(), bucket.parameters()
        if key not in self.places:
            self.places[key] = places(bucket)
        self._regroup(key, buf)
        for g, p in zip(grads, params, strict=True):
            wd = self.decay.get(id(p), 0.0)
            if wd:
                g.add_(p.detach(), alpha=wd)
        if not (dense or state.density >= 1.0):
            return False
        d = self.memory.corrected(buf, key)
        if d.data_ptr() != buf.data_ptr():
            buf.copy_(d)
        return True

    def _regroup(self, key: Hashable, buf: torch.Tensor) -> None:
        """A bucket DDP regrouped gathers its momentum by parameter from the buckets that
        held it (the velocity goes by ``ResidualMemory.sweep``)."""
        mom = self.memory.momenta
        if key in mom:
            return
        # only buckets' momenta (hitopk's shards have their own, keyed (key, "shard"))
        old = {pid: (k, off) for k, lay in self.places.items() if k in mom for pid, off, _ in lay}
        if not any(pid in old for pid, _, _ in self.places[key]):
            return
        new = torch.zeros_like(buf, dtype=widened(buf.dtype))
        for pid, off, n in self.places[key]:
            if pid in old:
                k, src = old[pid]
                new[off : off + n] = mom[k][src : src + n]
        mom[key] = new
        for k in [k for k in self.places if k != key and k in mom]:
            held = {q for j in self.places if j != k and j in mom for q, _, _ in self.places[j]}
            if {q for q, _, _ in self.places[k]} <= held:
                del mom[k]  # every parameter of it has moved


class FrozenVariance:
    """``update``: after the warm-up each bucket becomes ``lerp(exp_avg, g, 1 - beta1)``,
    compressed with error feedback; the groups marked :data:`FROZEN` make the optimizer
    step with ``p.grad`` as the momentum (``bench.optim.adam.frozen_variance_step``)."""

    def __init__(self) -> None:
        self.optimizer: torch.optim.Optimizer | None = None
        self._groups: tuple[list[int], dict[int, dict]] = ([], {})  # group ids, param -> group

    def bind(self, optimizer: torch.optim.Optimizer) -> None:
        if not hasattr(optimizer, "frozen_variance_step"):
            raise ConfigError(
                f"comm.placement=update needs this suite's Adam or AdamW, not "
                f"{type(optimizer).__name__} (optim=adam|adamw, optim.update not flat)"
            )
        self.optimizer = optimizer

    def group_of(self, p: torch.Tensor) -> dict:
        """The param group of ``p`` (a loaded state dict replaces the group dicts)."""
        assert self.optimizer is not None
        groups = self.optimizer.param_groups
        ids = [id(g) for g in groups]
        if self._groups[0] != ids:
            self._groups = (ids, {id(q): g for g in groups for q in g["params"]})
        return self._groups[1][id(p)]

    def freeze(self) -> None:
        opt = self.optimizer
        assert opt is not None
        for g in opt.param_groups:
            if FROZEN not in g:
                st = [opt.state.get(p, {}) for p in g["params"]]
                steps = [int(s["step"]) for s in st if "step" in s]
                g[FROZEN] = max(steps, default=0)

    def before(self, state: Any, bucket: Any, key: Hashable, dense: bool) -> bool:
        if state.force_dense or state.step < state.warmup_steps:
            return dense  # the warm-up: Adam on the raw gradient, which learns the variance
        if self.optimizer is None:
            raise RuntimeError("comm.placement=update: bind the optimizer first (attach)")
        self.freeze()
        opt = self.optimizer
        for g, p in zip(bucket.gradients(), bucket.parameters(), strict=True):
            w = 1.0 - self.group_of(p)["betas"][0]
            m = opt.state.get(p, {}).get("exp_avg")
            if m is None:  # no warm-up step reached this parameter: m = 0
                g.mul_(w)
            else:  # Adam's own momentum step, exp_avg.lerp_(grad, 1 - beta1)
                g.copy_(torch.lerp(m, g, w))
        return dense


def make(placement: Placement | str, error_feedback: bool) -> tuple[Any, ResidualMemory | None]:
    """The placement object (None for ``grad``) and the memory it needs (None: any)."""
    p = Placement(str(placement))
    if p is Placement.grad_dgc:
        if not error_feedback:
            raise ConfigError("comm.placement=grad+dgc needs comm.error_feedback=true")
        mem = DGCMemory()
        return DGC(mem), mem
    if p is Placement.update:
        return FrozenVariance(), None
    return None, None
