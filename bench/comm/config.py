"""The hooks' options (:class:`HookOptions`, ``make_hook``'s keywords, checked) and the
``comm`` config group's schema (:class:`CommConfig`: the same names, and a run's schedule).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from bench.comm.cost import MIN_NUMEL
from bench.registry import Choice, ConfigError


class ValueDtype(Choice):
    """dtype of the sparse values on the wire (a torch dtype name)."""

    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"


class Selector(Choice):
    """Top-k selector of ``hitopk``'s shards (a key of SELECTORS and of COMPRESSORS)."""

    topk = "topk"
    mstopk = "mstopk"
    randomk = "randomk"


class MSTopKMethod(Choice):
    """How ``mstopk`` finds its threshold (see ``bench/comm/selection.py``)."""

    tiled = "tiled"
    sampled = "sampled"
    hist = "hist"
    paper = "paper"


class Placement(Choice):
    """Where a sparse method compresses (``bench/comm/placement.py``, docs/algorithms.md)."""

    grad = "grad"  # the raw gradient, error feedback on it, an unmodified optimizer
    grad_dgc = "grad+dgc"  # DGC: the momentum-corrected velocity, momentum-factor masking
    update = "update"  # 1-bit Adam's: the momentum, after a dense warm-up freezes the variance


C = TypeVar("C", bound=Choice)


def parse(kind: type[C], value: str, what: str) -> C:
    """``kind(value)``, or a ConfigError naming ``what`` and the allowed values."""
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(
            f"unknown {what} {value!r}; choose one of: {', '.join(kind.values())}"
        ) from None


@dataclass(frozen=True)
class HookOptions:
    """``make_hook``'s options, converted to their types and checked on construction."""

    density: float = 0.01  # fraction of each bucket's elements sent, in (0, 1] (top-k family)
    error_feedback: bool = True  # keep what is not sent and add it to the next step
    warmup_steps: int = 0  # dense steps first (PowerSGD: its start_powerSGD_iter, >= 2)
    min_numel: int = MIN_NUMEL  # buckets with fewer elements go through dense allreduce
    value_dtype: ValueDtype = ValueDtype.float32  # sparse values on the wire
    selector: Selector = Selector.mstopk  # hitopk's shard selector
    mstopk_method: MSTopKMethod = MSTopKMethod.tiled
    procs_per_node: int = 0  # workers per node (hitopk); 0 = torchrun's LOCAL_WORLD_SIZE
    powersgd_rank: int = 4  # PowerSGD's matrix_approximation_rank
    seed: int | None = None  # RNG seed of randomk
    # CUDA events for time/select_s and time/comm_s of CUDA buckets (CPU: always timed)
    timing: bool = True
    placement: Placement = Placement.grad  # what a sparse method compresses (Placement)

    def __post_init__(self) -> None:
        # strings from Python callers become the enums (ConfigError listing the values)
        for name, kind in (
            ("value_dtype", ValueDtype),
            ("selector", Selector),
            ("mstopk_method", MSTopKMethod),
            ("placement", Placement),
        ):
            object.__setattr__(self, name, parse(kind, getattr(self, name), name))
        for name, kind in (("density", float), ("error_feedback", bool), ("timing", bool)):
            object.__setattr__(self, name, kind(getattr(self, name)))
        for name in ("warmup_steps", "min_numel", "procs_per_node", "powersgd_rank"):
            object.__setattr__(self, name, int(getattr(self, name)))
        if not 0.0 < self.density <= 1.0:
            raise ConfigError(f"density must be in (0, 1], got {self.density}")
        if self.min_numel < 0 or self.warmup_steps < 0:
            raise ConfigError("min_numel and warmup_steps must be >= 0")
        if self.powersgd_rank < 1:
            raise ConfigError(f"powersgd_rank must be >= 1, got {self.powersgd_rank}")

    @classmethod
    def of(cls, cfg: Any, **more: Any) -> HookOptions:
        """The options a ``comm`` config holds, and ``more``; errors name config keys."""
        own = {f.name: getattr(cfg, f.name) for f in fields(cls) if hasattr(cfg, f.name)}
        try:
            return cls(**{**own, **more})
        except ConfigError as e:
            raise config_keys(e) from None

    @classmethod
    def checked(cls, options: dict[str, Any]) -> HookOptions:
        """``make_hook``'s keywords as options; a misspelt one is a TypeError."""
        known = [f.name for f in fields(cls)]
        for k in options:
            if k not in known:
                close = difflib.get_close_matches(k, known, n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]}?" if close else ""
                raise TypeError(
                    f"make_hook got an unknown option {k!r}{hint} (its options: {', '.join(known)})"
                )
        return cls(**options)


#: make_hook's words in a hook's errors -> the suite's (its config keys)
_SUITE_WORDS = {
    "run it on 2 or more nodes": "use cluster.nnodes=2",
    "use mstopk on one node": "comm=mstopk on one node",
}


def config_keys(e: ConfigError) -> ConfigError:
    """A hook's error in the suite's config keys (``procs_per_node=1`` ->
    ``comm.procs_per_node=1``), for the checks before a run."""
    msg = str(e)
    for words, keys in _SUITE_WORDS.items():
        msg = msg.replace(words, keys)
    names = "|".join(f.name for f in fields(HookOptions))
    return ConfigError(re.sub(rf"(?<![\w.])({names})\b(?=[ =])", r"comm.\1", msg))


@dataclass
class CommConfig:
    """The ``comm`` group: a hook name, its :class:`HookOptions` (``timing`` off: each
    CUDA event costs a record and a read) and the run's schedule around it."""

    name: str = "dense"  # a key of bench.comm.HOOKS
    density: float = 0.01
    error_feedback: bool = True
    warmup_epochs: int = 0  # dense epochs before compression starts
    # dense optimizer steps before compression starts (the step axis; with warmup_epochs,
    # whichever ends later; PowerSGD: its start_powerSGD_iter)
    warmup_steps: int = 0
    # densities after warm-up (the last one repeats), one per epoch, or with schedule_steps
    # > 0 one per that many optimizer steps
    density_schedule: list[float] = field(default_factory=list)
    schedule_steps: int = 0
    min_numel: int = MIN_NUMEL
    bucket_cap_mb: float = 25.0  # DDP bucket size (MB)
    value_dtype: ValueDtype = ValueDtype.float32
    selector: Selector = Selector.mstopk
    mstopk_method: MSTopKMethod = MSTopKMethod.tiled
    procs_per_node: int = 0  # 0 = from the launcher (LOCAL_WORLD_SIZE)
    powersgd_rank: int = 4
    timing: bool = False  # on for `bench comm`
    timeout_s: float = 600.0  # a collective waiting longer than this for a peer ends the run
    # sparse methods: grad | grad+dgc (SGD with momentum) | update (Adam, after a warm-up);
    # a string: Hydra matches enum fields by member name, and "grad+dgc" is none
    placement: str = "grad"
