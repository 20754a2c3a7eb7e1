"""The report's comparisons: how much sooner the paper's methods reach the target than
dense DDP and than the strongest peer, per experiment, cluster and hardware; and what to
run where a comparison lacks its runs."""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from bench.report.figures import target_text
from bench.report.figures_data import GROUP, OURS, PEERS, Inputs, config_stats, num, ratio
from bench.report.report_commands import CONF_DIR, CommandMaker, known_experiments

WANTED = ("dense", *OURS, "fp16", "powersgd")  # the runs a full comparison needs per group


def fmt_s(x: Any) -> str:
    v = num(x)
    return "-" if v is None else f"{v:,.1f} s"


def tt_text(row: pd.Series) -> str:
    """``12.3 +- 0.4 s (3/3 reached)``."""
    reached = f"{row['n_reached']}/{row['n_runs']} reached"
    if not row["n_reached"]:
        return f"target missed ({reached})"
    sd = f" +- {row['tt_std']:.1f}" if row["n_reached"] > 1 else ""
    return f"{row['tt_mean']:,.1f}{sd} s ({reached})"


def sooner_text(base: pd.Series | None, row: pd.Series, name: str) -> str:
    """``5.1 s sooner (25 %), 1.33x +- 0.05`` against ``base`` (None: no such run)."""
    if base is None:
        return f"no {name} run"
    s, sd = ratio(base, row)
    if s is None:
        return f"{name} {tt_text(base)}" if not base["n_reached"] else "target missed"
    delta = base["tt_mean"] - row["tt_mean"]
    word = "sooner" if delta >= 0 else "later"
    spread = f" +- {sd:.2f}" if sd else ""
    return (
        f"{abs(delta):,.1f} s {word} ({100 * abs(delta) / base['tt_mean']:.0f} %), {s:.2f}x{spread}"
    )


def strongest_peer(g: pd.DataFrame, row: pd.Series) -> pd.Series | None:
    """The peer (fp16, bf16, PowerSGD) of ``row``'s cache and update with the shortest mean
    time to target; a peer that never reached it only when no peer did."""
    p = g[
        g["comm_name"].isin(PEERS) & (g["cache"] == row["cache"]) & (g["update"] == row["update"])
    ]
    if p.empty:
        return None
    reached = p[p["n_reached"] > 0]
    return (reached if not reached.empty else p).sort_values("tt_mean", na_position="last").iloc[0]


def _dense(g: pd.DataFrame, row: pd.Series) -> pd.Series | None:
    d = g[
        (g["comm_name"] == "dense") & (g["cache"] == row["cache"]) & (g["update"] == row["update"])
    ]
    return d.iloc[0] if not d.empty else None


def group_table(g: pd.DataFrame) -> list[str]:
    """Markdown rows: each configuration of one group, with its comparisons for ours."""
    lines = [
        "| comm | cache | update | time to target (mean +- std over seeds) | vs dense DDP "
        "| vs strongest peer |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for _, r in g.sort_values(["comm_name", "comm"]).iterrows():
        vs_d = vs_p = ""
        if r["comm_name"] in OURS:
            vs_d = sooner_text(_dense(g, r), r, "dense")
            peer = strongest_peer(g, r)
            vs_p = sooner_text(peer, r, "fp16 / PowerSGD") + (
                f" ({peer['comm']})" if peer is not None else ""
            )
        lines.append(
            f"| {r['comm']} | {r['cache']} | {r['update']} | {tt_text(r)} | {vs_d} | {vs_p} |"
        )
    return lines


def missing_commands(inputs: Inputs, g: pd.DataFrame, maker: CommandMaker) -> list[str]:
    """The command of each of dense, hitopk, mstopk, fp16 and PowerSGD this group lacks,
    made from one of its recorded runs (its cluster and recipe)."""
    have = set(g["comm_name"])
    ids = set(sum(g["run_ids"], []))
    example = next(r for r in inputs.records if r.get("run_id") in ids)
    if (num(example.get("world_size")) or 1) < 2:
        return []  # one worker: no gradient is communicated, no method to compare
    out = []
    for comm in WANTED:
        if comm in have:
            continue
        cmd = maker.command_with(example, comm)
        if (
            comm == "hitopk"
            and (num(example.get("nnodes")) or 1) < 2
            and "cluster.nnodes=" not in cmd
        ):
            cmd += " comm.procs_per_node=1"  # one node: each worker counts as a node
        out.append(f"- {comm}: `{cmd}`")
    return out


def comparison_section(inputs: Inputs, maker: CommandMaker) -> list[str]:
    """Per experiment, cluster and hardware: the configurations, the paper's methods
    against dense and the strongest peer, and the commands of the missing runs."""
    stats = config_stats(inputs.runs)
    out = []
    if stats.empty:
        return ["No run trained to an outcome (every record is an error or interrupted run).", ""]
    for exp in sorted(stats["experiment"].unique()):
        out += [f"#### {exp}", ""]
        out += _experiment_comparisons(inputs, stats[stats["experiment"] == exp], maker)
        methods = ",".join(WANTED)
        out += [
            "The whole comparison over seeds (crossed with the ablation's cache and update "
            "modes, on its own cluster): "
            f"`python -m reproduce ablation --grid --experiment {exp} --comm {methods} --seeds 3`.",
            "",
        ]
    return out


def _experiment_comparisons(inputs: Inputs, stats: pd.DataFrame, maker: CommandMaker) -> list[str]:
    out: list[str] = []
    for (exp, cluster, hw), g in stats.groupby(GROUP, sort=True):
        first = inputs.runs[inputs.runs["run_id"] == g["run_ids"].iloc[0][0]].iloc[0]
        out += [f"##### {exp}: {cluster} on {hw}", ""]
        out += [f"Target: {target_text(first['metric'], first['target'])}.", ""]
        out += group_table(g) + [""]
        miss = missing_commands(inputs, g, maker)
        if miss:
            out += ["Missing from this comparison; to run:", "", *miss, ""]
    return out


def recipe_command(exp: str) -> str:
    """The ``to run:`` comment of a recipe's config file, as Markdown: the command (its
    continuation lines joined) in backticks, then any words before it."""
    path = CONF_DIR / "experiment" / f"{exp}.yaml"
    lines = path.read_text().splitlines() if path.is_file() else []
    start = next((i for i, ln in enumerate(lines) if re.match(r"#\s*to run:", ln)), None)
    if start is None:
        return f"`python -m reproduce train experiment={exp}`"
    text = [re.sub(r"^#\s*(to run:)?\s*", "", ln) for ln in lines[start : start + 6]]
    first = next((i for i, t in enumerate(text) if "python -m reproduce" in t), None)
    if first is None:
        return f"`python -m reproduce train experiment={exp}` ({text[0]})"
    note, _, cmd = text[first].partition("python -m reproduce")
    parts = ["python -m reproduce" + cmd]
    for t in text[first + 1 :]:
        if not parts[-1].rstrip().endswith("\\"):
            break
        parts[-1] = parts[-1].rstrip()[:-1].rstrip()
        parts.append(t.strip())
    cmd = " ".join(parts).split("(or:")[0].strip()
    note = (text[0] if first else note).strip(" (")
    return f"`{cmd}`" + (f" ({note})" if note else "")


def unrun_experiments(inputs: Inputs) -> list[str]:
    ran = set(inputs.runs["experiment"])
    return [f"- {e}: {recipe_command(e)}" for e in known_experiments() if e not in ran]
