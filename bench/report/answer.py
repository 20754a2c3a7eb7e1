"""REPORT.md, its appendix and README's answer block, from one results directory.

The answer comes first: per workload, the newest tuning-protocol sweep's table (every
method tuned with the same budget, 95 % intervals over evaluation seeds); then its
figures, one table per micro-benchmark topic and the paper's claims beside ours.  The
rest goes to ``REPORT-appendix.md``.  ``python -m bench.report.answer`` copies the answer
section into README.md, so that the two cannot disagree.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

from bench.methods import method_of
from bench.report.figures import (
    Figure,
    headlines,
    later_checks,
    newest_runs,
    newest_sweep,
    plan_of,
    ratio_runs,
    ratios_table,
)
from bench.report.tables import (
    BENCH_CLAIMS,
    GROUP,
    NO_FIGURES,
    OURS,
    PEERS,
    RECORDS,
    SPEEDUP_CLAIM,
    CommandMaker,
    Inputs,
    cluster_title,
    comparison_section,
    config_stats,
    csv_section,
    fmt_s,
    is_protocol,
    no_headline,
    protocol_section,
    protocol_tables,
    recipe_command,
    record_of,
    records_section,
    rel,
    runs_dir,
    table_cell,
    target_text,
    unrun_experiments,
    verdict_text,
)
from bench.sweeps import ablation, protocol, ratios, scaling_table
from bench.sweeps.intervals import ci_column, ci_text

APPENDIX = "REPORT-appendix.md"
# what each embedded task is, in a phrase (the records name the data set, not its size)
TASKS = {
    "digits": "scikit-learn's 1,797 8x8 digits upsampled to 32 px (ResNet-9); 360 held-out "
    "images, so one image is 0.28 points of top-1",
    "translation": "the embedded translation corpus (a tiny Transformer, AdamW); BLEU on "
    "its 500 valid sentences, greedy decoding",
}
# the named settings the answer is given at, in order (profile name -> what it stands for)
NAMED = {
    "paper-224": "256 per V100 at 224 px, fp32 on the wire",
    "paper": "256 per V100 at 128 px, fp32 on the wire",
    "paper-b64": "64 per V100 at 128 px, fp32 on the wire",
}
QUESTION = (
    "How much sooner do the paper's methods (hitopk, mstopk) reach the target than dense "
    "DDP and than the best-tuned peer (fp16, PowerSGD, DeMo, DiLoCo, Streaming DiLoCo; the "
    "one fastest on the tuning seeds for that cluster), each tuned with the same budget "
    "(`python -m reproduce ablation`, rules in `docs/protocol.md`)?"
)


def _eval_records(records: list[dict], sweep: str) -> tuple[list[dict], int]:
    """The sweep's evaluation runs, the latest record of each, and how many earlier records
    (a run refused, interrupted or named by ``--rerun``, then run again) they replace."""
    every = [
        r
        for r in records
        if ((r.get("config") or {}).get("results") or {}).get("sweep_id") == sweep
        and (r.get("protocol") or {}).get("role") == protocol.EVAL
    ]
    latest = list(protocol.recorded(every, rerun=()).values())
    return latest, len(every) - len(latest)


def _cluster(r: dict) -> str:
    return str(((r.get("config") or {}).get("cluster") or {}).get("name") or "")


def shaped_first(records: list[dict]) -> list[dict]:
    """A sweep's runs with those over an emulated (shaped) link first: they are the measured
    column and carry the link and its profile; the local cluster's runs only give steps."""
    return sorted(records, key=lambda r: _cluster(r) != "emulated")


def where(records: list[dict]) -> str:
    """The workers, their nodes, the hardware and the link of a sweep's runs (those over the
    shaped link where some ran over it; the others' share then follows)."""
    records = shaped_first(records)
    r = records[0] if records else {}
    hw = str(r.get("hardware") or "unknown hardware").split(";")[0]
    link = r.get("link_check") or {}
    cluster = str(((r.get("config") or {}).get("cluster") or {}).get("name") or "")
    kind = (
        "emulated nodes" if cluster == "emulated"
        else "launcher nodes of the local cluster (loopback links, nothing shaped)"
        if cluster == "local" else "nodes"
    )  # fmt: skip
    text = f"{r.get('world_size')} workers on {r.get('nnodes')} {kind} sharing a {hw}"
    if link.get("bandwidth_gbps"):
        text += (
            f", an emulated inter-node link measured at {1e3 * link['bandwidth_gbps']:.0f} Mbit/s"
        )
    local = sum(_cluster(x) == "local" for x in records)
    if cluster == "emulated" and local:
        text += (
            f" ({len(records) - local} runs; {local} more on the local cluster, loopback "
            "links, for the composed columns' steps)"
        )
    return text


