"""The measured clusters of a protocol sweep in the report: the model's prediction beside
each measured time to target, and whether steps to target carry over from 2 nodes to 8."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench import methods
from bench.sweeps.intervals import ci_text


def and_list(xs: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return xs[0] if len(xs) == 1 else f"{', '.join(xs[:-1])} and {xs[-1]}"


def measured_table(table: Path) -> pd.DataFrame | None:
    """The sweep's prediction-and-measurement table (``<sweep_id>-measured.csv``), if any."""
    path = table.with_name(f"{table.stem}-measured.csv")
    return pd.read_csv(path) if path.is_file() else None


def model_speedups(m: pd.DataFrame | None) -> dict[tuple[str, str], float]:
    """(measured cluster, method) -> the model's predicted speedup over the baseline there."""
    if m is None:
        return {}
    pred = {(str(r.cluster), str(r.comm)): float(r.predicted_s) for r in m.itertuples()}
    base = methods.baseline()
    return {
        (c, x): pred[(c, base)] / t for (c, x), t in pred.items() if (c, base) in pred and t > 0
    }


def prediction_lines(m: pd.DataFrame | None, stem: str) -> list[str]:
    """The model's prediction of each measured cluster (made before its runs) beside the
    measured time to target, per method, and the error's median size per cluster."""
    if m is None or m.empty:
        return []
    out = [
        "The model's prediction of each measured cluster, made before its evaluation runs "
        "(each tuning run's steps x the modelled step on that link, the median over the "
        "tuning seeds), and the measured time to target (median [95 % interval]):",
        "",
        "| measured at | method | predicted | measured | error |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in m.itertuples():
        got = ci_text(r.measured_median_s, r.measured_ci_low_s, r.measured_ci_high_s, 1, " s")
        if (other := getattr(r, "n_other_kind", 0)) and other == other:  # older: none
            got += f" ({r.n_runs} runs; {int(other)} on another CPU kind kept out)"
        err = f"{100 * r.prediction_error:+.0f} %"
        out.append(f"| {r.target_ratio:.2f} | {r.comm} | {r.predicted_s:.1f} s | {got} | {err} |")
    size = m.assign(e=m["prediction_error"].abs()).groupby("target_ratio", sort=False)["e"]
    each = [f"{100 * e:.0f} % at {t:.2f}" for t, e in size.median().items()]
    files = f"`{stem}-prediction.csv`, `{stem}-measured.csv`"
    return [*out, "", f"Median size of the error over the methods: {and_list(each)} ({files}).", ""]


def carryover_lines(table: Path, stem: str) -> list[str]:
    """Steps to target at 8 x 2 against 2 x 2 (per-worker batch held), and what it changed."""
    path = table.with_name(f"{table.stem}-carryover.csv")
    if not path.is_file():
        return []
    c, base = pd.read_csv(path), methods.baseline()
    out = [
        "Do steps to target carry over from 2 nodes to 8 (2 workers each, the per-worker batch "
        "held)? The ratio of steps, 8 nodes over 2, paired by seed [95 % interval], and that "
        f"ratio over {base}'s:",
        "",
        f"| method | trial | steps, 2 x 2 | steps, 8 x 2 | ratio | vs {base}'s | projections use |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in c.itertuples():
        if r.steps_8_nodes != r.steps_8_nodes:  # not covered: no 8-node runs
            out.append(f"| {r.comm} | `{r.trial}` | not run at 8 nodes | | | | 2-node steps |")
            continue
        out.append(
            f"| {r.comm} | `{r.trial}` | {r.steps_2_nodes:.1f} | {r.steps_8_nodes:.1f} | "
            f"{ci_text(r.ratio, r.ratio_ci_low, r.ratio_ci_high, 2, 'x')} | "
            f"{ci_text(r.vs_dense, r.vs_dense_ci_low, r.vs_dense_ci_high, 2, 'x')} | "
            f"{f'2-node steps x {r.vs_dense:.2f}' if r.use_8_node_steps else '2-node steps'} |"
        )
    moved = sorted(set(c.loc[c["use_8_node_steps"].astype(bool), "comm"]))
    what = (
        f"{and_list(moved)} differ from {base}'s ratio by more than 15 %, so their projected "
        f"times are their 2-node runs' times x that factor (its interval widens the band), "
        f"against {base}'s at 2 nodes; every other method keeps its 2-node steps"
        if moved
        else f"every method's ratio is within 15 % of {base}'s, so the projections keep the "
        "steps measured at 2 nodes"
    )
    return [*out, "", f"What it changed: {what} (`{stem}-carryover.csv`).", ""]
