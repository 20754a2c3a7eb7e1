"""Where top-k sits (docs/algorithms.md, s. 8): a study's steps to target per placement and
density, relative to dense on the same seed, as a table and a figure.

``python -m bench.report.placement SWEEP_ID [--results-dir results]`` writes
``<results>/ablation/<SWEEP_ID>.csv`` and ``<results>/figures/<SWEEP_ID>.png`` (never
replacing either; ``--name`` names them) and prints the table.  A configuration run again on
the same seed counts by its latest record.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from bench import methods
from bench.report.tables import cfg_of
from bench.results import plots
from bench.sweeps.common import sweep_records, write_table

COLUMNS = [
    "experiment", "comm", "placement", "density", "seed", "steps_to_target",
    "dense_steps", "relative", "reached", "steps_run", "run_id", "git_sha",
]  # fmt: skip


def table(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Per sparse run: its steps to target over dense's on the same experiment and seed (a
    miss: NaN, with the steps it ran)."""
    base = methods.baseline()
    latest: dict[tuple, Mapping[str, Any]] = {}
    for r in records:  # in the order recorded: a rerun of a configuration replaces it here
        if r.get("status") in ("ok", "target_missed"):
            key = (r.get("experiment"), r.get("comm"), cfg_of(r, "comm", "placement") or "grad",
                   None if methods.method_of(r) == base else cfg_of(r, "comm", "density"),
                   cfg_of(r, "train", "seed"))  # fmt: skip
            latest[key] = r
    ok = list(latest.values())
    dense = {
        (r["experiment"], cfg_of(r, "train", "seed")): r.get("steps_to_target")
        for r in ok
        if methods.method_of(r) == base
    }
    rows = []
    for r in ok:
        if methods.method_of(r) == base:
            continue
        key = (r["experiment"], cfg_of(r, "train", "seed"))
        d, s = dense.get(key), r.get("steps_to_target")
        rows.append(
            {
                "experiment": r["experiment"],
                "comm": r["comm"],
                "placement": cfg_of(r, "comm", "placement") or "grad",
                "density": float(cfg_of(r, "comm", "density")),
                "seed": key[1],
                "steps_to_target": s,
                "dense_steps": d,
                "relative": s / d if s and d else math.nan,
                "reached": s is not None,
                "steps_run": sum(int(p.get("steps", 0)) for p in r.get("comm_phases") or []),
                "run_id": r["run_id"],
                "git_sha": r.get("git_sha", ""),
            }
        )
    df = pd.DataFrame(rows, columns=COLUMNS)
    return df.sort_values(["experiment", "density", "placement", "seed"], ascending=[1, 0, 1, 1])


def plot(df: pd.DataFrame, path: Path, title: str) -> Path:
    """Per workload: steps to target over dense's, per placement and density (one point per
    seed, a miss drawn at its steps run over dense's with an open marker)."""
    import matplotlib.pyplot as plt

    exps = list(dict.fromkeys(df["experiment"]))
    fig, axes = plt.subplots(1, len(exps), figsize=(plots.fig_width(len(exps), 5.2), 3.6))
    axes = [axes] if len(exps) == 1 else list(axes)
    for ax, exp in zip(axes, exps, strict=True):
        g = df[df["experiment"] == exp]
        cells = list(dict.fromkeys(zip(g["density"], g["placement"])))
        for i, (d, p) in enumerate(cells):
            c = g[(g["density"] == d) & (g["placement"] == p)]
            colour = methods.colour(str(c["comm"].iloc[0]))
            hit = c[c["reached"]]
            miss = c[~c["reached"]]
            ax.scatter([i] * len(hit), hit["relative"], color=colour, zorder=3)
            ax.scatter(
                [i] * len(miss),
                miss["steps_run"] / miss["dense_steps"],
                facecolors="none",
                edgecolors=colour,
                zorder=3,
                label="missed the target (drawn at its steps run)" if len(miss) else None,
            )
        base = methods.baseline()
        ax.axhline(1.0, color=methods.colour(base), lw=1, ls="--", label=base)
        ax.axhline(1.2, color="#999999", lw=0.8, ls=":", label=f"1.2x {base}")
        ax.set_xticks(range(len(cells)), [f"d={d:g}\n{p}" for d, p in cells])
        ax.set_ylabel(f"steps to target / {base}'s (same seed)")
        sent = ", ".join(dict.fromkeys(g["comm"]))
        ax.set_title(f"{exp} ({sent}, n = {g['seed'].nunique()} seed(s))", fontsize=9)
        handles, labels = ax.get_legend_handles_labels()
        keep = dict(zip(labels, handles, strict=True))
        ax.legend(keep.values(), keep.keys(), fontsize=7, loc="lower right", framealpha=1)
        top = max(g["relative"].max(), (g["steps_run"] / g["dense_steps"]).max())
        ax.set_ylim(0, 1.15 * top)
    fig.suptitle(title, fontsize=10)
    return plots.save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.report.placement", description=__doc__)
    ap.add_argument("sweep_id")
    ap.add_argument("--results-dir", default="results")
    ap.add_argument("--name", default="", help="the table's and figure's name (default: the "
                    "sweep id)")  # fmt: skip
    a = ap.parse_args(argv)
    recs = sweep_records(a.results_dir, a.sweep_id)
    if not recs:
        ap.error(f"no records of sweep {a.sweep_id} in {a.results_dir}/runs.jsonl")
    df = table(recs)
    print(df.to_string(index=False))
    base, name = Path(a.results_dir), a.name or a.sweep_id
    write_table(df, base / "ablation" / f"{name}.csv")
    fig = base / "figures" / f"{name}.png"
    if fig.exists():
        print(f"{fig} exists: not replaced")
    else:
        print(plot(df, fig, f"Placement study {a.sweep_id}: steps to target relative to dense"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