def setting(records: list[dict], table: pd.DataFrame, plan: dict, again: int = 0) -> str:
    """One sentence: the task, the workers, the hardware, the link, the seeds."""
    first = shaped_first(records)[0] if records else {}
    data = str(first.get("data") or "?")
    prof = first.get("cluster_profile") or {}
    link_txt = ""
    if prof.get("target_ratio"):
        link_txt += (
            f" (scaled so dense fp32 communication / compute per step = "
            f"{prof['target_ratio']:.2f}, profile `{prof.get('profile')}`)"
        )
    link_txt += measured_ratio_text(records)
    seeds = plan.get("eval_seeds") or []
    return (
        f"**Setting:** {TASKS.get(data, f'data set {data}')}; {where(records)}{link_txt}; "
        f"every method tuned with the same budget on seeds {plan.get('tune_seeds') or []}, "
        f"then {len(seeds)} evaluation seeds {seeds} (sweep `{table['sweep_id'].iloc[0]}`, "
        f"{len(records)} evaluation runs"
        + (
            f", beside {again} earlier records of runs done again (refused, interrupted, or "
            "named by `--rerun`)"
            if again
            else ""
        )
        + ")."
    )


def v1_caveat(workload: str, results: str) -> list[str]:
    """Why a sweep of protocol v1 does not answer the question, and the command whose
    sweep replaces it."""
    return [
        "**Superseded:** this sweep ran protocol `equal-budget-v1`, whose faults v2 fixes "
        "(docs/protocol.md, v1): dense and fp16 were not tuned, no method had a learning-rate "
        "axis, the selection compared measured clock times that noise could flip, and the "
        "density warm-up and PowerSGD's start moved once per epoch"
        + (
            ", so on translation two trials of one method ran alike within the budget (the "
            "trial `d0.01-warmup` never sent at density 0.01; `rank4-start1ep` never "
            "compressed before the target)"
            if workload == "translation"
            else ""
        )
        + ".  Its numbers stand here until the v2 sweep of this workload lands: "
        f"`python -m reproduce ablation --workload {workload} --results-dir {results}`.",
        "",
    ]


def measured_ratio_text(records: list[dict]) -> str:
    """What dense's runs measured: their communication inside the step against the rest
    of it (over the shaped link where some ran over it); ``""`` without dense runs that
    timed both."""
    dense = [
        r
        for r in records
        if method_of(r) == "dense" and r.get("step_time_s") and r.get("comm_s_per_step")
    ]
    shaped = [r for r in dense if (r.get("link_check") or {}).get("bandwidth_gbps")]
    dense = shaped or dense  # the runs over the shaped link, where there are some
    if not dense:
        return ""
    step = sum(float(r["step_time_s"]) for r in dense) / len(dense)
    comm = sum(float(r["comm_s_per_step"]) for r in dense) / len(dense)
    if not 0 < comm < step:
        return ""
    return (
        f"; measured in dense's {len(dense)} runs: communication {1e3 * comm:.0f} ms of a "
        f"{1e3 * step:.0f} ms step, {comm / (step - comm):.2f} x the rest of it"
    )


def answer_table(df: pd.DataFrame) -> list[str]:
    df = df.sort_values("time_to_target_mean_s")
    peer = str(df["best_peer"].dropna().iloc[0]) if df["best_peer"].notna().any() else "-"
    lines = [
        f"| method (tuned configuration) | time to target, s [95 % CI] | vs dense | "
        f"vs best peer ({peer}) | reached |",
        "| --- | --- | --- | --- | --- |",
    ]
    cols = zip(
        ci_column(df, "time_to_target", 1),
        ci_column(df, "speedup_vs_dense", 2, "x"),
        ci_column(df, "speedup_vs_peer", 2, "x"),
        strict=True,
    )
    for (_, r), (tt, vd, vp) in zip(df.iterrows(), cols, strict=True):
        name = f"**{r['comm']}** (paper)" if r["comm"] in OURS else str(r["comm"])
        vd = "1 (baseline)" if r["comm"] == "dense" else vd
        vp = "1 (best peer)" if r["comm"] == peer else vp
        lines.append(
            f"| {name} `{r['trial']}` | {tt} | {vd} | {vp} | {r['n_reached']}/{r['n_runs']} |"
        )
    return lines


def _paper_rows(df: pd.DataFrame):
    """(row, vs dense, its verdict, vs the best peer, its verdict) per paper method."""
    df = df[df["comm"].isin(OURS)]
    vs = zip(ci_column(df, "speedup_vs_dense", 2, "x"), ci_column(df, "speedup_vs_peer", 2, "x"))
    for (_, r), (d, p) in zip(df.iterrows(), vs, strict=True):
        n = int(r["n_runs"])
        yield r, d, verdict_text(r["verdict_vs_dense"], n), p, verdict_text(r["verdict_vs_peer"], n)


