"""The per-epoch curve columns' names, and the one place where older recorded formats are
read as today's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

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
# the epoch's steps by the phase each was sent in (bench.comm.stats.format_phases; its
# PHASES is the same name: importing it would load torch)
COMM_PHASES = "comm/phases"

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
    return _METRICS.get(metric, f"eval/{metric}")


def normalise(row: Mapping[str, Any]) -> dict[str, Any]:
    return {RENAMES.get(k, k): v for k, v in row.items()}


# an older scaling table's names -> today's
SCALING_RENAMES = {"nnodes": "nodes", "nproc_per_node": "workers_per_node"}


def newer_scaling(frame: pd.DataFrame) -> pd.DataFrame:
    """A scaling table with today's names (one worker per node where none is said)."""
    df = frame.copy()
    for old, new in SCALING_RENAMES.items():
        if old in df.columns:
            df[new] = df[new].fillna(df[old]) if new in df.columns else df[old]
            df = df.drop(columns=old)
    if "workers_per_node" not in df.columns:
        df["workers_per_node"] = 1
    return df


def older_records(records: Iterable[Mapping[str, Any]], fields: Iterable[str]) -> list[str]:
    """One line per set of ``fields`` that some records lack (they read as absent)."""
    lacking: dict[tuple[str, ...], list[str]] = {}
    for r in records:
        miss = tuple(f for f in fields if f not in r)
        if miss:
            lacking.setdefault(miss, []).append(str(r.get("run_id")))
    return [
        f"{len(ids)} record(s) written before the fields {', '.join(m)} existed "
        f"(read as absent): {', '.join(ids)}"
        for m, ids in lacking.items()
    ]
