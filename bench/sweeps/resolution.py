"""How finely evaluation runs resolve time to target: the bracket between the crossing
evaluation and the one before, and how much sooner a target one held-out sample lower is
reached (docs/internals/report.md)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.results.columns import TRAIN_TIME, metric_column, normalise
from bench.results.records import load_curve
from bench.results.timing import time_to_target_steps


def _points(
    curve: Sequence[Mapping[str, Any]], evals: Iterable[Mapping[str, Any]], metric: str
) -> list[tuple[float, float]]:
    col = metric_column(metric)
    out = []
    for raw in [*curve, *evals]:
        row = normalise(raw)
        v, t = row.get(col), row.get(TRAIN_TIME)
        if v is None or t is None or (isinstance(v, float) and math.isnan(v)):
            continue
        out.append((float(t), float(v)))
    return sorted(set(out))


def run_resolution(
    curve: Sequence[Mapping[str, Any]],
    evals: Iterable[Mapping[str, Any]],
    metric: str,
    target: float,
    sample: float | None = None,
) -> dict[str, float] | None:
    """``bracket_s`` and ``one_sample_s`` of one run (None if it never reached ``target``);
    ``sample``: one held-out sample in the metric's units (None for BLEU)."""
    evals = list(evals)
    t, _, _ = time_to_target_steps(curve, evals, metric, target)
    if t is None:
        return None
    before = [p for p, _ in _points(curve, evals, metric) if p < t]
    out = {"time_to_target_s": t, "bracket_s": t - max(before) if before else t}
    if sample:
        lower, _, _ = time_to_target_steps(curve, evals, metric, target - sample)
        out["one_sample_s"] = t - lower if lower is not None else 0.0
    return out


def sweep_resolution(
    results_dir: str | Path,
    records: Iterable[Mapping[str, Any]],
    metric: str,
    target: float,
    sample: float | None = None,
) -> list[dict[str, float]]:
    """:func:`run_resolution` of every record that reached the target and has a curve."""
    out = []
    for r in records:
        if r.get("time_to_target_s") is None:
            continue
        try:
            curve = load_curve(results_dir, str(r["run_id"])).to_dict("records")
        except (OSError, ValueError, KeyError):
            continue
        res = run_resolution(curve, r.get("evals") or (), metric, target, sample)
        if res is not None:
            out.append(res)
    return out


def summary(runs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Bracket and one-sample shift statistics; ``{}`` for no runs."""
    if not runs:
        return {}
    br = [r["bracket_s"] for r in runs]
    out = {"n": len(runs), "bracket_median_s": statistics.median(br), "bracket_max_s": max(br)}
    one = [r["one_sample_s"] for r in runs if "one_sample_s" in r]
    if one:
        out |= {
            "one_sample_median_s": statistics.median(one),
            "one_sample_mean_s": statistics.fmean(one),
            "one_sample_max_s": max(one),
            "one_sample_moved": sum(x > 0 for x in one),
        }
    return out
