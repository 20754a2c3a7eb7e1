"""Types shared by the data modules: the per-run bundle of loaders and the per-rank batch.

Kept apart from ``bench/data/__init__.py`` so that the loader modules can use them without
importing the package that imports them (no cycle).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.registry import ConfigError

# epoch_stats() key: real samples (no padding) this rank's loader yielded since the last
# call; the curve's data/samples column is their sum over the ranks
SAMPLES = "data/rank_samples"
# token-batched loaders also report their source + target tokens (no padding); the curve's
# data/tokens column is their sum over the ranks
RANK_TOKENS = "data/rank_tokens"


@dataclass
class DataBundle:
    train: Any  # loader: iterable of (x, y) on device, len, set_epoch, epoch_stats
    eval: Any
    num_classes: int
    train_samples: int  # global samples in one training epoch
    in_channels: int = 3


def per_rank(batch: int, world_size: int, what: str) -> int:
    """``batch`` split evenly over ``world_size`` workers (ConfigError when it does not split)."""
    if batch % world_size:
        raise ConfigError(f"{what}={batch} is not divisible by the {world_size} workers")
    return batch // world_size