def verdicts(df: pd.DataFrame, target: str) -> list[str]:
    """One sentence per paper method: against dense and against the best peer."""
    return [
        f"- **{r['comm']}** (`{r['trial']}`) to {target}: against dense {d}, {vd}; against "
        f"the best peer ({r['best_peer']}) {p}, {vp}."
        for r, d, vd, p, vp in _paper_rows(df)
    ]


def resolution_lines(base: Path, recs: list[dict], df: pd.DataFrame) -> list[str]:
    """How finely the evaluation runs resolve time to target (:mod:`bench.sweeps.resolution`),
    beside the differences the table reports; ``[]`` when no run reached the target."""
    from bench.data import heldout_size
    from bench.sweeps import resolution

    if not recs or df.empty:
        return []
    metric, value = str(df["target_metric"].iloc[0]), float(df["target_value"].iloc[0])
    cfg = recs[0].get("config") or {}
    data = cfg.get("data") or {}
    # one held-out image, where the metric counts images (BLEU is a corpus score)
    digits = data.get("name") == "digits"
    sample = 1 / heldout_size(float(data.get("test_fraction", 0.2))) if digits else None
    s = resolution.summary(resolution.sweep_resolution(base, recs, metric, value, sample))
    if not s:
        return []
    every = (cfg.get("train") or {}).get("eval_every_steps")
    text = (
        f"**Resolution:** in the {s['n']} runs that reached the target, "
        f"{f'evaluations every {every} steps ' if every else 'the evaluations '}bracket the "
        f"crossing to a median {s['bracket_median_s']:.2f} s of training (the time since the "
        f"evaluation before it; at most {s['bracket_max_s']:.2f} s)"
    )
    if "one_sample_median_s" in s:
        text += (
            f"; a target one held-out image lower ({100 * (value - sample):.2f} %) is reached "
            f"a median {s['one_sample_median_s']:.2f} s sooner (mean "
            f"{s['one_sample_mean_s']:.2f} s, at most {s['one_sample_max_s']:.2f} s; sooner "
            f"at all in {s['one_sample_moved']} of {s['n']} runs)"
        )
    means = dict(zip(df["comm"], df["time_to_target_mean_s"], strict=False))
    peer = df["best_peer"].dropna()
    peer = str(peer.iloc[0]) if len(peer) else None
    gaps = []
    for m in OURS:
        if m not in means:
            continue
        ref = [r for r in dict.fromkeys(("dense", peer)) if r and r != m and r in means]
        gaps.append(f"{m} {', '.join(f'{abs(means[m] - means[r]):.1f} s from {r}' for r in ref)}")
    if gaps:
        text += f"; the mean times differ by: {'; '.join(gaps)}"
    return [text + ".", ""]


def _at(comp: pd.DataFrame, comm: str, role: str, ratio: float) -> pd.Series | None:
    d = comp[
        (comp["group"] == comm) & (comp["vs_role"] == role) & (comp["ratio"].round(6) == ratio)
    ]
    return None if d.empty else d.iloc[0]


def _win(x: pd.Series) -> str:
    return "win" if x["ci_low"] > 1 else ("loss" if x["ci_high"] < 1 else "no difference")


def ratios_lines(comp: pd.DataFrame, translation: bool = False) -> list[str]:
    """The composition at the named settings, and where each paper method stops winning."""
    if comp.empty:
        return ["(No composition across ratios: the sweep's runs have no step counts.)"]
    named = ratios.named_ratios()
    lines = [
        "Across the paper's own setting (steps to target from these runs x the performance "
        "model's time per step on 16 x 8 V100 at 25 Gbit/s; speedup [95 % interval over "
        "seeds]; a win only when the interval excludes 1"
        + (
            "; the model's gradient is ResNet-50's, the Transformer's steps and densities "
            "carried over: the ratio is what the setting varies"
            if translation
            else ""
        )
        + "):",
        "",
        "| method | vs | " + " | ".join(f"`{k}` ratio {named[k]:.2f}" for k in NAMED) + " |",
        "| --- | --- | " + " | ".join("---" for _ in NAMED) + " |",
    ]
    for comm in OURS:
        for role in ("dense", "best peer"):
            cells = []
            for k in NAMED:
                x = _at(comp, comm, role, round(named[k], 6))
                if x is None:
                    cells.append("-")
                    continue
                who = f" vs {x['vs']}" if role != "dense" else ""
                ci = ci_text(x["speedup"], x["ci_low"], x["ci_high"], 2, "x")
                cells.append(f"{ci} {_win(x)}{who}")
            if any(c != "-" for c in cells):
                lines.append(f"| {comm} | {role} | " + " | ".join(cells) + " |")
    sw = ratios.stops_winning(comp)
    sw = sw[sw["group"].isin(OURS)]
    lines.append("")
    for _, r in sw.iterrows():
        be = r["breakeven_ratio"]
        wf = r["wins_from"]
        be_txt = f"breaks even at ratio {be:.2f}" if be == be else "does not cross 1 in 0.1-10"
        wf_txt = (
            f"a measurable win from ratio {wf:.2f} up"
            if wf == wf
            else "no measurable win at the top of the grid"
        )
        lines.append(f"- {r['group']} vs {r['vs_role']}: {be_txt}; {wf_txt}.")
    return lines


