"""How the replicas of a run meet (:data:`SYNCS`): ``ddp`` every step through DDP's comm hook,
the others one replica per node meeting every H steps through torchft (:mod:`.replica`, in
the workers), some with a sparse outer exchange (:mod:`.sparse`; docs/algorithms.md)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from bench.registry import ConfigError, Registry
from bench.sync.config import SyncConfig

#: (torchft manager, model, inner optimizer, config) -> torchft's context manager
Build = Callable[[Any, nn.Module, torch.optim.Optimizer, SyncConfig], Any]


@dataclass(frozen=True)
class SyncSpec:
    """One strategy; ``build`` None: no outer synchronisation (``ddp``)."""

    build: Build | None
    fragmented: bool = False  # it takes sync.fragments > 1
    outer_optimizer: bool = False  # it steps one
    knobs: tuple[str, ...] = ()  # the sparse exchange's fields of SyncConfig it takes
    momentum: bool = True  # its outer step takes sync.outer_momentum (else it must be 0)

    @property
    def outer(self) -> bool:  # the nodes meet every H steps, through torchft
        return self.build is not None


SYNCS: Registry[SyncSpec] = Registry("sync strategy")


def is_outer(name: str) -> bool:
    return SYNCS.get(name).outer


def split_fragments(model: nn.Module, n: int) -> list[nn.Module]:
    """``model``'s parameters in ``n`` contiguous modules of about equal size (in order)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not 1 <= n <= len(params):
        raise ConfigError(f"sync.fragments={n}: the model has {len(params)} parameter tensors")
    cum = list(itertools.accumulate(p.numel() for p in params))
    total, cuts = cum[-1], [0]
    for j in range(1, n):  # after the tensor that reaches j/n of the elements, one at least
        at = next(i for i, c in enumerate(cum) if c * n >= j * total) + 1
        cuts.append(min(max(at, cuts[-1] + 1), len(params) - (n - j)))
    cuts.append(len(params))
    frags = [nn.Module() for _ in range(n)]
    for m, a, b in zip(frags, cuts, cuts[1:]):
        m.params = nn.ParameterList(params[a:b])
    return frags


def _outer_sgd(params: Any, cfg: SyncConfig) -> torch.optim.Optimizer:
    m = float(cfg.outer_momentum)  # torch's Nesterov needs a momentum: none, no Nesterov
    return torch.optim.SGD(params, lr=cfg.outer_lr, momentum=m, nesterov=cfg.nesterov and m > 0)


def _localsgd(manager: Any, model: nn.Module, opt: torch.optim.Optimizer, cfg: SyncConfig) -> Any:
    from bench.sync.replica import LocalSGDSync

    return LocalSGDSync(manager, model, opt, sync_every=cfg.sync_every)


def _diloco(
    manager: Any,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    cfg: SyncConfig,
    exchange: str = "",
) -> Any:
    """torchft's DiLoCo over ``cfg.fragments``; ``exchange``: the class of :mod:`.sparse` that
    sends each fragment's pseudo-gradient in place of its allreduce."""
    from bench.sync import sparse
    from bench.sync.replica import DiLoCoSync

    frags = split_fragments(model, cfg.fragments)
    return DiLoCoSync(
        manager,
        frags,
        opt,
        [_outer_sgd(f.parameters(), cfg) for f in frags],
        sync_every=cfg.sync_every,
        fragment_sync_delay=cfg.fragment_sync_delay,
        exchanges=[getattr(sparse, exchange)(manager, f, cfg) for f in frags] if exchange else None,
    )


SYNCS.register("ddp")(SyncSpec(None))
SYNCS.register("localsgd")(SyncSpec(_localsgd))
SYNCS.register("diloco")(SyncSpec(_diloco, outer_optimizer=True))
SYNCS.register("streaming_diloco")(SyncSpec(_diloco, fragmented=True, outer_optimizer=True))
SYNCS.register("sparseloco")(
    SyncSpec(
        partial(_diloco, exchange="ChunkTopK"),
        outer_optimizer=True,
        momentum=False,
        knobs=("density", "ef_beta", "chunk_size", "quant_bits"),
    )
)
SYNCS.register("hitopk_diloco")(  # and sync.mstopk_method, checked by its type
    SyncSpec(
        partial(_diloco, exchange="ShardTopK"), outer_optimizer=True, knobs=("density", "ef_beta")
    )
)


