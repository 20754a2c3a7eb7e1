"""Any two of a protocol sweep's tuned configurations compared, per column of its table:
each method's time to target per evaluation seed (measured, or composed with the model's
time per step at every corner of its assumptions), the interval of a pair and its band."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.results.records import load_curve
from bench.sweeps import intervals as iv
from bench.sweeps import ratios
from bench.sweeps.protocol import EVAL, TUNE

BUDGET = (TUNE, EVAL)  # the roles whose runs set the time a miss counts at


@dataclass(frozen=True)
class Versus:
    """``other``'s speedup over ``ref`` (> 1: sooner): the 95 % Welch interval over seeds, and
    its band over the model's assumption corners (the interval itself where measured)."""

    speedup: float
    low: float
    high: float
    band_low: float
    band_high: float
    measured: bool

    @property
    def verdict(self) -> str:
        """``faster`` / ``slower`` where the interval and the band both exclude 1, else ``tie``."""
        if self.low > 1 and self.band_low > 1:
            return "faster"
        if self.high < 1 and self.band_high < 1:
            return "slower"
        return "tie"

    def text(self) -> str:
        """``1.23x [1.10, 1.40]``, and ``band [1.02, 1.61]`` where projected."""
        out = iv.ci_text(self.speedup, self.low, self.high, 2, "x")
        if not self.measured and self.band_low == self.band_low:
            out += f" band [{self.band_low:.2f}, {self.band_high:.2f}]"
        return out


@dataclass
class Column:
    """One column of a sweep's answer: its ratio (NaN: measured) and per method the seeds'
    times, a list per corner of the assumptions and of the steps factor's interval (the
    central ones first)."""

    cluster: str
    ratio: float
    times: dict[str, list[list[float]]]

    @property
    def measured(self) -> bool:
        return self.ratio != self.ratio

    def mean(self, comm: str) -> float:
        return float(np.mean(self.times[comm][0]))

    def versus(self, ref: str, other: str) -> Versus:
        per = [iv.log_t_interval(a, b) for a, b in zip(self.times[ref], self.times[other])]
        r, lo, hi = per[0]
        lows = [x[1] for x in per if x[1] == x[1]]
        highs = [x[2] for x in per if x[2] == x[2]]
        return Versus(
            r, lo, hi, min(lows, default=math.nan), max(highs, default=math.nan), self.measured
        )

    def order(self) -> list[str]:
        """The methods by mean time to target, the first first."""
        return sorted(self.times, key=self.mean)

    def tied_first(self) -> list[str]:
        """The first to the target and every method tied with it
        (:func:`bench.sweeps.intervals.leaders`), in their order."""
        rows = [{"method": m, "times": t[0], "corners": t[1:]} for m, t in self.times.items()]
        return list(iv.leaders(rows).tied)

    def fastest(self, among: Sequence[str]) -> str | None:
        """Of ``among``, the method with the lowest mean time here (None: none ran)."""
        return next((m for m in self.order() if m in among), None)


def sweep_records(records: Sequence[Mapping[str, Any]], sweep: str) -> list[Mapping[str, Any]]:
    return [
        r
        for r in records
        if ((r.get("config") or {}).get("results") or {}).get("sweep_id") == sweep
    ]


def _factors(row: Mapping[str, Any]) -> tuple[float, float, float]:
    """A projected row's steps factor (the 8-node carry-over against dense's), then its
    interval's ends; 1 where the table has none (an older table, or steps that carry over)."""
    got = [row.get(k) for k in ("steps_factor", "steps_factor_ci_low", "steps_factor_ci_high")]
    vals = [float(v) for v in got if v is not None and v == v]
    return (vals[0], vals[1], vals[2]) if len(vals) == 3 else (1.0, 1.0, 1.0)


def columns(results_dir: Path, table: pd.DataFrame, records: Sequence[Mapping]) -> list[Column]:
    """The columns of a protocol table from the runs it counts: measured, the run's clock (a
    miss: the sweep's budget); projected, its logged steps x the model's step time."""
    by_id = {str(r.get("run_id")): r for r in records}
    mine = sweep_records(records, str(table["sweep_id"].iloc[0]))
    # a miss counts at the longest tuning or evaluation run, as in the sweep's own table
    budget = iv.budget_s([r for r in mine if (r.get("protocol") or {}).get("role") in BUDGET])
    runs: dict[str, Any] = {}  # run id -> its phases (a run serves several columns)

    def run_of(rec: Mapping[str, Any]) -> Any:
        rid = str(rec["run_id"])
        if rid not in runs:
            try:
                runs[rid] = ratios.run_from_record(rec, load_curve(results_dir, rid))
            except FileNotFoundError:
                runs[rid] = None
        return runs[rid]

    out = []
    for cluster, g in table.groupby("for_cluster", sort=False):
        ratio = float(g["ratio"].iloc[0])
        col = Column(str(cluster), ratio, {})
        for _, row in g.iterrows():
            ids = str(row.get("run_ids") or "").replace(",", " ").split()
            recs = [by_id[i] for i in ids if i in by_id]
            recs = [r for r in recs if r.get("status") in ("ok", "target_missed")]
            if col.measured:
                t = [[iv.censored_time(r, budget) for r in recs]]
            else:  # each corner of the model's assumptions x the steps factor's interval
                done = [x for x in map(run_of, recs) if x is not None]
                t = [
                    [ratios.run_time_s(x, ratio, **c) * f for x in done]
                    for c in ratios.corners()
                    for f in _factors(row)
                ]
            if t[0]:
                col.times[str(row["comm"])] = t
        if col.times:
            out.append(col)
    return out