def model_lines(runs: list) -> list[str]:
    """Why the composition and this machine's clock can differ: the model's time per step
    on the paper's cluster at the ``paper`` ratio for every (method, density) the runs sent,
    and the composition checked against the runs' own clock on this machine."""
    if not runs:
        return []
    r = ratios.named_ratios()["paper"]
    seen: dict[tuple[str, float, int], float] = {}
    for run in runs:
        for ph in run.phases:
            key = (ph.method, ph.density, ph.rank)
            if ph.steps and key not in seen:
                seen[key] = ratios.step_time_s(ph.method, ph.density, r, powersgd_rank=ph.rank)
    parts = [
        f"{m}{f' d={d:g}' if d < 1 else ''}{f' rank {k}' if m == 'powersgd' else ''} "
        f"{1e3 * t:.0f} ms"
        for (m, d, k), t in sorted(seen.items(), key=lambda kv: kv[1])
    ]
    check = ratios.end_to_end_check(runs)
    err = (
        f"; against these runs' own clock on this machine (steps to target x measured time "
        f"per step) the composition is within {100 * check['relative_error'].abs().max():.1f} %"
        f" for every method"
        if not check.empty
        else ""
    )
    return [
        f"The model's time per step on 16 x 8 V100 at the `paper` ratio, for each method and "
        f"density these runs sent (warm-up densities included): {'; '.join(parts)}{err}.  "
        "A configuration tuned on this machine's 2 x 2 carries its warm-up densities to the "
        "paper's cluster, where a top-k allgather over 16 nodes at a high density can cost "
        "more than dense (the times above say at which): that, not the trajectory, is where "
        "the answer measured here and the composed one part.",
        "",
    ]


# -- v2 tables: each method tuned for the cluster its number is quoted for ----------------


def _cell(r: pd.Series, key: str = "speedup_vs_dense") -> str:
    """``1.23x [1.10, 1.40]`` and its verdict in a word, or ``-``."""
    text = ci_text(r[key], r[f"{key}_ci_low"], r[f"{key}_ci_high"], 2, "x")
    if text == "-":
        return text
    tag = "vs_dense" if key.endswith("dense") else "vs_peer"
    return f"{text} {verdict_text(r[f'verdict_{tag}'], int(r['n_runs']), short=True)}"


def first_to_target(g: pd.DataFrame) -> str:
    """Which method reaches the target first on one cluster (lowest mean time over the
    evaluation seeds) and whether the runner-up can be told from it, by the interval that
    compares them: the best peer's (chosen on the tuning seeds) when one of the two is it."""
    order = g.sort_values("time_to_target_mean_s")
    first, second = order.iloc[0], order.iloc[1]
    peer = str(first["best_peer"] or "")
    text = f"first to target {first['comm']}"
    text += f" (vs dense {_cell(first)})" if first["comm"] != "dense" else ""
    if first["comm"] == peer:
        return text + f", then {second['comm']} at {_cell(second, 'speedup_vs_peer')} of its speed"
    text += f", then {second['comm']}"
    if peer in set(g["comm"]) and first["comm"] not in OURS:  # said after
        text += f"; {first['comm']} vs {peer} (the best peer) {_cell(first, 'speedup_vs_peer')}"
    return text


def answer_sentence(df: pd.DataFrame, exp: str, target: str) -> str:
    """One sentence for a workload: on the paper's cluster at each named ratio, the paper's
    methods against dense and against the best-tuned peer there, with intervals."""
    parts = []
    for cluster, g in df[df["ratio"].notna()].groupby("for_cluster", sort=False):
        ratio = float(g["ratio"].iloc[0])
        said = [first_to_target(g)] if len(g) > 1 else []
        for _, r in g[g["comm"].isin(OURS)].iterrows():
            peer = str(r["best_peer"]) or "-"
            said.append(f"{r['comm']} vs dense {_cell(r)}, vs {peer} {_cell(r, 'speedup_vs_peer')}")
        parts.append(f"at ratio {ratio:.2f} (`{cluster}`): " + "; ".join(said or ["no runs"]))
    return (
        f"**{exp}** (to {target}, the time to target of each method's configuration tuned "
        f"for that cluster, {int(df['n_runs'].max())} evaluation seeds): " + " | ".join(parts) + "."
    )


