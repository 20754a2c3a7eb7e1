"""REPORT.md's section on the tuning-protocol sweeps (``bench.sweeps.protocol``): each
sweep's evaluation table with its 95 % intervals and verdicts, and its tuning trials.

A protocol sweep is a ``results/ablation/<sweep_id>.csv`` beside a
``<sweep_id>.plan.json``; its trials are ``<sweep_id>-tuning.csv``.  The other CSVs of
``results/ablation/`` are the comm x cache x update grid's and stay in the ablation
section.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

TUNING_SUFFIX = "-tuning"


def is_protocol(path: Path) -> bool:
    """Whether ``path`` is a protocol sweep's table or its tuning table."""
    stem = path.stem.removesuffix(TUNING_SUFFIX)
    return (path.parent / f"{stem}.plan.json").exists()


def _ci(m: float, lo: float, hi: float, digits: int) -> str:
    if m != m:
        return "-"
    if lo != lo:
        return f"{m:.{digits}f} (no interval)"
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _md(df: pd.DataFrame) -> list[str]:
    head = "| " + " | ".join(df.columns) + " |"
    rule = "| " + " | ".join("---" for _ in df.columns) + " |"
    return [head, rule, *("| " + " | ".join(str(v) for v in r) + " |" for r in df.values)]


def protocol_section(paths: list[Path], base: Path) -> list[str]:
    """Markdown lines: every protocol sweep among ``paths`` (none: a line saying how)."""
    tables = [p for p in paths if is_protocol(p) and not p.stem.endswith(TUNING_SUFFIX)]
    if not tables:
        return ["No protocol sweep yet: `python -m reproduce ablation` runs one.", ""]
    out = [
        "Each method's configuration was chosen on tuning seeds by the protocol's fixed rule "
        "(lowest median time to target, misses at the budget), then trained on fresh "
        "evaluation seeds.  Times are means over the evaluation seeds with a miss counted at "
        "the budget; brackets are 95 % bootstrap intervals over seeds; a ratio is a win only "
        "when its interval excludes 1.0.",
        "",
    ]
    for p in tables:
        df = pd.read_csv(p)
        rel = p.relative_to(base) if p.is_relative_to(base) else p
        show = pd.DataFrame(
            {
                "experiment": df["experiment"],
                "comm": df["comm"],
                "trial": df["trial"],
                "reached": [f"{a}/{b}" for a, b in zip(df["n_reached"], df["n_runs"])],
                "time to target, s": [
                    _ci(*v, 1)
                    for v in zip(
                        df["time_to_target_mean_s"],
                        df["time_to_target_ci_low_s"],
                        df["time_to_target_ci_high_s"],
                    )
                ],
                "vs dense": [
                    _ci(*v, 2)
                    for v in zip(
                        df["speedup_vs_dense"],
                        df["speedup_vs_dense_ci_low"],
                        df["speedup_vs_dense_ci_high"],
                    )
                ],
                "verdict vs dense": df["verdict_vs_dense"],
                "best peer": df["best_peer"],
                "vs best peer": [
                    _ci(*v, 2)
                    for v in zip(
                        df["speedup_vs_peer"],
                        df["speedup_vs_peer_ci_low"],
                        df["speedup_vs_peer_ci_high"],
                    )
                ],
                "verdict vs peer": df["verdict_vs_peer"],
            }
        )
        out += [f"From `{rel}` ({len(df)} configurations):", "", *_md(show), ""]
        tuning = p.with_name(f"{p.stem}{TUNING_SUFFIX}.csv")
        if tuning.exists():
            t = pd.read_csv(tuning)
            cols = ["comm", "trial", "overrides", "n_runs", "n_reached", "median_time_s"]
            t = t[[*cols, "selected"]].astype(object).where(t.notna(), "")
            out += [f"Its tuning trials (`{tuning.name}`):", "", *_md(t), ""]
    return out
