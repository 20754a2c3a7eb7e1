"""A run's DAWNBench submission files (format v1.0), ``<dir>/dawnbench/<run_id>.json`` and
``.tsv``, for top-1 and top-5 targets only (docs/internals/launch.md)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.data.config import DataConfig, train_size_at
from bench.results import columns as col
from bench.results import whole

VERSION = "v1.0"
UNSET = "unknown"  # results.author / results.author_email when not given
# target metric -> the TSV's accuracy columns (and the curve columns they come from)
TSV_COLUMNS = {
    "top1": (("top1Accuracy", "top1"),),
    "top5": (("top1Accuracy", "top1"), ("top5Accuracy", "top5")),
}


def tsv_rows(curve: Sequence[Mapping[str, Any]], metric: str) -> list[dict[str, Any]]:
    cols = TSV_COLUMNS[metric]
    rows = []
    for r in curve:
        r = col.normalise(r)
        accs = [r.get(col.metric_column(m)) for _, m in cols]
        if any(not isinstance(a, (int, float)) or math.isnan(a) for a in accs):
            continue  # not evaluated after this epoch
        row = {"epoch": int(r[col.EPOCH]), "hours": float(r[col.TRAIN_TIME]) / 3600}
        row.update({name: 100.0 * float(a) for (name, _), a in zip(cols, accs)})
        rows.append(row)
    return rows


def entry(record: Mapping[str, Any]) -> dict[str, Any]:
    cfg = record.get("config") or {}
    res = cfg.get("results", {})
    cost = res.get("cost_per_hour")
    out = {
        "version": VERSION,
        "author": res.get("author") or UNSET,
        "authorEmail": res.get("author_email") or UNSET,
        "framework": f"PyTorch {record.get('torch_version') or 'unknown'}",
        "model": record["model"],
        "hardware": f"{record.get('world_size')} worker(s) on {record.get('nnodes')} node(s): "
        f"{record.get('hardware') or 'unknown hardware'}",
        "timestamp": str(record["started_at"])[:10],
        "misc": _misc(record, cfg),
    }
    if cost is not None:
        out["costPerHour"] = float(cost)
    return out


def _misc(record: Mapping[str, Any], cfg: Mapping[str, Any]) -> dict[str, Any]:
    optim, data, train = cfg.get("optim", {}), cfg.get("data", {}), cfg.get("train", {})
    tt = record.get("time_to_target_s")
    cost = (cfg.get("results") or {}).get("cost_per_hour")
    return {
        "runId": record["run_id"],
        "attempt": record.get("attempt", 1),
        "experiment": record.get("experiment"),
        "status": record.get("status"),
        "reachedTarget": tt is not None,
        "target": {"metric": record["target_metric"], "percent": 100 * record["target_value"]},
        "timeToTargetHours": tt / 3600 if tt is not None else None,
        # costPerHour x the time to target, only where the run recorded a cost per hour
        "costToTargetUSD": None if cost is None or tt is None else float(cost) * tt / 3600,
        "epochsToTarget": record.get("epochs_to_target"),
        "optimizer": {
            k: optim.get(k)
            for k in ("name", "lr", "momentum", "nesterov", "weight_decay", "warmup_epochs")
        }
        | {"schedule": optim.get("schedule"), "labelSmoothing": optim.get("label_smoothing")},
        "updateMode": record.get("update"),
        "globalBatchSize": data.get("batch_size"),
        "evalBatchSize": data.get("eval_batch_size"),
        "imageSizes": _image_sizes(data, int(record.get("epochs_run") or 0)),
        "evalImageSize": data.get("eval_image_size"),
        "data": record.get("data"),
        "communication": {
            "method": record.get("comm"),
            "density": record.get("comm_density"),
            "warmupEpochs": record.get("comm_warmup_epochs"),
            "densitySchedule": record.get("comm_density_schedule"),
        },
        "cache": record.get("cache"),
        "loader": record.get("loader"),
        "epochBudget": train.get("epochs"),
        "gitSha": record.get("git_sha"),
    }


def _image_sizes(data: Mapping[str, Any], epochs: int) -> list[int]:
    d = DataConfig(
        image_size=int(data.get("image_size", 32)), progressive=data.get("progressive", [])
    )
    return [train_size_at(d, e) for e in range(epochs)]


def write(
    results_dir: str | Path, record: Mapping[str, Any], curve: Sequence[Mapping[str, Any]]
) -> tuple[str | None, str | None]:
    """Write (or rewrite) the run's two files; their paths, or ``(None, None)`` for none."""
    metric = record["target_metric"]
    if metric not in TSV_COLUMNS:
        return None, None
    rows = tsv_rows(curve, metric)
    if not rows:
        return None, None
    js = entry(record)
    jpath = Path(results_dir) / "dawnbench" / f"{record['run_id']}.json"
    tpath = jpath.with_suffix(".tsv")
    # the note once per results directory: before its first DAWNBench JSON
    first = not any(p != jpath for p in jpath.parent.glob("*.json"))
    if UNSET in (js["author"], js["authorEmail"]) and first:
        print(
            "note: results.author / results.author_email are unset: the DAWNBench JSON says "
            f"{UNSET!r} (DAWNBench wants both)",
            flush=True,
        )
    header = ["epoch", "hours", *(name for name, _ in TSV_COLUMNS[metric])]
    lines = ["\t".join(header)]
    lines += [
        "\t".join(str(v) if isinstance(v := r[h], int) else repr(float(v)) for h in header)
        for r in rows
    ]
    jpath.parent.mkdir(parents=True, exist_ok=True)
    whole.write(tpath, "\n".join(lines) + "\n")
    whole.write(jpath, json.dumps(js, indent=4, allow_nan=False) + "\n")
    return str(jpath), str(tpath)