def answer_table_v2(df: pd.DataFrame) -> list[str]:
    """Methods x clusters: each method's speedup over dense where it was tuned, and the
    configuration the rule selected there."""
    order = list(dict.fromkeys(df["for_cluster"]))
    ratio = {c: float(df[df["for_cluster"] == c]["ratio"].iloc[0]) for c in order}
    head = "| method | " + " | ".join(cluster_title(c, ratio[c]) for c in order) + " |"
    lines = [head, "| --- |" + " --- |" * len(order)]
    for comm in dict.fromkeys(df["comm"]):
        name = f"**{comm}** (paper)" if comm in OURS else str(comm)
        cells = []
        for c in order:
            hit = df[(df["for_cluster"] == c) & (df["comm"] == comm)]
            if hit.empty:
                cells.append("-")
                continue
            r = hit.iloc[0]
            if comm == "dense":
                t = f"{r['time_to_target_mean_s']:.1f} s"
                cells.append(f"1 (baseline, {t}) `{r['trial']}`")
            else:
                cells.append(f"{_cell(r)} `{r['trial']}`")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def answer_sections(
    records: list[dict], tables: dict[str, Path], base: Path
) -> tuple[list[str], list[str], list[str]]:
    """(the short answer, the answer per workload, the appendix's part) from each
    workload's newest protocol table (``tables``: experiment -> table)."""
    short = [QUESTION, ""]
    sentences: list[str] = []
    rows: list[str] = []
    settings: list[str] = []
    detail: list[str] = []
    appendix: list[str] = []
    paper = round(ratios.named_ratios()["paper"], 6)
    for name, exp in protocol.WORKLOADS.items():
        table = tables.get(exp)
        detail += [f"### {exp} ({name} workload)", ""]
        if table is None:
            none = (
                f"No protocol sweep of {exp} is recorded here, so no answer: "
                f"`python -m reproduce ablation --workload {name} --results-dir {runs_dir(base)}` "
                "runs one."
            )
            settings.append(f"{exp}: no sweep (`ablation --workload {name}` runs one)")
            detail += [none, ""]
            continue
        df = pd.read_csv(table)
        recs, again = _eval_records(records, table.stem)
        try:
            plan = plan_of(table)
        except (OSError, ValueError):
            plan = {}
        target = target_text(str(df["target_metric"].iloc[0]), float(df["target_value"].iloc[0]))
        if "for_cluster" in df.columns:  # v2: tuned per cluster
            sentences.append(answer_sentence(df, exp, target))
            settings.append(f"{exp} ({target}): {where(recs)}")
            t = rel(table, base)
            detail += [
                setting(recs, df, plan, again),
                "",
                "Speedup over dense of each method's configuration tuned for that cluster "
                "(95 % Welch interval on log time over the evaluation seeds); the emulated "
                "2 x 2 column is measured on its clock and checks the composition, the "
                "others compose each run's logged steps with the model's time per step:",
                "",
                *answer_table_v2(df),
                "",
                f"Table: `{t}`; every trial, its runs and the selection per cluster: "
                f"`{t[:-4]}-tuning.csv`.",
                "",
            ]
            appendix += [f"### {exp}", "", *resolution_lines(base, recs, df[df["ratio"].isna()])]
            continue
        comp = ratios_table(base, df)
        v1 = str(plan.get("name", "")).endswith("-v1")
        for r, d, vd, p, vp in _paper_rows(df):
            x = None if comp.empty else _at(comp, r["comm"], "dense", paper)
            at = "-" if x is None else ci_text(x["speedup"], x["ci_low"], x["ci_high"], 2, "x")
            at += "" if x is None else f" {_win(x)}"
            name_cell = f"{exp} (v1 sweep, superseded)" if v1 else exp
            rows.append(
                f"| {name_cell} | **{r['comm']}** | {d}, {vd} | {p} vs {r['best_peer']}, {vp} "
                f"| {at} |"
            )
        settings.append(f"{exp} ({target}): {where(recs)}")
        t = rel(table, base)
        detail += [
            setting(recs, df, plan, again),
            "",
            *(v1_caveat(name, runs_dir(base)) if v1 else []),
            *answer_table(df),
            "",
            *verdicts(df, target),
            "",
            *ratios_lines(comp, translation=name == "translation"),
            "",
            f"Table: `{t}`; every trial and its runs: `{t[:-4]}-tuning.csv`; how finely the "
            f"runs resolve the time and the model's time per step: [the appendix]({APPENDIX}).",
            "",
        ]
        appendix += [
            f"### {exp}",
            "",
            *resolution_lines(base, recs, df),
            *model_lines(ratio_runs(base, df)),
        ]
    short += [f"- {x}" for x in sentences] + ([""] if sentences else [])
    if rows:
        short += [
            "| workload | method | vs dense [95 % CI] | vs the best peer | vs dense at the "
            f"paper's ratio ({paper:.2f}, composed) |",
            "| --- | --- | --- | --- | --- |",
            *rows,
            "",
        ]
    short += [
        "**Setting:** every method tuned with the same budget, then trained on fresh "
        "evaluation seeds; each in full: below.",
        *(f"- {x}." for x in settings),
        "",
    ]
    return short, detail, appendix


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
        for r, _, _, p, vp in _paper_rows(df):
            text = f"{exp}: {r['comm']} `{r['trial']}` vs the best-tuned peer {r['best_peer']}"
            out.append((f"{text}: {p}, {vp} (see the answer above)", hw, f"sweep `{t.stem}`"))
    return out


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


