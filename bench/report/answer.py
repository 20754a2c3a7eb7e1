"""REPORT.md, its appendix and README's answer block, from one results directory: the
answer (per workload, the newest sweep of the current tuning protocol) first.
``python -m bench.report.answer`` copies it into README.md, so that the two cannot disagree.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Collection, Sequence
from pathlib import Path

import pandas as pd

from bench import methods
from bench.cluster import projection
from bench.report import versus
from bench.report.claims import comparison_section, headline_section
from bench.report.commands import CommandMaker, runs_dir, unrun_experiments
from bench.report.figures import Figure, headlines, newest_runs
from bench.report.measured import (
    and_list,
    carryover_lines,
    measured_table,
    model_speedups,
    prediction_lines,
)
from bench.report.outer import outer_topk_lines
from bench.report.scaling import scaling_lines
from bench.report.tables import (
    NO_FIGURES,
    Inputs,
    cfg_of,
    cluster_title,
    csv_section,
    is_protocol,
    no_headline,
    not_yet,
    plan_of,
    protocol_section,
    protocol_tables,
    records_section,
    rel,
    shaped_to,
    table_cell,
    target_text,
    verdict_text,
)
from bench.sweeps import ablation, protocol, scaling_table
from bench.sweeps.intervals import ci_text
from bench.sweeps.protocol_table import kept_out_runs

APPENDIX = "REPORT-appendix.md"
# what each embedded task is, in a phrase (the records name the data set, not its size)
TASKS = {
    "digits": "scikit-learn's 1,797 8x8 digits upsampled to 32 px (ResNet-9); 360 held-out "
    "images, so one image is 0.28 points of top-1",
    "translation": "the embedded translation corpus (a tiny Transformer, AdamW); BLEU on "
    "its 500 valid sentences, greedy decoding",
}


def question(ran: Collection[str] | None = None) -> str:
    """The question, naming the default paper methods and peers (of them, those in ``ran``)."""
    shown = [s for s in methods.specs() if s.default and (ran is None or s.name in ran)]
    paper = ", ".join(s.label for s in shown if s.group == "paper")
    peers = ", ".join(s.label for s in shown if s.name in methods.peers())
    return (
        f"How much sooner do the paper's methods ({paper}) reach the target than dense DDP "
        f"and than the best-tuned peer ({peers}; the one fastest on the tuning seeds for that "
        "cluster), each tuned with the same budget (`python -m reproduce ablation`, rules in "
        "`docs/protocol.md`)?"
    )


def _eval_records(records: list[dict], sweep: str) -> tuple[list[dict], int]:
    """The sweep's evaluation runs (each run's latest record), and how many records they replace."""
    every = [
        r
        for r in versus.sweep_records(records, sweep)
        if (r.get("protocol") or {}).get("role") == protocol.EVAL
    ]
    latest = list(protocol.recorded(every, rerun=()).values())
    return latest, len(every) - len(latest)


def shaped_first(records: list[dict]) -> list[dict]:
    """Runs over an emulated (shaped) link first: they carry the link and its profile."""
    return sorted(records, key=lambda r: cfg_of(r, "cluster", "name") != "emulated")


def where(records: list[dict], count: bool = True, links: pd.DataFrame | None = None) -> str:
    """The workers, nodes, hardware and link of a sweep's runs (the shaped link's first)."""
    records = shaped_first(records)
    r = records[0] if records else {}
    hw = str(r.get("hardware") or "unknown hardware").split(";")[0]
    link = r.get("link_check") or {}
    cluster = cfg_of(r, "cluster", "name")
    kind = (
        "emulated nodes" if cluster == "emulated"
        else "launcher nodes of the local cluster (loopback links, nothing shaped)"
        if cluster == "local" else "nodes"
    )  # fmt: skip
    text = f"{r.get('world_size')} workers on {r.get('nnodes')} {kind} sharing a {hw}"
    if links is not None and not links.empty:  # each measured cluster's own shaped link
        each = links.drop_duplicates("cluster")
        text += ", emulated inter-node links shaped to " + and_list(
            [
                f"{r.bandwidth_bps / 1e6:.1f} Mbit/s (ratio {r.measured_ratio:.2f} measured, "
                f"for {r.target_ratio:.2f})"
                for r in each.itertuples()
            ]
        )
        kind = str(each["cpu_kind"].iloc[0])
        return text + ("" if kind in hw else f"; the measured runs on {kind}")
    if link.get("bandwidth_gbps"):
        text += (
            f", an emulated inter-node link measured at {1e3 * link['bandwidth_gbps']:.0f} Mbit/s"
        )
    local = sum(cfg_of(x, "cluster", "name") == "local" for x in records)
    if cluster == "emulated" and local and count:
        text += (
            f" ({len(records) - local} runs; {local} more on the local cluster, loopback "
            "links, for the composed columns' steps)"
        )
    return text


def setting(
    records: list[dict],
    table: pd.DataFrame,
    plan: dict,
    again: int = 0,
    links: pd.DataFrame | None = None,
) -> str:
    """One sentence: the task, the workers, the hardware, the link, the seeds (``links``:
    the measured clusters' shaped links, each with its own measured ratio)."""
    first = shaped_first(records)[0] if records else {}
    data = str(first.get("data") or "?")
    prof = first.get("cluster_profile") or {}
    shaped = links is not None and not links.empty
    link_txt = "" if shaped else measured_ratio_text(records)
    if prof.get("target_ratio"):
        link_txt = (
            f" (scaled so dense fp32 communication / compute per step = "
            f"{prof['target_ratio']:.2f}, profile `{prof.get('profile')}`){link_txt}"
        )
    seeds = plan.get("eval_seeds") or []
    redone = (
        f", beside {again} earlier records of runs done again (refused, interrupted, or "
        "named by `--rerun`)"
        if again
        else ""
    )
    return (
        f"**Setting:** {TASKS.get(data, f'data set {data}')}; {where(records, links=links)}"
        f"{link_txt}; "
        f"every method tuned with the same budget on seeds {plan.get('tune_seeds') or []}, "
        f"then {len(seeds)} evaluation seeds {seeds} (sweep `{table['sweep_id'].iloc[0]}`, "
        f"{len(records)} evaluation runs{kept_out_clause(table)}{redone})."
    )


def kept_out_clause(table: pd.DataFrame) -> str:
    """`` (N of them on another CPU kind, ...)`` for the runs a sweep table keeps out of its
    measured rows."""
    said = [
        f"{r['comm']}'s seed {seed} at {r['for_cluster']} on {kind}"
        for _, r in table.iterrows()
        for seed, _, kind in kept_out_runs(r)
    ]
    if not said:
        return ""
    n = len(said)
    return f" ({n} of them on another CPU kind, kept out of its measured row: {and_list(said)})"


def measured_ratio(records: list[dict]) -> tuple[float, float, int] | None:
    """(communication, step) in s: the baseline's means (over the shaped link where it ran), n."""
    base = methods.baseline()
    runs = [
        r
        for r in records
        if methods.method_of(r) == base and r.get("step_time_s") and r.get("comm_s_per_step")
    ]
    shaped = [r for r in runs if (r.get("link_check") or {}).get("bandwidth_gbps")]
    runs = shaped or runs  # the runs over the shaped link, where there are some
    if not runs:
        return None
    step = sum(float(r["step_time_s"]) for r in runs) / len(runs)
    comm = sum(float(r["comm_s_per_step"]) for r in runs) / len(runs)
    return (comm, step, len(runs)) if 0 < comm < step else None


def measured_ratio_text(records: list[dict]) -> str:
    """:func:`measured_ratio` in words (``""`` without it)."""
    m = measured_ratio(records)
    if m is None:
        return ""
    comm, step, n = m
    return (
        f"; measured in {methods.baseline()}'s {n} runs: communication {1e3 * comm:.0f} ms of "
        f"a {1e3 * step:.0f} ms step, {comm / (step - comm):.2f} x the rest of it"
    )


def resolution_lines(base: Path, recs: list[dict], df: pd.DataFrame) -> list[str]:
    """How finely the evaluation runs resolve time to target, beside the table's differences
    (:mod:`bench.sweeps.resolution`); ``[]`` when no run reached the target."""
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
    for m in methods.paper():
        if m not in means:
            continue
        ref = [r for r in dict.fromkeys((methods.baseline(), peer)) if r and r != m and r in means]
        gaps.append(f"{m} {', '.join(f'{abs(means[m] - means[r]):.1f} s from {r}' for r in ref)}")
    if gaps:
        text += f"; the mean times differ by: {'; '.join(gaps)}"
    return [text + ".", ""]


STATUS = {  # a verdict against the baseline: (one method, several)
    "faster": ("is faster than", "are faster than"),
    "slower": ("is slower than", "are slower than"),
    "tie": ("cannot be told from", "cannot be told from"),
}


def column_verdict(col: versus.Column) -> str:
    """Who is first to the target in one column (or which methods tie for it), then where
    each of the paper's methods outside that group stands against the baseline."""
    tied, base = col.tied_first(), methods.baseline()
    rest = [m for m in col.order() if m not in tied]  # named instead where they are fewer
    said = f"{tied[0]} first" if len(tied) == 1 else f"{and_list(tied)} tie for first"
    if len(tied) > 3 and len(rest) < len(tied):
        said = f"every method but {and_list(rest)} ties for first"
    by: dict[str, list[str]] = {}
    for m in methods.paper():
        if m in col.times and m not in tied and base in col.times:
            by.setdefault(col.versus(base, m).verdict, []).append(m)
    for verdict, ms in by.items():
        said += f", {and_list(ms)} {STATUS[verdict][len(ms) > 1]} {base}"
    return said


def _said_at(col: versus.Column, own: float | None) -> str:
    """Where a verdict holds: ``measured at 1.34`` (a shaped cluster), ``measured at its own
    ratio 1.85`` (an older sweep's), ``projected at 5.37``."""
    if not col.measured:
        return f"projected at {col.ratio:.2f}"
    at = shaped_to(col.cluster)
    return (
        f"measured at {at}" if at else "measured" + (f" at its own ratio {own:.2f}" if own else "")
    )


def _header(col: versus.Column) -> str:
    if col.measured:
        at = shaped_to(col.cluster)
        return (
            f"**measured** at {at}: emulated 2 x 2" if at else f"**measured**: {col.cluster} 2 x 2"
        )
    return f"**projected**: `{col.cluster}`, ratio {col.ratio:.2f}"


Answer = tuple[str, list[versus.Column], float | None, dict[tuple[str, str], float]]


def short_table(answers: list[Answer]) -> list[str]:
    """Per workload a row naming the first to the target, then each paper method's speedup."""
    heads = list(dict.fromkeys(_header(c) for _, cols, *_ in answers for c in cols))
    lines = [f"| | {' | '.join(heads)} |", "| --- |" + " --- |" * len(heads)]
    base = methods.baseline()
    for exp, cols, own, model in answers:
        at = {_header(c): c for c in cols}
        cells = []
        for h in heads:
            c = at.get(h)
            tied = c.tied_first() if c else []
            old = c and c.measured and own and not shaped_to(c.cluster)  # an older sweep's
            ratio = f"(ratio {own:.2f}) " if old else ""
            rest = [m for m in c.order() if m not in tied] if c else []
            names = ", ".join(tied)
            if len(tied) > 3 and len(rest) < len(tied):
                names = f"all but {', '.join(rest)}"
            cells.append(ratio + ("tie: " if len(tied) > 1 else "") + names or "-")
        lines.append(f"| **{exp}**: first to target | {' | '.join(cells)} |")

        def cell(c: versus.Column | None, m: str, model: dict = model) -> str:
            if c is None or not {m, base} <= set(c.times):
                return "-"
            x = model.get((c.cluster, m))
            return c.versus(base, m).text() + (f" (model {x:.2f}x)" if x else "")

        for m in methods.paper():
            row = [cell(at.get(h), m) for h in heads]
            if any(c != "-" for c in row):  # a method the sweep did not run has no row
                lines.append(f"| {m} vs {base} | {' | '.join(row)} |")
    return lines


def kept_out_text(exp: str, df: pd.DataFrame) -> list[str]:
    """Per measured row of ``df`` with runs on another CPU kind kept out: its seeds, and
    which seed ran where."""
    out = []
    for _, r in df.iterrows():
        if runs := kept_out_runs(r):
            at = shaped_to(str(r["for_cluster"])) or r["for_cluster"]
            which = and_list([f"seed {s} ran on {k}" for s, _, k in runs])
            out.append(
                f"{int(r['n_runs'])} for {exp}'s {r['comm']} measured at {at}: its {which}, "
                "another CPU kind, and is kept out of that column (its steps count in "
                "the projections)"
            )
    return out


def legend_line(n_seeds: int, shaped: bool = True, kept_out: Sequence[str] = ()) -> str:
    a = projection.ASSUMPTIONS
    nic, hid = a["nic_efficiency"], a["hidden"]
    how = (
        "its link shaped until dense's measured communication / compute is the named ratio "
        "within 15 % (model: the performance model's prediction, made before the runs)"
        if shaped
        else "at the communication / compute ratio its baseline measured"
    )
    return (
        f"Cells: speedup in time to target over {methods.baseline()} DDP [95 % interval over "
        f"{n_seeds} evaluation seeds{''.join(f'; {k}' for k in kept_out)}]; "
        "measured: end to end on an emulated 2 x 2's clock, "
        f"{how}; projected: each run's "
        "steps to target x the performance model's step time on 16 x 8 V100 at 25 Gbit/s at "
        "that ratio of dense fp32 communication to compute, its band the interval's range "
        f"over the model's assumptions (NIC efficiency {nic.low:g}-{nic.high:g}, hidden "
        f"communication {hid.low:g}-{hid.high:g}) and, for a method whose steps do not carry "
        "over to 8 nodes as dense's do, over that factor's interval; tie: the interval or the "
        "band holds 1, "
        "first: told from every other by both."
    )


def answer_table_v2(df: pd.DataFrame) -> list[str]:
    """Methods x clusters: each method's speedup over dense and its selected trial."""
    order = list(dict.fromkeys(df["for_cluster"]))
    ratio = {c: float(df[df["for_cluster"] == c]["ratio"].iloc[0]) for c in order}
    head = "| method | " + " | ".join(cluster_title(c, ratio[c]) for c in order) + " |"
    lines = [head, "| --- |" + " --- |" * len(order)]
    for comm in dict.fromkeys(df["comm"]):
        name = f"**{comm}** (paper)" if comm in methods.paper() else str(comm)
        cells = []
        for c in order:
            hit = df[(df["for_cluster"] == c) & (df["comm"] == comm)]
            if hit.empty:
                cells.append("-")
                continue
            r = hit.iloc[0]
            key = "speedup_vs_dense"
            text = ci_text(r[key], r[f"{key}_ci_low"], r[f"{key}_ci_high"], 2, "x")
            if comm == methods.baseline():
                text = f"1 (baseline, {r['time_to_target_mean_s']:.1f} s)"
            elif text != "-":
                text += " " + verdict_text(r["verdict_vs_dense"], int(r["n_runs"]))
            cells.append(f"{text} `{r['trial']}`")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def answer_sections(
    records: list[dict], tables: dict[str, Path], base: Path
) -> tuple[list[str], list[str], list[str], dict[str, list[versus.Column]]]:
    """(the short answer, the answer per workload, the appendix's part, each workload's
    columns) from ``tables`` (experiment -> its newest protocol table)."""
    sentences, settings, detail, appendix = [], [], [], []
    answers: list[Answer] = []
    seeds, ran, kept_out = 0, set(), []
    for name, exp in protocol.WORKLOADS.items():
        detail += [f"### {exp} ({name} workload)", ""]
        table = tables.get(exp)
        if table is None:
            said = not_yet(exp, base, records)
            settings.append(f"{exp}: {said or f'no sweep (`ablation --workload {name}` runs one)'}")
            detail += [
                f"No `{protocol.NAME}` answer for {exp} yet: {said}."
                if said
                else f"No protocol sweep of {exp} is recorded here, so no answer: `python -m "
                f"reproduce ablation --workload {name} --results-dir {runs_dir(base)}` runs one.",
                "",
            ]
            continue
        df = pd.read_csv(table)
        ran |= set(df["comm"])
        recs, again = _eval_records(records, table.stem)
        target = target_text(str(df["target_metric"].iloc[0]), float(df["target_value"].iloc[0]))
        cols = sorted(versus.columns(base, df, records), key=lambda c: (not c.measured, c.ratio))
        m = measured_ratio(shaped_first(recs))
        own = m[0] / (m[1] - m[0]) if m else None
        parts = [f"{_said_at(c, own)}: {column_verdict(c)}" for c in cols]
        sentences.append(f"- **{exp}** (to {target}): {'; '.join(parts)}.")
        mt = measured_table(table)
        answers.append((exp, cols, own, model_speedups(mt)))
        seeds = max(seeds, int(df["n_runs"].max()))
        kept_out += kept_out_text(exp, df)
        settings.append(f"{exp} ({target}): {where(recs, count=False, links=mt)}")
        t = rel(table, base)
        detail += [
            setting(recs, df, plan_of(table), again, links=mt),
            "",
            f"Speedup over {methods.baseline()} of each method's configuration tuned for that "
            "cluster (95 % Welch interval on log time over the evaluation seeds); a measured "
            "column is the runs' own clock on an emulated 2 x 2, the projected ones compose "
            "each run's logged steps with the model's time per step:",
            "",
            *answer_table_v2(df),
            "",
            f"Table: `{t}`; every trial, its runs and the selection per cluster: "
            f"`{t[:-4]}-tuning.csv`.",
            "",
            *prediction_lines(mt, t[:-4]),
            *carryover_lines(table, t[:-4]),
            *outer_topk_lines(cols, [_header(c) for c in cols]),
        ]
        appendix += [f"### {exp}", "", *resolution_lines(base, recs, df[df["ratio"].isna()])]
    short = [question(ran or None), ""]
    if answers:
        shaped = any(shaped_to(c.cluster) for _, cols, _, _ in answers for c in cols)
        short += [
            *sentences,
            "",
            *short_table(answers),
            "",
            legend_line(seeds, shaped, kept_out),
            "",
        ]
    standing = older_standing({e: str(plan_of(t).get("name", "")) for e, t in tables.items()})
    short.append(
        "**Setting:** every method tuned with the same budget for each column, then trained "
        f"on fresh evaluation seeds; {'; '.join(settings)}; each in full: below.{standing}"
    )
    return [*short, ""], detail, appendix, {a[0]: a[1] for a in answers}


def older_standing(names: dict[str, str]) -> str:
    """The Setting's last sentence where a workload's newest table is an older protocol's
    (``names``: experiment -> its sweep's protocol name), else ""."""
    older = {e: n for e, n in names.items() if n and n != protocol.NAME}
    if not older:
        return ""
    return (
        f" The {' and '.join(sorted(older))} numbers are from sweeps of "
        f"`{', '.join(sorted(set(older.values())))}`, whose faults v3 fixes (docs/protocol.md, "
        f"History); no `{protocol.NAME}` sweep of {'them' if len(older) > 1 else 'it'} has "
        "landed yet."
    )


def bench_headlines(inputs: Inputs) -> dict[str, list[tuple[str, str]]]:
    """name -> [(hardware, headline)] from each hardware's newest run."""
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


def write_report(inputs: Inputs, figs: list[Figure], path: Path, header: str) -> Path:
    """Write the report and its appendix beside it."""
    maker = CommandMaker()
    base = path.parent
    problems = [f"- {p}" for p in inputs.problems] or ["- none"]
    unrun = unrun_experiments(inputs.runs["experiment"])
    tables = protocol_tables(inputs)
    rows = bench_headlines(inputs)
    main_figs = [
        f
        for f in figs
        if f.kind in ("speedup", "ratios", "tta", "breakdown") and f.experiment in tables
    ] + [f for f in figs if f.kind == "scaling"]
    other_figs = [f for f in figs if f not in main_figs and f.kind != "bench"]
    short, detail, appendix, columns = answer_sections(inputs.records, tables, base)
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
        *scaling_lines(inputs.scaling),
        "## Micro-benchmarks",
        "",
        "Each against the strongest baseline in the same run first (torch.topk, torch's "
        "fused optimizers, no cache), naive loops only after; their figures are in the "
        "appendix.",
        "",
        *bench_sections(rows, inputs.bench, base),
        "## The paper's claims beside ours",
        "",
        *headline_section(inputs, maker, rows, tables, columns),
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
            [*ablation.REPORT_COLUMNS, "hardware"],
            base,
            "python -m reproduce ablation --grid",
            inputs.runs,
        ),
        "## Scaling",
        "",
        *csv_section(
            inputs.scaling,
            [*scaling_table.REPORT_COLUMNS, "hardware"],
            base,
            "python -m reproduce scaling",
            inputs.runs,
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
    """Per machine of the records (every attempt): how many name it, first and last date."""
    from bench.results.records import load_records

    seen: dict[str, list[str]] = {}
    for rec in load_records(results, attempts=True):
        seen.setdefault(rec.get("hardware") or "not recorded", []).append(
            str(rec.get("started_at") or "")[:10]
        )
    out = []
    for hw, days in sorted(seen.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        dated = sorted(d for d in days if d) or [""]
        span = dated[0] if dated[0] == dated[-1] else f"{dated[0]} to {dated[-1]}"
        when = f" ({span})" if span else ""
        out.append(f"- {len(days)} record{'' if len(days) == 1 else 's'}: {hw}{when}")
    return out


def _put(readme: str, start: str, end: str, body: str) -> str:
    head, rest = readme.split(start, 1)
    tail = rest.split(end, 1)[1]
    return f"{head}{start}\n{body}\n{end}{tail}"


def rewrite(readme: str, report: str, results: Path | None = None) -> str:
    """README with its answer block from ``report``, its hardware block from ``results``."""
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
