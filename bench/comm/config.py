"""Schema of the ``comm`` config group (conf/comm/*.yaml) and its typed choices.

Hydra refuses a value outside a :class:`~bench.registry.Choice` when the config is composed;
:func:`parse` gives the same refusal (as a ConfigError) to strings that reach the library
from Python, e.g. ``make_hook(..., value_dtype="int8")``.  Cross-field checks (density
range, topology) are in :func:`bench.comm.validate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

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


C = TypeVar("C", bound=Choice)


def parse(kind: type[C], value: str, what: str) -> C:
    """``kind(value)``, or a ConfigError naming ``what`` and the allowed values."""
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(
            f"unknown {what} {value!r}; choose one of: {', '.join(kind.values())}"
        ) from None


@dataclass
class CommConfig:
    # registry key: dense | fp16 | bf16 | topk | mstopk | randomk | hitopk | powersgd
    name: str = "dense"
    density: float = 0.01  # fraction of gradient elements sent (top-k family), in (0, 1]
    error_feedback: bool = True  # keep what was not sent and add it to the next step
    warmup_epochs: int = 0  # dense epochs before compression starts
    # per-epoch densities after warm-up (the last one repeats)
    density_schedule: list[float] = field(default_factory=list)
    min_numel: int = 16384  # buckets with fewer elements go through dense allreduce
    bucket_cap_mb: float = 25.0  # DDP bucket size (MB)
    value_dtype: ValueDtype = ValueDtype.float32  # sparse values on the wire
    selector: Selector = Selector.mstopk  # hitopk's shard selector
    mstopk_method: MSTopKMethod = MSTopKMethod.tiled
    procs_per_node: int = 0  # workers per node for hitopk; 0 = from the launcher (LOCAL_WORLD_SIZE)
    powersgd_rank: int = 4  # PowerSGD matrix_approximation_rank
    # CUDA events for time/select_s and time/comm_s of CUDA buckets: off in training (each
    # event is a record on the stream and a read at the epoch's end); on for `bench comm`
    timing: bool = False
    timeout_s: float = 600.0  # a collective waiting longer than this for a peer ends the run
