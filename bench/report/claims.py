"""The paper's claims beside ours (REPORT.md's last section), and the comparisons made
before the tuning protocol (the appendix): the paper's numbers are cited constants
(:data:`SPEEDUP_CLAIM`, :data:`RECORDS`, :data:`BENCH_CLAIMS`); ours are each
configuration's mean over seeds, never one run picked as the fastest.  Runs compare only
within one experiment, cluster and hardware (:data:`~bench.report.tables.GROUP`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench import methods
from bench.report.commands import CommandMaker, recipe_command
from bench.report.tables import (
    GROUP,
    Inputs,
    config_stats,
    fmt_s,
    num,
    ratio,
    record_of,
    target_text,
    verdict_text,
)
from bench.sweeps.intervals import ci_column

PAPER = (
    "Shi et al., Towards Scalable Distributed Training of Deep Learning on Public Cloud "
    "Clusters, MLSys 2021 (arXiv 2010.10458), abstract"
)
DAWNBENCH = "DAWNBench leaderboard (Stanford), ImageNet and CIFAR-10 training-time tracks"


@dataclass(frozen=True)
class Claim:
    what: str
    value: str
    source: str


SPEEDUP_CLAIM = Claim(
    "faster than the state of the art",
    "25-40 % faster than the state-of-the-art systems of 2020 on CNNs and a Transformer "
    "(16 nodes x 8 V100-32GB, NVLink inside a node, 25 Gbit/s Ethernet between nodes)",
    PAPER,
)
# experiment -> the public records of its task
RECORDS: dict[str, tuple[Claim, ...]] = {
    "dawnbench_imagenet": (
        Claim(
            "DAWNBench ImageNet, ResNet-50 to 93 % top-5",
            "2 min 31 s on 128 V100 (16 x 8), 28 epochs: the paper's record",
            PAPER + "; the time as reported in later public accounts of the record",
        ),
        Claim(
            "previous DAWNBench ImageNet record",
            "2 min 38 s on 128 V100, Alibaba Cloud, March 2020",
            DAWNBENCH,
        ),
        Claim(
            "ImageNet on one machine",
            "93.2 % top-5 after 40 epochs in 35.6 min on 8 A100",
            "FFCV (Leclerc et al., 2022), published ResNet-50 configurations",
        ),
    ),
    "dawnbench_cifar10": (
        Claim(
            "DAWNBench CIFAR-10 to 94 %", "74 s on one V100 (ResNet-9)", DAWNBENCH + ", Myrtle.ai"
        ),
        Claim("DAWNBench CIFAR-10 to 94 %, best entry", "9.4 s on 8 V100", DAWNBENCH),
        Claim("CIFAR-10 to 94 % today", "3.29 s on one A100", "airbench94 (Jordan, 2024)"),
    ),
}
# the benchmarks' subjects: what the paper says of each (no number is known for two)
BENCH_CLAIMS = {
    "topk": Claim(
        "top-k selection: the paper's MSTopK threshold search and this project's exact "
        "variant (tiled), each against torch.topk",
        "GPU top-k is sort-based and slow for tens of millions of elements; MSTopK replaces it "
        "with a few streaming threshold passes (no timing known to us)",
        PAPER,
    ),
    "update": Claim(
        "parallel optimizer update",
        "a parallel tensor operator speeds up the update over a CNN's many small tensors "
        "(no number known to us)",
        PAPER,
    ),
    "input": Claim(
        "multi-level data cache",
        "remote storage -> local SSD -> memory -> pre-decoded images (no number known to us)",
        PAPER,
    ),
}


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


def _same_setup(g: pd.DataFrame, row: pd.Series) -> pd.DataFrame:
    return g[(g["cache"] == row["cache"]) & (g["update"] == row["update"])]


def strongest_peer(g: pd.DataFrame, row: pd.Series) -> pd.Series | None:
    """The peer of ``row``'s cache and update with the shortest mean time to target; a
    peer that never reached it only when no peer did."""
    p = _same_setup(g, row)
    p = p[p["comm_name"].isin(methods.peers())]
    if p.empty:
        return None
    reached = p[p["n_reached"] > 0]
    return (reached if not reached.empty else p).sort_values("tt_mean", na_position="last").iloc[0]


def _baseline(g: pd.DataFrame, row: pd.Series) -> pd.Series | None:
    d = _same_setup(g, row)
    d = d[d["comm_name"] == methods.baseline()]
    return d.iloc[0] if not d.empty else None


def group_table(g: pd.DataFrame) -> list[str]:
    """Markdown rows: each configuration of one group, with its comparisons for ours."""
    priced = "cost" in g and bool(g["cost"].fillna("").astype(bool).any())
    base = methods.baseline()
    lines = [
        f"| comm | cache | update | time to target (mean +- std over seeds) | vs {base} DDP "
        "| vs strongest peer |" + (" cost to target (mean, USD) |" if priced else ""),
        "| --- | --- | --- | --- | --- | --- |" + (" --- |" if priced else ""),
    ]
    for _, r in g.sort_values(["comm_name", "comm"]).iterrows():
        vs_d = vs_p = ""
        if r["comm_name"] in methods.paper():
            vs_d = sooner_text(_baseline(g, r), r, base)
            peer = strongest_peer(g, r)
            vs_p = sooner_text(peer, r, "peer") + (f" ({peer['comm']})" if peer is not None else "")
        cost = f" {r['cost'] or 'not recorded'} |" if priced else ""
        lines.append(
            f"| {r['comm']} | {r['cache']} | {r['update']} | {tt_text(r)} | {vs_d} | {vs_p} |"
            + cost
        )
    return lines


def wanted() -> list[str]:
    """The methods a full comparison of one group needs: the default methods a comm hook
    runs (the group's other settings kept)."""
    return [s.name for s in methods.specs(kind="hook") if s.default]


def missing_commands(inputs: Inputs, g: pd.DataFrame, maker: CommandMaker) -> list[str]:
    """The command of each :func:`wanted` method this group lacks, made from one of its
    recorded runs (its cluster and recipe)."""
    ids = set(sum(g["run_ids"], []))
    example = next(r for r in inputs.records if r.get("run_id") in ids)
    if (num(example.get("world_size")) or 1) < 2:
        return []  # one worker: no gradient is communicated, no method to compare
    out = []
    for name in (m for m in wanted() if m not in set(g["comm_name"])):
        spec, cmd = methods.get(name), maker.command_with(example, name)
        if (num(example.get("nnodes")) or 1) < spec.min_nodes and "cluster.nnodes=" not in cmd:
            cmd = " ".join([cmd, *spec.one_node])
        out.append(f"- {name}: `{cmd}`")
    return out


def comparison_section(inputs: Inputs, maker: CommandMaker) -> list[str]:
    """Per experiment, cluster and hardware: the configurations, the paper's methods
    against dense and the strongest peer, and the commands of the missing runs."""
    stats = config_stats(inputs.runs)
    if stats.empty:
        return ["No run trained to an outcome (every record is an error or interrupted run).", ""]
    out = []
    for exp in sorted(stats["experiment"].unique()):
        out += [f"#### {exp}", ""]
        for (_, cluster, hw), g in stats[stats["experiment"] == exp].groupby(GROUP, sort=True):
            first = inputs.runs[inputs.runs["run_id"] == g["run_ids"].iloc[0][0]].iloc[0]
            out += [f"##### {exp}: {cluster} on {hw}", ""]
            out += [f"Target: {target_text(first['metric'], first['target'])}.", ""]
            out += group_table(g) + [""]
            miss = missing_commands(inputs, g, maker)
            if miss:
                out += ["Missing from this comparison; to run:", "", *miss, ""]
        out += [
            "The whole comparison over seeds (crossed with the ablation's cache and update "
            "modes, on its own cluster): `python -m reproduce ablation --grid --experiment "
            f"{exp} --comm {','.join(wanted())} --seeds 3`.",
            "",
        ]
    return out


def _saved(key: tuple, o: pd.Series, p: pd.Series, vs_baseline: bool) -> tuple[str, str, str]:
    """One row of :func:`earlier_section`: ``o``'s time saved against ``p``."""
    pct = 100 * (p["tt_mean"] - o["tt_mean"]) / p["tt_mean"]
    where = f"{key[1]}, update {key[4]}" if vs_baseline else key[1]
    text = f"{key[0]} ({where}): {o['comm']} {o['tt_mean']:.1f} s vs {p['comm']} "
    text += f"{p['tt_mean']:.1f} s{' to target' if vs_baseline else ''}: {pct:+.0f} % time saved"
    if vs_baseline:
        text += f" ({o['n_reached']}/{o['n_runs']} and {p['n_reached']}/{p['n_runs']} runs reached)"
    return text, key[2], " ".join(o["run_ids"] + p["run_ids"])


def earlier_section(inputs: Inputs) -> list[str]:
    """The comparisons made before the tuning protocol: the paper's methods against the
    strongest peer and against dense of the same group, cache and update, as recorded."""
    stats = config_stats(inputs.runs)
    vs_peer, vs_dense = [], []
    for key, g in [] if stats.empty else stats.groupby([*GROUP, "cache", "update"]):
        reached = g[g["n_reached"] > 0]
        peers = reached[reached["comm_name"].isin(methods.peers())].sort_values("tt_mean")
        dense = reached[reached["comm_name"] == methods.baseline()]
        for _, o in reached[reached["comm_name"].isin(methods.paper())].iterrows():
            if len(peers):
                vs_peer.append(_saved(key, o, peers.iloc[0], False))
            if len(dense):  # one baseline configuration per group
                vs_dense.append(_saved(key, o, dense.iloc[0], True))
    rows = vs_peer + vs_dense
    if not rows:
        return []
    out = [
        "Made before the tuning protocol: the sparse methods' schedule was chosen on the seeds "
        "that then measured it and PowerSGD was not tuned, so these are not the answer; kept "
        "as recorded.",
        "",
        "| ours (measured) | hardware | runs |",
        "| --- | --- | --- |",
    ]
    return out + [f"| {t} | {hw} | {ids} |" for t, hw, ids in rows] + [""]


def _protocol_claim_rows(
    tables: dict[str, Path], hardware: dict[str, str]
) -> list[tuple[str, str, str]]:
    """(our number, hardware, source) per paper method of each protocol sweep, against the
    best-tuned peer with its interval and verdict (``hardware``: run id -> hardware)."""
    out = []
    for exp, t in sorted(tables.items()):
        df = pd.read_csv(t)
        ids = str(df["run_ids"].dropna().iloc[0]).replace(",", " ").split() if len(df) else []
        hw = hardware.get(ids[0], "-") if ids else "-"
        df = df[df["comm"].isin(methods.paper())]
        for (_, r), p in zip(df.iterrows(), ci_column(df, "speedup_vs_peer", 2, "x"), strict=True):
            vp = verdict_text(r["verdict_vs_peer"], int(r["n_runs"]))
            text = f"{exp}: {r['comm']} `{r['trial']}` vs the best-tuned peer {r['best_peer']}"
            out.append((f"{text}: {p}, {vp} (see the answer above)", hw, f"sweep `{t.stem}`"))
    return out


def _time_rows(inputs: Inputs, maker: CommandMaker, row) -> None:
    """Per experiment: the public records of its task beside our best configuration per
    hardware (its mean time to target over the runs that reached it, n of n)."""
    stats = config_stats(inputs.runs)
    best = stats[stats["n_reached"] > 0] if not stats.empty else stats
    if not best.empty:  # a mean over seeds, never one run picked as the fastest
        best = best.sort_values("tt_mean").groupby(["experiment", "hardware"]).head(1)
    for exp in sorted(set(RECORDS) | set(inputs.runs["experiment"])):
        claims = RECORDS.get(exp, ())
        cited = "; ".join(f"{k.what}: {k.value} [{k.source}]" for k in claims)
        cited = cited or "no public record (a stand-in task of this project)"
        mine = best[best["experiment"] == exp] if not best.empty else best
        if mine.empty:
            what = "not run, or no run reached the target"
            row(f"time to target, {exp}", cited, what, "-", recipe_command(exp))
        for _, r in mine.iterrows():
            runs = inputs.runs[inputs.runs["run_id"].isin(r["run_ids"])]
            target = target_text(runs["metric"].iloc[0], runs["target"].iloc[0])
            what = (
                f"{fmt_s(r['tt_mean'])} to {target}, mean of {r['n_reached']} of {r['n_runs']} "
                f"run(s) that reached it ({r['comm']}, {r['cluster']}; runs "
                f"{' '.join(r['run_ids'])})"
            )
            cmd = maker.command(record_of(inputs, r["run_ids"][0]))
            row(f"time to target, {exp}", cited, what, r["hardware"], f"`{cmd}`")


def headline_section(
    inputs: Inputs, maker: CommandMaker, bench_rows: dict, tables: dict[str, Path]
) -> list[str]:
    """Rows: what the paper or a public record says (cited once per claim), our number, the
    hardware it came from and the command that made it."""
    lines = [
        "| claim | the paper / public record (cited, not measured here) | ours (measured) "
        "| hardware | command |",
        "| --- | --- | --- | --- | --- |",
    ]
    last = [""]

    def row(what: str, cited: str, ours: str, hw: str, cmd: str) -> None:
        shown = "as above" if cited == last[0] else cited  # cited once per run of rows
        last[0] = cited
        lines.append(f"| {what} | {shown} | {ours} | {hw} | {cmd} |")

    c = SPEEDUP_CLAIM
    cited = f"{c.value} [{c.source}]"
    hardware = dict(zip(inputs.runs["run_id"], inputs.runs["hardware"], strict=True))
    ours = _protocol_claim_rows(tables, hardware)
    if not ours:
        none = (
            "no protocol sweep recorded: `python -m reproduce ablation` runs one (earlier, "
            "unequally tuned comparisons are in the appendix)"
        )
        row(c.what, cited, none, "-", "-")
    for text, hw, ids in ours:
        row(c.what, cited, text, hw, ids)
    _time_rows(inputs, maker, row)
    for name, claim in BENCH_CLAIMS.items():
        cited = f"{claim.value} [{claim.source}]"
        cmd = f"`python -m reproduce bench {name}`"
        seen: set[str] = set()
        for hw, text in bench_rows.get(name, []):
            if hw not in seen:  # the first headline per hardware; the rest in its section
                seen.add(hw)
                row(claim.what, cited, f"{text}; more under Micro-benchmarks", hw, cmd)
        if not bench_rows.get(name):
            row(claim.what, cited, f"no rows in bench/{name}.csv", "-", cmd)
    return lines
