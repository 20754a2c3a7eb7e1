"""Names of the per-epoch curve columns, defined once.

Columns are namespaced by what they measure: ``loss/*``, ``acc/*`` (held-out metrics),
``clock/*`` (seconds of wall clock per epoch or cumulated), ``time/*`` (seconds per
training step, by phase), ``throughput/*``, ``comm/*``, ``cache/*``, ``data/*``.  Curves
committed before the namespacing used flat names; :func:`normalise` renames them on
reading, so every reader sees one set of names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

EPOCH = "epoch"
TRAIN_TIME = "clock/train_s"  # cumulative training time (DAWNBench's clock), s
EPOCH_TIME = "clock/epoch_s"  # training time of this epoch, s
EVAL_TIME = "clock/eval_s"  # evaluation time after this epoch (not training time), s
TRAIN_LOSS = "loss/train"  # mean training loss over the epoch's steps and workers
EVAL_LOSS = "loss/eval"  # mean held-out loss per sample
TRAIN_TOP1 = "acc/train_top1"  # training top-1 accuracy over the epoch (augmented inputs)
LR = "optim/lr"  # learning rate at the end of the epoch
SAMPLES = "data/samples"  # training samples of the epoch, summed over every worker
STEPS = "data/steps"  # optimizer steps of the epoch
THROUGHPUT = "throughput/samples_per_s"  # SAMPLES / EPOCH_TIME
SKIPPED = "data/skipped"  # damaged training images skipped in the epoch, every worker's
TOKENS = "data/tokens"  # source + target tokens (non-pad) of the epoch, every worker's
TOKEN_THROUGHPUT = "throughput/tokens_per_s"  # TOKENS / EPOCH_TIME
DATA_SHARE = "time/data_pct"  # fraction of the epoch spent waiting for data

# held-out metrics as the workload names them -> curve column
_METRICS = {"top1": "acc/top1", "top5": "acc/top5", "loss": EVAL_LOSS}

# flat names of the curves written before the namespacing -> today's names
RENAMES = {
    "train_time_s": TRAIN_TIME,
    "epoch_train_s": EPOCH_TIME,
    "eval_time_s": EVAL_TIME,
    "train_loss": TRAIN_LOSS,
    "train_top1": TRAIN_TOP1,
    "top1": "acc/top1",
    "top5": "acc/top5",
    "eval_loss": EVAL_LOSS,
    "samples": SAMPLES,
    "steps": STEPS,
    "throughput_samples_per_s": THROUGHPUT,
    "data_pct": DATA_SHARE,
    "lr": LR,
}


def metric_column(metric: str) -> str:
    """The curve column of a held-out metric: ``top1`` -> ``acc/top1``, else ``eval/<metric>``."""
    return _METRICS.get(metric, f"eval/{metric}")


def normalise(row: Mapping[str, Any]) -> dict[str, Any]:
    """A curve row with today's column names (old flat names renamed)."""
    return {RENAMES.get(k, k): v for k, v in row.items()}
