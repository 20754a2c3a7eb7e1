"""Intervals over seeds: misses counted at the budget, a percentile bootstrap of the mean
time, Welch's t on log times for a speedup, and the tie rule (:func:`leaders`).  Why:
docs/internals/report.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
N_RESAMPLES = 9999
RNG_SEED = 0  # the bootstrap's generator: a table rebuilt from the same records is the same


def budget_s(records: Sequence[Mapping[str, Any]]) -> float:
    """The longest training time (or time to target) of ``records``, s; NaN for none."""
    vals = [
        float(v)
        for r in records
        for v in (r.get("train_time_s"), r.get("time_to_target_s"))
        if v is not None
    ]
    return max(vals) if vals else math.nan


def censored_time(rec: Mapping[str, Any], budget: float) -> float:
    """A run's time to target in s, or ``budget`` when it missed the target."""
    t = rec.get("time_to_target_s")
    return float(t) if t is not None else float(budget)


def mean_interval(x: Sequence[float], stat: Callable = np.mean) -> tuple[float, float, float]:
    """(``stat`` of ``x``, low, high): its 95 % percentile-bootstrap interval (seeded); NaN
    bounds below 2 values."""
    a = np.asarray(x, dtype=float)
    if a.size == 0:
        return math.nan, math.nan, math.nan
    m = float(stat(a))
    if a.size < 2:
        return m, math.nan, math.nan
    if np.all(a == a[0]):  # every resample gives the same
        return m, m, m
    res = stats.bootstrap(
        (a,),
        stat,
        confidence_level=CONFIDENCE,
        n_resamples=N_RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(RNG_SEED),
    )
    ci = res.confidence_interval
    return m, float(ci.low), float(ci.high)


def verdict(low: float, high: float, n: int) -> str:
    """``faster`` / ``slower`` when the ratio's interval excludes 1.0."""
    if low == low and high == high:  # not NaN
        if low > 1.0:
            return "faster"
        if high < 1.0:
            return "slower"
    return f"no difference measurable at n = {n}"


def ci_text(m: Any, lo: Any, hi: Any, d: int = 2, unit: str = "", plain: bool = False) -> str:
    """``1.23x [1.10, 1.40]``: a bound that would print as 1.00 gets one more digit, and a
    missing interval is said (``plain``: neither, as the sweeps print their tables)."""
    m, lo, hi = (float(x) if x is not None else math.nan for x in (m, lo, hi))
    if m != m:
        return "-"
    if lo != lo:
        return f"{m:.{d}f}" if plain else f"{m:.{d}f}{unit} (no interval)"
    if not plain and any(round(b, d) == 1.0 and b != 1.0 for b in (lo, hi)):
        d += 1
    return f"{m:.{d}f}{unit} [{lo:.{d}f}, {hi:.{d}f}]"


def ci_column(df: Any, key: str, d: int, unit: str = "", plain: bool = False) -> list[str]:
    """:func:`ci_text` of a protocol table's column ``key`` with its interval columns."""
    lo, hi = f"{key}_ci_low", f"{key}_ci_high"
    if key == "time_to_target":
        key, lo, hi = f"{key}_mean_s", f"{key}_ci_low_s", f"{key}_ci_high_s"
    return [ci_text(*v, d, unit, plain) for v in zip(df[key], df[lo], df[hi], strict=True)]


def log_t_interval(ref: Sequence[float], other: Sequence[float]) -> tuple[float, float, float]:
    """(geometric-mean ratio ref / other, low, high): Welch's unpaired t interval on the
    difference of mean log times, exponentiated; NaN bounds below 2 values on either side."""
    a, b = np.log(np.asarray(ref, dtype=float)), np.log(np.asarray(other, dtype=float))
    if a.size == 0 or b.size == 0:
        return math.nan, math.nan, math.nan
    r = float(math.exp(a.mean() - b.mean()))
    if a.size < 2 or b.size < 2:
        return r, math.nan, math.nan
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    if se == 0:
        return r, r, r
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    q = float(stats.t.ppf(0.5 + CONFIDENCE / 2, df))
    d = a.mean() - b.mean()
    return r, float(math.exp(d - q * se)), float(math.exp(d + q * se))


def log_mean_interval(x: Sequence[float]) -> tuple[float, float, float]:
    """(geometric mean, low, high): Student's t interval on the mean log of ``x``,
    exponentiated; NaN bounds below 2 values."""
    a = np.log(np.asarray(x, dtype=float))
    if a.size == 0:
        return math.nan, math.nan, math.nan
    m = float(math.exp(a.mean()))
    if a.size < 2:
        return m, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, a.size - 1)) * a.std(ddof=1) / math.sqrt(a.size)
    return m, float(math.exp(a.mean() - half)), float(math.exp(a.mean() + half))


def seed_correlation(a: Mapping[int, float], b: Mapping[int, float]) -> float:
    """Pearson's correlation of log times over the seeds both ran (NaN below 3)."""
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 3:
        return math.nan
    x = np.log([a[s] for s in seeds])
    y = np.log([b[s] for s in seeds])
    if np.all(x == x[0]) or np.all(y == y[0]):
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])


@dataclass(frozen=True)
class Leaders:
    """Who is first at one cluster: ``first`` where every slower method is told apart from
    the fastest, else None; ``tied``: the fastest and those not told apart, fastest first;
    ``vs``: each other's (speedup, seed interval low, high, band low, band high)."""

    first: str | None
    tied: tuple[str, ...]
    vs: dict[str, tuple[float, float, float, float, float]]

    def text(self) -> str:
        if self.first:
            return f"first {self.first}"
        return f"tied: {', '.join(self.tied)}" if self.tied else "-"


def leaders(rows: Sequence[Mapping[str, Any]]) -> Leaders:
    """The tie rule at one cluster.  Each row: ``method``, ``times`` (s per seed) and, for a
    projected cluster, ``corners`` (the same per assumption corner).  A method is told apart
    from the fastest only where :func:`log_t_interval` lies above 1 under the seed interval
    and at every corner given."""
    rows = [r for r in rows if len(r["times"])]
    if not rows:
        return Leaders(None, (), {})
    rows = sorted(rows, key=lambda r: float(np.mean(r["times"])))
    best, vs, tied = rows[0], {}, [str(rows[0]["method"])]
    for r in rows[1:]:
        sets = list(zip([r["times"], *r.get("corners", ())],
                        [best["times"], *best.get("corners", ())], strict=True))  # fmt: skip
        per = [log_t_interval(mine, theirs) for mine, theirs in sets]
        lows = [lo for _, lo, _ in per]
        band = (min(lows), max(hi for *_, hi in per)) if len(per) > 1 else (math.nan, math.nan)
        vs[str(r["method"])] = (per[0][0], per[0][1], per[0][2], *band)
        if not all(lo > 1.0 for lo in lows):  # NaN (under 2 seeds) is no evidence either
            tied.append(str(r["method"]))
    return Leaders(tied[0] if len(tied) == 1 else None, tuple(tied), vs)