def earlier_section(inputs: Inputs) -> list[str]:
    """The comparisons made before the tuning protocol: hitopk / mstopk against the
    strongest peer and against dense of the same group, cache and update, as recorded."""
    stats = config_stats(inputs.runs)
    vs_peer, vs_dense = [], []
    for key, g in [] if stats.empty else stats.groupby([*GROUP, "cache", "update"]):
        reached = g[g["n_reached"] > 0]
        peers = reached[reached["comm_name"].isin(PEERS)].sort_values("tt_mean")
        dense = reached[reached["comm_name"] == "dense"]
        for _, o in reached[reached["comm_name"].isin(OURS)].iterrows():
            if len(peers):
                p = peers.iloc[0]
                pct = 100 * (p["tt_mean"] - o["tt_mean"]) / p["tt_mean"]
                text = (
                    f"{key[0]} ({key[1]}): {o['comm']} {o['tt_mean']:.1f} s vs {p['comm']} "
                    f"{p['tt_mean']:.1f} s: {pct:+.0f} % time saved"
                )
                vs_peer.append((text, key[2], " ".join(o["run_ids"] + p["run_ids"])))
            if len(dense):  # one dense configuration per group
                b = dense.iloc[0]
                pct = 100 * (b["tt_mean"] - o["tt_mean"]) / b["tt_mean"]
                text = (
                    f"{key[0]} ({key[1]}, update {key[4]}): {o['comm']} {o['tt_mean']:.1f} s "
                    f"vs dense {b['tt_mean']:.1f} s to target: {pct:+.0f} % time saved "
                    f"({o['n_reached']}/{o['n_runs']} and {b['n_reached']}/{b['n_runs']} runs "
                    "reached)"
                )
                vs_dense.append((text, key[2], " ".join(o["run_ids"] + b["run_ids"])))
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


def bench_headlines(inputs: Inputs) -> dict[str, list[tuple[str, str]]]:
    """name -> [(hardware, one headline line)] from each hardware's newest run."""
    out: dict[str, list[tuple[str, str]]] = {}
    for name, fn in headlines().items():
        csv = inputs.bench.get(name)
        for hw, rows in newest_runs(csv, inputs.problems) if csv else []:
            for text in fn(rows):
                out.setdefault(name, []).append(
                    (hw.split(";")[0], table_cell(f"{text} (run {rows['bench_id'].iloc[0]})"))
                )
    return out


def figures_section(figs: list[Figure], base: Path) -> list[str]:
    out = []
    for f in figs:
        if not f.drawn:
            why = f.error or "nothing to draw"
            out += [f"- not drawn: {f.path.name} ({f.what}): {why}", ""]
            continue
        for p in [f.path, *f.extra]:
            out += [f"**{p.name}**: {f.what}", "", f"![{f.what}]({rel(p, base)})", ""]
    if any(f.kind == "breakdown" and f.drawn for f in figs):
        out += [
            "Per-step breakdowns: forward+backward is the loop's compute time less the selection "
            "and communication measured inside the communication hook; unless a curve records "
            "exposed communication (`comm/exposed_s`), the communication bar is the time "
            "measured, not the part left exposed after overlap.",
            "",
        ]
    return out


BENCH_SECTIONS = {  # micro-benchmark sections, in order: title, the benchmarks they hold
    "Top-k selection": ("topk",),
    "Optimizer update": ("update",),
    "Input pipeline and cache": ("input", "input_gpu"),
    "Communication and the emulated cluster": ("comm", "cluster", "throughput"),
}


def bench_sections(bench_rows: dict, bench: dict, base: Path) -> list[str]:
    out = []
    for title, names in BENCH_SECTIONS.items():
        out += [f"### {title}", ""]
        lines = [f"| {hw} | {text} |" for n in names for hw, text in bench_rows.get(n, [])]
        if lines:
            out += ["| hardware | measured (newest run per hardware) |", "| --- | --- |", *lines]
        else:
            out.append(no_headline(names, bench, base))
        out.append("")
    return out


