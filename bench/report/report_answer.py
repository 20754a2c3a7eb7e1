"""REPORT.md's first section: the answer, per workload, from its newest protocol sweep.

For each workload: the setting in one sentence (task, workers, hardware, link, taken from
the sweep's records), one table of each method's tuned configuration (time to target with
its 95 % interval, against dense and against the best peer, runs reached), a sentence per
paper method with its verdicts, and the same runs composed at the named communication /
compute ratios of the paper's setting (:mod:`bench.sweeps.ratios`).  A workload without a
protocol sweep says so and names the command that makes one.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from bench.report.figures_protocol import ratio_runs, ratios_table
from bench.sweeps import protocol, ratios

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


def ci_text(m: Any, lo: Any, hi: Any, d: int = 2, unit: str = "") -> str:
    m, lo, hi = (float(x) if x is not None else math.nan for x in (m, lo, hi))
    if m != m:
        return "-"
    if lo != lo:
        return f"{m:.{d}f}{unit} (no interval)"
    if any(round(b, d) == 1.0 and b != 1.0 for b in (lo, hi)):
        d += 1  # a bound that would print as 1.00: one more digit says which side it is on
    return f"{m:.{d}f}{unit} [{lo:.{d}f}, {hi:.{d}f}]"


def verdict_text(v: Any, n: int) -> str:
    v = str(v)
    return v if v in ("faster", "slower") else f"no difference measurable at n = {n}"


def _eval_records(records: list[dict], sweep: str) -> list[dict]:
    return [
        r
        for r in records
        if ((r.get("config") or {}).get("results") or {}).get("sweep_id") == sweep
        and (r.get("protocol") or {}).get("role") == protocol.EVAL
    ]


def setting(records: list[dict], table: pd.DataFrame, plan: dict) -> str:
    """One sentence: the task, the workers, the hardware, the link, the seeds."""
    r = records[0] if records else {}
    data = str(r.get("data") or "?")
    task = TASKS.get(data, f"data set {data}")
    world, nodes = r.get("world_size"), r.get("nnodes")
    hw = str(r.get("hardware") or "unknown hardware").split(";")[0]
    link = r.get("link_check") or {}
    prof = r.get("cluster_profile") or {}
    link_txt = ""
    if link.get("bandwidth_gbps"):
        link_txt = (
            f", an emulated inter-node link measured at {1e3 * link['bandwidth_gbps']:.0f} Mbit/s"
        )
    if prof.get("target_ratio"):
        link_txt += (
            f" (scaled so dense fp32 communication / compute per step = "
            f"{prof['target_ratio']:.2f}, profile `{prof.get('profile')}`)"
        )
    link_txt += measured_ratio_text(records)
    seeds = plan.get("eval_seeds") or []
    tune = plan.get("tune_seeds") or []
    cluster = str(((r.get("config") or {}).get("cluster") or {}).get("name") or "")
    kind = (
        "emulated nodes" if cluster == "emulated"
        else "launcher nodes of the local cluster (loopback links, nothing shaped)"
        if cluster == "local" else "nodes"
    )  # fmt: skip
    return (
        f"**Setting:** {task}; {world} workers on {nodes} {kind} sharing a {hw}"
        f"{link_txt}; every method tuned with the same budget on seeds {tune}, then "
        f"{len(seeds)} evaluation seeds {seeds} (sweep `{table['sweep_id'].iloc[0]}`, "
        f"{len(records)} evaluation runs)."
    )


def measured_ratio_text(records: list[dict]) -> str:
    """What dense's runs measured: their communication inside the step against the rest of
    it (the ratio the sweep ran at, which the machine's load can move away from the one
    the link was scaled for); ``""`` without dense runs that timed both."""
    dense = [
        r
        for r in records
        if r.get("comm") == "dense" and r.get("step_time_s") and r.get("comm_s_per_step")
    ]
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
    for _, r in df.iterrows():
        paper = r["comm"] in protocol.PAPER_METHODS
        name = f"**{r['comm']}** (paper)" if paper else str(r["comm"])
        tt = ci_text(
            r["time_to_target_mean_s"],
            r["time_to_target_ci_low_s"],
            r["time_to_target_ci_high_s"],
            1,
        )
        vd = (
            "1 (baseline)"
            if r["comm"] == "dense"
            else ci_text(
                r["speedup_vs_dense"],
                r["speedup_vs_dense_ci_low"],
                r["speedup_vs_dense_ci_high"],
                2,
                "x",
            )
        )
        vp = (
            "1 (best peer)"
            if r["comm"] == peer
            else ci_text(
                r["speedup_vs_peer"],
                r["speedup_vs_peer_ci_low"],
                r["speedup_vs_peer_ci_high"],
                2,
                "x",
            )
        )
        lines.append(
            f"| {name} `{r['trial']}` | {tt} | {vd} | {vp} | {r['n_reached']}/{r['n_runs']} |"
        )
    return lines


def verdicts(df: pd.DataFrame, target: str) -> list[str]:
    """One sentence per paper method: against dense and against the best peer."""
    out = []
    for _, r in df[df["comm"].isin(protocol.PAPER_METHODS)].iterrows():
        n = int(r["n_runs"])
        d = ci_text(
            r["speedup_vs_dense"],
            r["speedup_vs_dense_ci_low"],
            r["speedup_vs_dense_ci_high"],
            2,
            "x",
        )
        p = ci_text(
            r["speedup_vs_peer"], r["speedup_vs_peer_ci_low"], r["speedup_vs_peer_ci_high"], 2, "x"
        )
        out.append(
            f"- **{r['comm']}** (`{r['trial']}`) to {target}: against dense {d}, "
            f"{verdict_text(r['verdict_vs_dense'], n)}; against the best peer ({r['best_peer']}) "
            f"{p}, {verdict_text(r['verdict_vs_peer'], n)}."
        )
    return out


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
    for m in protocol.PAPER_METHODS:
        if m not in means:
            continue
        ref = [r for r in dict.fromkeys(("dense", peer)) if r and r != m and r in means]
        gaps.append(f"{m} {', '.join(f'{abs(means[m] - means[r]):.1f} s from {r}' for r in ref)}")
    if gaps:
        text += f"; the mean times differ by: {'; '.join(gaps)}"
    return [text + ".", ""]


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
    for comm in protocol.PAPER_METHODS:
        for role in ("dense", "best peer"):
            cells = []
            for k in NAMED:
                d = comp[
                    (comp["group"] == comm)
                    & (comp["vs_role"] == role)
                    & (comp["ratio"].round(6) == round(named[k], 6))
                ]
                if d.empty:
                    cells.append("-")
                    continue
                x = d.iloc[0]
                win = (
                    "win" if x["ci_low"] > 1 else ("loss" if x["ci_high"] < 1 else "no difference")
                )
                who = f" vs {x['vs']}" if role != "dense" else ""
                cells.append(
                    f"{ci_text(x['speedup'], x['ci_low'], x['ci_high'], 2, 'x')} {win}{who}"
                )
            if any(c != "-" for c in cells):
                lines.append(f"| {comm} | {role} | " + " | ".join(cells) + " |")
    sw = ratios.stops_winning(comp)
    sw = sw[sw["group"].isin(protocol.PAPER_METHODS)]
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


def answer_section(records: list[dict], tables: dict[str, Path], base: Path) -> list[str]:
    """The report's first section (``tables``: experiment -> newest protocol table)."""
    out: list[str] = []
    for name, exp in protocol.WORKLOADS.items():
        table = tables.get(exp)
        out += [f"### {exp} ({name} workload)", ""]
        if table is None:
            out += [
                f"No protocol sweep of {exp} is recorded here, so no answer: "
                f"`python -m reproduce ablation --workload {name} --results-dir results` "
                "runs one.",
                "",
            ]
            continue
        df = pd.read_csv(table)
        plan = protocol_plan(table)
        recs = _eval_records(records, table.stem)
        metric, value = df["target_metric"].iloc[0], df["target_value"].iloc[0]
        from bench.report.figures import target_text

        target = target_text(str(metric), float(value))
        rel = Path(table).relative_to(base) if table.is_relative_to(base) else table
        out += [
            setting(recs, df, plan),
            "",
            *answer_table(df),
            "",
            *verdicts(df, target),
            "",
            *resolution_lines(base, recs, df),
            *ratios_lines(ratios_table(base, df), translation=name == "translation"),
            *model_lines(ratio_runs(base, df)),
            "",
            f"Table: `{rel}`; every trial and its runs: "
            f"`{rel.with_name(rel.stem + '-tuning.csv')}`; the rules: `docs/protocol.md`.",
            "",
        ]
    return out


def protocol_plan(table: Path) -> dict:
    from bench.report.figures_protocol import plan_of

    try:
        return plan_of(table)
    except (OSError, ValueError):
        return {}


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
        "",
        f"The model's time per step on 16 x 8 V100 at the `paper` ratio, for each method and "
        f"density these runs sent (warm-up densities included): {'; '.join(parts)}{err}.  "
        "A configuration tuned on this machine's 2 x 2 carries its warm-up densities to the "
        "paper's cluster, where a top-k allgather over 16 nodes at a high density can cost "
        "more than dense (the times above say at which): that, not the trajectory, is where "
        "the answer measured here and the composed one part.",
    ]