def build(cfg: SyncConfig, manager: Any, model: nn.Module, optimizer: torch.optim.Optimizer) -> Any:
    """``cfg.name``'s torchft strategy, its hooks on ``optimizer``'s step (``__exit__``: off)."""
    spec = SYNCS.get(cfg.name)
    if spec.build is None:
        raise ValueError(f"sync={cfg.name} has no outer synchronisation")
    return spec.build(manager, model, optimizer, cfg).__enter__()


def validate(
    cfg: SyncConfig,
    *,
    param_tensors: int | None = None,
    comm: str = "dense",
    update: str = "foreach",
    amp: str = "off",
    master_weights: str = "off",
) -> None:
    """Refuse a ``sync`` config that cannot run, in one line, before any worker starts."""
    spec = SYNCS.get(cfg.name)
    if not spec.outer:
        return
    h, f, delay = int(cfg.sync_every), int(cfg.fragments), int(cfg.fragment_sync_delay)
    if h < 1:
        raise ConfigError(f"sync.sync_every (H) must be >= 1, got {h}")
    if f < 1 or (f > 1 and not spec.fragmented):
        raise ConfigError(
            f"sync.fragments={f}: sync={cfg.name} synchronises the whole model "
            "(fragments=1; sync=streaming_diloco takes more)"
        )
    if f > h:
        raise ConfigError(f"sync.fragments={f} is more than sync.sync_every (H) = {h}")
    if h % f:
        raise ConfigError(f"sync.fragments={f} must divide sync.sync_every (H) = {h}")
    if param_tensors is not None and f > param_tensors:
        raise ConfigError(
            f"sync.fragments={f} is more than the model's {param_tensors} parameter tensors"
        )
    if not 0 <= delay < h // f:
        raise ConfigError(
            f"sync.fragment_sync_delay must be in [0, H / fragments) = [0, {h // f}), got {delay}"
        )
    if spec.outer_optimizer and not (cfg.outer_lr > 0 and 0 <= cfg.outer_momentum < 1):
        raise ConfigError(
            f"sync.outer_lr must be > 0 and sync.outer_momentum in [0, 1), got "
            f"{cfg.outer_lr} and {cfg.outer_momentum}"
        )
    for name in spec.knobs:
        ok, what = _KNOBS[name]
        if not ok(getattr(cfg, name)):
            raise ConfigError(f"sync.{name} must be {what}, got {getattr(cfg, name)}")
    if not spec.momentum and cfg.outer_momentum != 0:
        raise ConfigError(
            f"sync={cfg.name} has no outer momentum (its error feedback takes that role): "
            f"set sync.outer_momentum=0, got {cfg.outer_momentum}"
        )
    if cfg.quorum_timeout_s <= 0:
        raise ConfigError(f"sync.quorum_timeout_s must be > 0, got {cfg.quorum_timeout_s}")
    refused = {
        "comm": (comm == "hitopk", "comm=hitopk spans the nodes itself; inside a node use dense"),
        "update": (update == "flat", "optim.update=flat owns the parameters; use foreach"),
        "amp": (amp == "fp16", "train.amp=fp16 skips steps on overflow, unevenly per node"),
        "master": (master_weights != "off", "optim.master_weights keeps a second model copy"),
    }
    for bad, why in refused.values():
        if bad:
            raise ConfigError(f"sync={cfg.name} cannot run with {why}")


#: a sparse exchange's knob -> (whether a value is good, what it must be)
_KNOBS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "density": (lambda v: 0 < v <= 1, "in (0, 1]: the fraction of elements sent"),
    "ef_beta": (lambda v: 0 <= v <= 1, "in [0, 1]: the error-feedback buffer's decay"),
    "chunk_size": (lambda v: v >= 2, ">= 2 elements"),
    "quant_bits": (lambda v: 0 <= v <= 8, "0 (float32 values) or 1 to 8 bits"),
}


def parameter_tensors(model_cfg: Any) -> int:
    """The parameter tensors of ``model_cfg``'s model (built on the meta device)."""
    from bench.models import build_model

    with torch.device("meta"):
        return sum(1 for p in build_model(model_cfg, 10).parameters() if p.requires_grad)