def scaling_lines(inputs: Inputs) -> list[str]:
    """What the newest measured scaling sweep shows: each method's efficiency per size
    (the compute-only step over its step) and whether the model held."""
    frames = []
    for f in inputs.scaling:
        try:
            frames.append(pd.read_csv(f))
        except (OSError, ValueError, pd.errors.ParserError):
            continue
    if not frames:
        return []
    df = newest_sweep(pd.concat(frames, ignore_index=True, sort=False))
    if "predicted_step_s" not in df or df["predicted_step_s"].isna().all():
        return []
    df = df.astype({"nodes": int, "workers_per_node": int})  # 4x1, not 4.0x1.0
    per = _efficiencies(df)
    sweep = str(df["sweep_id"].iloc[0])
    return [
        f"Scaling, sweep `{sweep}` (efficiency = the compute-only step / the method's step at "
        f"the same size, measured on this machine): {'; '.join(per)}.  "
        + "; ".join(x.strip() for x in scaling_table.summary(df))
        + ".",
        "",
        *later_check_lines(pd.concat(frames, ignore_index=True, sort=False)),
    ]


def _efficiencies(df: pd.DataFrame) -> list[str]:
    """``dense 0.52 at 2x2, 0.38 at 4x2`` per method measured on more than one node."""
    meas = df[(df["kind"] == "measured") & (df["comm"] != "nocomm") & (df["nodes"] > 1)]
    per = []
    for comm, g in meas.groupby("comm", sort=False):
        g = g.sort_values("nodes")
        cells = ", ".join(
            f"{e:.2f} at {int(n)}x{int(m)}"
            for n, m, e in zip(g["nodes"], g["workers_per_node"], g["efficiency"], strict=True)
        )
        per.append(f"{comm} {cells}")
    return per


def later_check_lines(frame: pd.DataFrame) -> list[str]:
    """One paragraph per narrower scaling sweep run after the drawn study: its methods,
    sizes and how well the model predicted them."""
    out = []
    for df in later_checks(frame):
        df = df.astype({"nodes": int, "workers_per_node": int})
        per = _efficiencies(df)
        if not per:
            continue
        out += [
            f"Model check, sweep `{df['sweep_id'].iloc[0]}` (not drawn; efficiency as "
            f"above): {'; '.join(per)}.  "
            + "; ".join(x.strip() for x in scaling_table.summary(df))
            + ".",
            "",
        ]
    return out


# each sweep's table as the report shows it: the columns its sweep module names, then the
# hardware of its runs (looked up in the records)
ABLATION_COLUMNS = [*ablation.REPORT_COLUMNS, "hardware"]
SCALING_COLUMNS = [*scaling_table.REPORT_COLUMNS, "hardware"]


def write_report(inputs: Inputs, figs: list[Figure], path: Path, header: str) -> Path:
    """Write the report and its appendix beside it; returns the report's path."""
    maker = CommandMaker()
    base = path.parent
    problems = [f"- {p}" for p in inputs.problems] or ["- none"]
    unrun = unrun_experiments(inputs)
    tables = protocol_tables(inputs)
    rows = bench_headlines(inputs)
    main_figs = [
        f
        for f in figs
        if f.kind in ("speedup", "ratios", "tta", "breakdown") and f.experiment in tables
    ] + [f for f in figs if f.kind == "scaling"]
    other_figs = [f for f in figs if f not in main_figs and f.kind != "bench"]
    short, detail, appendix = answer_sections(inputs.records, tables, base)
    main = [
        "# Reproduction report",
        "",
        header,
        "",
        f"Everything else (every sweep and trial, the earlier comparisons, every record): "
        f"[{APPENDIX}]({APPENDIX}).",
        "",
        "## The answer",
        "",
        *short,
        "## The answer per workload",
        "",
        *detail,
        "## Figures",
        "",
        *(figures_section(main_figs, base) or [NO_FIGURES.format(APPENDIX), ""]),
        *scaling_lines(inputs),
        "## Micro-benchmarks",
        "",
        "Each against the strongest baseline in the same run first (torch.topk, torch's "
        "fused optimizers, no cache), naive loops only after; their figures are in the "
        "appendix.",
        "",
        *bench_sections(rows, inputs.bench, base),
        "## The paper's claims beside ours",
        "",
        *headline_section(inputs, maker, rows, tables),
        "",
    ]
    rest = [
        "# Reproduction report: appendix",
        "",
        header,
        "",
        "## How finely the runs resolve the answer, and the model behind the composition",
        "",
        *appendix,
        "## Tuning protocol: every sweep and its trials",
        "",
        *protocol_section(inputs.ablation, base),
        "## Earlier comparisons (not equally tuned)",
        "",
        *earlier_section(inputs),
        *comparison_section(inputs, maker),
        *(["Recipes with no record yet; to run:", "", *unrun, ""] if unrun else []),
        "## Micro-benchmark figures",
        "",
        *figures_section([f for f in figs if f.kind == "bench"], base),
        "## Other figures",
        "",
        *figures_section(other_figs, base),
        "## Ablation grids",
        "",
        *csv_section(
            [p for p in inputs.ablation if not is_protocol(p)],
            ABLATION_COLUMNS,
            base,
            "python -m reproduce ablation --grid",
            inputs.runs,
        ),
        "## Scaling",
        "",
        *csv_section(
            inputs.scaling, SCALING_COLUMNS, base, "python -m reproduce scaling", inputs.runs
        ),
        "## Records",
        "",
        *records_section(inputs, maker),
        "",
        "## Input problems",
        "",
        *problems,
        "",
    ]
    path.write_text("\n".join(main))
    (base / APPENDIX).write_text("\n".join(rest))
    return path


