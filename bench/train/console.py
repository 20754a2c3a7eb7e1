"""The per-epoch table a run prints on rank 0: which curve columns, their widths and units."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bench.results import columns as col

if TYPE_CHECKING:  # the loop imports this module; the state's type is only named here
    from bench.train.loop import TrainState


def _columns(s: TrainState) -> list[tuple[str, str, int, str, float]]:
    """The per-epoch table: (header, curve column, width, format, scale)."""
    metrics = [m for m in s.workload.metrics if m != "loss"]
    return [
        ("epoch", col.EPOCH, 5, "d", 1),
        ("lr", col.LR, 8, ".4f", 1),
        ("train_loss", col.TRAIN_LOSS, 10, ".4f", 1),
        ("train_top1", col.TRAIN_TOP1, 9, ".2f", 100),
        *[(f"{m}%", col.metric_column(m), 8, ".2f", 100) for m in metrics],
        ("train_s", col.TRAIN_TIME, 10, ".2f", 1),
        ("epoch_s", col.EPOCH_TIME, 8, ".2f", 1),
        ("samples/s", col.THROUGHPUT, 9, ".1f", 1),
        ("data%", col.DATA_SHARE, 6, ".1f", 100),
    ]


def table_row(s: TrainState, row: dict[str, Any]) -> str:
    """One epoch's line of the table, under :func:`table_header`."""
    return " ".join(
        format(row[key] * scale if scale != 1 else row[key], f">{w}{fmt}")
        for _, key, w, fmt, scale in _columns(s)
    )


def table_header(s: TrainState) -> str:
    """The per-epoch table's header line, printed by rank 0 before the first epoch."""
    return " ".join(f"{name:>{w}}" for name, _, w, _, _ in _columns(s))