START = "<!-- answer: copied from results/REPORT.md by `python -m bench.report.answer` -->"
END = "<!-- answer end -->"
SECTION = "## The answer"
ROOT = Path(__file__).resolve().parents[2]


def answer_of(report: str, prefix: str = "results/") -> str:
    """REPORT.md's answer section, without its heading, paths prefixed with ``prefix``."""
    lines = report.splitlines()
    try:
        i = lines.index(SECTION)
    except ValueError:
        raise ValueError(f"the report has no {SECTION!r} section") from None
    j = next((k for k in range(i + 1, len(lines)) if lines[k].startswith("## ")), len(lines))
    body = "\n".join(lines[i + 1 : j]).strip("\n")
    # `ablation/x.csv` -> `results/ablation/x.csv` (paths the report gives from its folder)
    body = re.sub(r"`(ablation|figures|scaling|bench)/", lambda m: f"`{prefix}{m.group(1)}/", body)
    return body.replace("each in full: below.", f"each in full: `{prefix}REPORT.md`.")


HW_START = "<!-- hardware: counted from results/runs.jsonl by `python -m bench.report.answer` -->"
HW_END = "<!-- hardware end -->"


def hardware_lines(results: Path) -> list[str]:
    """One line per machine of the records in ``results`` (their ``hardware`` field, every
    attempt counted): how many records name it and the dates of the first and last, most
    records first."""
    from bench.results.records import load_records

    seen: dict[str, list[str]] = {}
    for rec in load_records(results, attempts=True):
        seen.setdefault(rec.get("hardware") or "not recorded", []).append(
            str(rec.get("started_at") or "")[:10]
        )
    out = []
    for hw, days in sorted(seen.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        dated = sorted(d for d in days if d)
        when = ""
        if dated:
            span = dated[0] if dated[0] == dated[-1] else f"{dated[0]} to {dated[-1]}"
            when = f" ({span})"
        out.append(f"- {len(days)} record{'' if len(days) == 1 else 's'}: {hw}{when}")
    return out


def block_of(readme: str, start: str = START, end: str = END) -> str:
    """The README's current block (between the markers)."""
    if start not in readme or end not in readme:
        what = "answer" if start == START else "hardware"
        raise ValueError(f"README.md has no {what} block (its start and end markers)")
    return readme.split(start, 1)[1].split(end, 1)[0].strip("\n")


def _put(readme: str, start: str, end: str, body: str) -> str:
    head, rest = readme.split(start, 1)
    tail = rest.split(end, 1)[1]
    return f"{head}{start}\n{body}\n{end}{tail}"


def rewrite(readme: str, report: str, results: Path | None = None) -> str:
    """README with its answer block copied from ``report`` and, when it has the hardware
    block and ``results`` is given, that block counted from the records there."""
    out = _put(readme, START, END, answer_of(report))
    if results is not None and HW_START in out and HW_END in out:
        out = _put(out, HW_START, HW_END, "\n".join(hardware_lines(results)))
    return out


def main(argv: list[str] | None = None) -> int:
    """Rewrite README's answer block from REPORT.md and its hardware block from the
    records; ``--check``: exit 1 when either differs."""
    ap = argparse.ArgumentParser(prog="python -m bench.report.answer", description=main.__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 if a block is stale")
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    ap.add_argument("--report", default=str(ROOT / "results" / "REPORT.md"))
    ap.add_argument("--results-dir", default=str(ROOT / "results"),
                    help="the records' folder (its runs.jsonl)")  # fmt: skip
    a = ap.parse_args(argv)
    readme, report = Path(a.readme).read_text(), Path(a.report).read_text()
    runs = Path(a.results_dir) if (Path(a.results_dir) / "runs.jsonl").is_file() else None
    if a.check:
        same = rewrite(readme, report, runs) == readme
        print(
            "README's blocks match REPORT.md and the records"
            if same
            else "README's answer or hardware block is stale"
        )
        return 0 if same else 1
    Path(a.readme).write_text(rewrite(readme, report, runs))
    print(
        f"{a.readme}: answer block rewritten from {a.report}"
        + (f", hardware counted from {runs / 'runs.jsonl'}" if runs else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
