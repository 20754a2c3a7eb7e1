"""The report's figures, from records, curves and CSVs alone: :func:`plan` lists every
figure the inputs support, :func:`draw` draws them."""

from __future__ import annotations

import tempfile
import textwrap
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from bench import methods  # noqa: E402
from bench.benchmarks import load_all  # noqa: E402
from bench.benchmarks.harness import BenchRun  # noqa: E402
from bench.report.scaling import plot_scaling, read_scaling, scaling_caption  # noqa: E402
from bench.report.tables import (  # noqa: E402
    CONFIG,
    GROUP,
    Inputs,
    cluster_title,
    config_stats,
    curve,
    figure_tables,
    num,
    protocol_name,
    speedups,
    target_text,
)
from bench.report.tta import PER_ROW, plot_tta  # noqa: E402
from bench.results.plots import PHASE_COLOURS, fig_width, save_figure  # noqa: E402
from bench.sweeps import ratios  # noqa: E402
from bench.sweeps.intervals import ci_text  # noqa: E402
from bench.sweeps.protocol_table import kept_out_runs  # noqa: E402

# per-step phases of a curve row: (label, column(s)); the first column present is used
PHASES = (
    ("data wait", ("time/data_s",)),
    ("forward+backward", ("time/compute_s",)),
    ("selection", ("time/select_s",)),
    ("communication", ("comm/exposed_s", "time/exposed_comm_s", "time/comm_s")),
    ("optimizer update", ("time/update_s",)),
)
EXPOSED = ("comm/exposed_s", "time/exposed_comm_s")


def slug(text: str) -> str:
    """A file-name-safe form of a label."""
    out = "".join(c.lower() if c.isalnum() else "-" for c in text)
    return "-".join(p for p in out.split("-") if p)


def _panels(n: int, w: float, h: float, **kw: Any):
    """``n`` panels in rows of at most :data:`PER_ROW`, the figure capped in width."""
    cols = min(n, PER_ROW)
    rows = -(-n // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(fig_width(cols, w), h * rows), squeeze=False, **kw
    )
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.axis("off")
    return fig, flat[:n]


def plot_speedup(
    stats: pd.DataFrame, experiment: str, path: Path, target: str = "target"
) -> Path | None:
    """Speedup over dense per configuration (mean +- std over seeds; a miss in every run at
    0), a panel per cluster and hardware, where no protocol sweep gives intervals."""
    sp = speedups(stats[stats["experiment"] == experiment])
    if sp.empty:
        return None
    groups = list(sp.groupby(["cluster", "hardware"], sort=True))
    most = int(sp.groupby(["cluster", "hardware"]).size().max())
    fig, axes = _panels(len(groups), w=max(5.0, 0.9 * most), h=4.6)
    for ax, ((cluster, hw), g) in zip(axes, groups, strict=True):
        labels = [" / ".join(str(r[c]) for c in CONFIG) for _, r in g.iterrows()]
        heights = [num(s) or 0.0 for s in g["speedup"]]
        errs = [num(s) or 0.0 for s in g["speedup_std"]]
        colours = [methods.colour(c) for c in g["comm_name"]]
        ax.bar(range(len(g)), heights, yerr=errs, capsize=4, color=colours)
        for i, (_, r) in enumerate(g.iterrows()):
            txt = f"{r['n_reached']}/{r['n_runs']}"
            ax.text(i, heights[i], txt, ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="k", lw=1, ls="--")
        ax.set_xticks(range(len(g)), labels, rotation=35, ha="right", fontsize=6)
        ax.set_ylabel(f"speedup in time to {target} over dense (x)")
        ax.set_title(f"{cluster}\n{hw}", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(
        f"{experiment}: speedup over dense DDP (mean +- std over seeds; "
        "number: runs reached / runs)",
        fontsize=10,
    )
    return save_figure(fig, path)


def step_phases(df: pd.DataFrame, exchange_in_update: bool = False) -> dict[str, float] | None:
    """Mean seconds per step of each phase over a curve's epochs (None without phases); the
    exchange timed in the hook comes out of compute (``exchange_in_update``: the update)."""
    if "time/compute_s" not in df:
        return None
    out = {}
    for label, cols in PHASES:
        col = next((c for c in cols if c in df), None)
        v = float(df[col].mean()) if col is not None else 0.0
        out[label] = 0.0 if v != v else v
    inner = out["selection"] + out["communication"]
    holder = "optimizer update" if exchange_in_update else "forward+backward"
    out[holder] = max(0.0, out[holder] - inner)
    return out


def breakdown_table(results_dir: Path, runs: pd.DataFrame, experiment: str) -> pd.DataFrame:
    """Mean per-step phase times (s) per group and configuration over its runs' curves, with
    ``n`` (runs averaged) and ``label`` (method and tuned trial, or the comm label)."""
    rows = []
    for _, r in runs[(runs["experiment"] == experiment) & runs["has_curve"]].iterrows():
        df = curve(results_dir, r["run_id"])
        name = str(r["comm_name"])
        inside = name in methods.METHODS and methods.get(name).exchange_in_update
        ph = step_phases(df, inside) if df is not None else None
        if ph:
            exposed = any(c in df for c in EXPOSED)
            trial = str(r.get("protocol_trial") or "")
            label = f"{name} {trial}" if trial else str(r["comm"])
            if inside and not df.get("time/comm_s", pd.Series([0.0])).any():  # not timed yet
                label += " (update holds its all-gather)"
            keys = {k: r[k] for k in GROUP + CONFIG}
            rows.append({**keys, **ph, "exposed": exposed, "label": label, "comm_name": name})
    if not rows:
        return pd.DataFrame()
    t = pd.DataFrame(rows).groupby(GROUP + CONFIG, sort=True)
    out = t[[p for p, _ in PHASES]].mean()
    out["exposed"] = t["exposed"].all()
    out[["label", "comm_name"]] = t[["label", "comm_name"]].first()
    out["n"] = t.size()
    return out.reset_index()


def plot_breakdown(table: pd.DataFrame, experiment: str, path: Path) -> Path | None:
    """Stacked per-step time (ms) by phase, a bar per configuration, a panel per cluster and
    hardware."""
    if table.empty:
        return None
    groups = list(table.groupby(["cluster", "hardware"], sort=True))
    most = int(table.groupby(["cluster", "hardware"]).size().max())
    # one x scale for every panel: the same ms reads the same length side by side
    fig, axes = _panels(len(groups), w=7.0, h=2.3 + 0.3 * most, sharex=True)
    for ax, ((cluster, hw), g) in zip(axes, groups, strict=True):
        left = np.zeros(len(g))
        for label, _ in PHASES:
            vals = 1e3 * g[label].to_numpy(dtype=float)
            ax.barh(range(len(g)), vals, left=left, color=PHASE_COLOURS[label], label=label)
            left = left + vals
        varying = [c for c in CONFIG[1:] if g[c].astype(str).nunique() > 1]
        names = [
            " / ".join([str(r["label"]), *(str(r[c]) for c in varying)]) + f" (n = {r['n']})"
            for _, r in g.iterrows()
        ]
        ax.set_yticks(range(len(g)), names, fontsize=8)
        for t, c in zip(ax.get_yticklabels(), g["comm_name"], strict=True):
            t.set_color(methods.colour(c))  # the method's colour: the bars are the phases'
        ax.invert_yaxis()
        ax.set_xlabel("ms per step (mean over epochs, runs)")
        ax.xaxis.set_tick_params(labelbottom=True)  # shared, yet each panel keeps its numbers
        common = ", ".join(f"{c} {g[c].iloc[0]}" for c in CONFIG[1:] if c not in varying)
        where = "\n".join(textwrap.wrap(f"{cluster}; {hw}", 48))  # fits over a narrow panel
        ax.set_title(where + (f"\nevery bar: {common}" if common else ""), fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    exposed = bool(table["exposed"].all())
    note = (
        "exposed communication"
        if exposed
        else "communication time measured in the hook, not exposed"
    )
    h, labels = axes[0].get_legend_handles_labels()
    fig.legend(h, labels, loc="lower center", ncol=len(PHASES), fontsize=7, frameon=False)
    fig.suptitle(f"{experiment}: per-step time by phase\n({note})", fontsize=10)
    h_in = fig.get_figheight()
    fig.tight_layout(rect=(0, 0.35 / h_in, 1, 1))
    return save_figure(fig, path, layout=False)


def _speedup_blocks(df: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(heading, best peer, rows by speedup over dense) per cluster of a protocol table."""
    out = []
    for cluster, g in df.groupby("for_cluster", sort=False):
        named = g["best_peer"].dropna().astype(str)
        named = named[named != ""]
        g = g.sort_values("speedup_vs_dense", ascending=False, na_position="first")
        title = cluster_title(str(cluster), float(g["ratio"].iloc[0]))
        out.append((title, str(named.iloc[0]) if len(named) else "peer", g))
    return out


def plot_protocol_speedup(df: pd.DataFrame, path: Path, title: str) -> Path | None:
    """Speedup over dense and over the best peer (two panels), a row per method's selected
    trial with its 95 % interval and verdict, a block of rows per cluster of the table."""
    if df.empty or "speedup_vs_dense" not in df:
        return None
    rows: list[tuple[float, pd.Series, str]] = []  # (y, row, the block's peer)
    heads: list[tuple[float, str]] = []
    y = 0.0
    for head, peer, g in _speedup_blocks(df):
        heads.append((y, f"{head}; best peer {peer}"))
        y += 1
        for _, r in g.iterrows():
            rows.append((y, r, peer))
            y += 1
        y += 0.4
    height = 1.7 + 0.36 * y
    fig, axes = plt.subplots(1, 2, figsize=(fig_width(2, 6.2), height), sharey=True)
    base, paper = methods.baseline(), methods.paper()
    n_seeds = int(df["n_runs"].max())
    panels = (("speedup_vs_dense", f"{base} DDP"), ("speedup_vs_peer", "its cluster's best peer"))
    for ax, (key, label) in zip(axes, panels, strict=True):
        for i, r, peer in rows:
            m, lo, hi = r[key], r[f"{key}_ci_low"], r[f"{key}_ci_high"]
            itself = r["comm"] == (base if key == "speedup_vs_dense" else peer)
            if itself:
                ax.annotate("the baseline", (1.0, i), xytext=(6, 0), textcoords="offset points",
                            va="center", fontsize=7)  # fmt: skip
                continue
            if m != m:
                continue
            colour = methods.colour(r["comm"])
            err = [[max(0.0, m - lo)], [max(0.0, hi - m)]] if lo == lo else None
            style = {"ms": 8, "lw": 2.2} if r["comm"] in paper else {"ms": 6, "lw": 1.4}
            ax.errorbar([m], [i], xerr=err, fmt="o", color=colour, capsize=4, **style)
            verdict = str(r[key.replace("speedup", "verdict")])
            verdict = verdict if verdict in ("faster", "slower") else "no difference"
            ax.annotate(
                f"{ci_text(m, lo, hi, 2, 'x')}, {verdict}",
                (hi if hi == hi else m, i),
                xytext=(6, 0),
                textcoords="offset points",
                va="center",
                fontsize=7,
                bbox={"fc": "white", "ec": "none", "pad": 0.5},  # over the line at 1
            )
        for h, _ in heads[1:]:
            ax.axhline(h - 0.7, color="0.6", lw=0.6)
        ax.axvline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xlabel(f"speedup over {label} (> 1: sooner to target)")
        ax.grid(alpha=0.3, axis="x")
        lo_all = pd.concat([df[f"{key}_ci_low"], df[key]]).min()
        hi_all = pd.concat([df[f"{key}_ci_high"], df[key]]).max()
        if lo_all == lo_all and hi_all == hi_all:
            left = min(0.8, lo_all - 0.1)  # room on the right for the written interval
            ax.set_xlim(left, max(1.25, hi_all + 0.8 * (hi_all - left)))
    axes[1].patch.set_visible(False)  # a heading runs on across both panels
    for h, text in heads:  # on the row kept free for it
        axes[0].text(0.01, h, text, transform=axes[0].get_yaxis_transform(), fontsize=8.5,
                     fontweight="bold", va="center", clip_on=False)  # fmt: skip
    labels = [f"{r['comm']} {r['trial']} ({r['n_reached']}/{r['n_runs']})" for _, r, _ in rows]
    axes[0].set_yticks([i for i, _, _ in rows], labels, fontsize=8)
    axes[0].set_ylim(y - 0.4, -0.6)
    for t, (_, r, _) in zip(axes[0].get_yticklabels(), rows, strict=True):
        t.set_color(methods.colour(r["comm"]))
        if r["comm"] in paper:
            t.set_fontweight("bold")
    how = (
        "point: geometric-mean ratio of times to target (a miss: its whole run); bar: 95 % "
        f"Welch interval on log time over {n_seeds} evaluation seeds; (k/n): seeds that "
        "reached the target"
    )
    out = df[df["kept_out"].fillna("") != ""] if "kept_out" in df.columns else df.iloc[:0]
    if not out.empty:  # a measured row of fewer seeds: its runs on another CPU kind
        how += "\n" + "; ".join(
            f"{r['comm']} at {r['for_cluster']}: {r['n_runs']} seeds ({r['kept_out']}: another "
            "CPU kind, kept out)"
            for _, r in out.iterrows()
        )
    fig.suptitle(f"{title}\n{how}", fontsize=9)
    lines = 2 + how.count("\n")  # the title's, clear of the first heading
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.17 * lines / height))
    return save_figure(fig, path, layout=False)


HEADLINE = "paper"  # the cluster whose tuned configurations a sweep's ratio figure draws


def table_run_ids(table: pd.DataFrame) -> set[str]:
    """The run ids a sweep table counts (its ``run_ids`` column; empty without one)."""
    if "run_ids" not in table:
        return set()
    return {i for v in table["run_ids"].dropna() for i in str(v).replace(",", " ").split()}


def kept_out_ids(table: pd.DataFrame) -> set[str]:
    """The runs a sweep table keeps out of its measured rows."""
    return {rid for _, r in table.iterrows() for _, rid, _ in kept_out_runs(r)}


def ratios_table(results_dir: Path, table: pd.DataFrame) -> pd.DataFrame:
    """The composition (:func:`bench.sweeps.ratios.compose`) of the sweep's evaluation runs
    of each method's configuration tuned for :data:`HEADLINE`; empty when it cannot be made."""
    sweep = str(table["sweep_id"].iloc[0])
    if (table["for_cluster"] == HEADLINE).any():
        table = table[table["for_cluster"] == HEADLINE]  # one configuration per method
    ids = table_run_ids(table)

    def select(r: Mapping[str, Any]) -> bool:
        res = (r.get("config") or {}).get("results") or {}
        return res.get("sweep_id") == sweep and (not ids or r.get("run_id") in ids)

    runs, _ = ratios.load_runs(results_dir, select, group=methods.method_of)
    if "steps_factor" in table:  # a configuration whose steps do not carry over to 8 nodes
        f = {i: float(v) for ids_, v in zip(table["run_ids"], table["steps_factor"], strict=True)
             if v == v for i in str(ids_).replace(",", " ").split()}  # fmt: skip
        runs = [replace(r, factor=f.get(r.run_id, 1.0)) for r in runs]
    if not runs or methods.baseline() not in {r.group for r in runs}:
        return pd.DataFrame()
    grid = sorted(set(ratios.GRID) | set(ratios.named_ratios().values()))
    return ratios.compose(runs, grid, n_boot=2000)


def newest_runs(csv: Path, problems: list[str] | None = None) -> list[tuple[str, pd.DataFrame]]:
    """(hardware, rows of its newest run) per hardware of a benchmark CSV; unreadable: a problem."""
    try:
        df = pd.read_csv(csv)
    except (OSError, ValueError, pd.errors.ParserError) as e:
        if problems is not None and not any(str(csv) in p for p in problems):
            problems.append(f"{csv}: unreadable, its figure and numbers are left out ({e})")
        return []
    if df.empty or "bench_id" not in df:
        return []
    if "hardware" not in df:
        df = df.assign(hardware="unknown hardware")
    out = []
    for hw in df["hardware"].dropna().unique():
        sub = df[df["hardware"] == hw]
        out.append((str(hw), sub[sub["bench_id"] == sub["bench_id"].iloc[-1]]))
    return out


def replot(name: str, rows: pd.DataFrame, png: Path) -> list[Path]:
    """One hardware's newest run of benchmark ``name`` drawn by the benchmark's own replot;
    the files it drew."""
    files = [png, *(png.with_suffix(f".{what}.png") for what in ("scaling", "overlap"))]
    for old in files:
        old.unlink(missing_ok=True)  # this command's own figure of an earlier call
    with tempfile.TemporaryDirectory() as tmp:
        load_all().get(name).replot(BenchRun.from_rows(name, rows, tmp, png))
    return [p for p in files if p.is_file()]


def headlines() -> dict[str, Callable[[pd.DataFrame], list[str]]]:
    """name -> the headline function of each benchmark that has one."""
    reg = load_all()
    return {n: reg.get(n).headline for n in reg.names() if reg.get(n).headline is not None}


@dataclass
class Figure:
    path: Path
    what: str  # one line: what it shows and from which inputs
    make: Callable[[], object] = field(repr=False)
    kind: str = ""  # tta, speedup, breakdown, scaling, bench
    experiment: str = ""
    drawn: bool = False
    error: str = ""
    extra: list[Path] = field(default_factory=list)  # further files the same call drew


MAX_GROUPS = 6  # panels of an experiment's figures without a protocol sweep (largest first)


def figure_runs(inputs: Inputs, exp: str, yours: Collection[str]) -> tuple[pd.DataFrame, str]:
    """The runs an experiment's figures draw and a phrase saying which: its newest protocol
    sweep's evaluation runs, else the :data:`MAX_GROUPS` largest groups'; never ``yours``."""
    runs = inputs.runs
    mine = runs[(runs["experiment"] == exp) & runs["trained"] & ~runs["run_id"].isin(yours)]
    table = figure_tables(inputs).get(exp)
    if table is not None:
        ev = mine[(mine["sweep_id"] == table.stem) & (mine["protocol_role"] == "eval")]
        # the runs the table counts: a run done again draws its latest record, not both;
        # a run kept out of its measured row (another CPU kind) is on no clock drawn here
        t = pd.read_csv(table)
        ids = table_run_ids(t) - kept_out_ids(t)
        ev = ev[ev["run_id"].isin(ids)] if ids else ev
        if not ev.empty:
            return ev, f"the evaluation runs of protocol sweep {table.stem}"
    mine = mine[mine["protocol_role"] != "tune"]
    sizes = mine.groupby(["cluster", "hardware"]).size().sort_values(ascending=False)
    keep = set(sizes.index[:MAX_GROUPS])
    left = len(sizes) - len(keep)
    picked = mine[[k in keep for k in zip(mine["cluster"], mine["hardware"], strict=True)]]
    more = f"; {left} smaller group(s) in the records table" if left else ""
    return picked, f"{len(picked)} run(s) in {len(keep)} cluster/hardware group(s){more}"


def _experiment_figures(
    inputs: Inputs, exp: str, stats: pd.DataFrame, yours: Collection[str]
) -> list[Figure]:
    runs, which = figure_runs(inputs, exp, yours)
    r = inputs.runs
    mine = r[(r["experiment"] == exp) & r["run_id"].isin(yours) & r["trained"] & r["has_curve"]]
    if runs.empty and mine.empty:
        return []
    res, table, out = inputs.results_dir, figure_tables(inputs).get(exp), []

    def add(kind: str, what: str, make: Callable[[Path], object]) -> None:
        path = inputs.results_dir / "figures" / f"{kind}_{slug(exp)}.png"
        out.append(Figure(path, f"{exp}: {what}", lambda: make(path), kind, exp))

    curves = bool(runs["has_curve"].sum())
    if curves or not mine.empty:
        what = f"time to accuracy, mean and band over seeds, of {which}"
        tta = runs
        if table is not None:  # the measured column's runs: the local cluster's wall time
            # (loopback links) is no column of the answer, only its runs' steps are
            ids = table_run_ids((t := pd.read_csv(table))[t["ratio"].isna()])
            tta = runs[runs["run_id"].isin(ids)] if runs["run_id"].isin(ids).any() else runs
            if len(tta) < len(runs):
                what += " in the answer's measured column (the local cluster's only give steps)"
        what += f", and your {len(mine)} run(s) on their own" if not mine.empty else ""
        add("tta", what, lambda p: plot_tta(res, tta, exp, p, yours=mine))
    if runs.empty:
        return out
    if table is not None:
        which_sweep = f"protocol sweep {table.stem} (`{protocol_name(table)}`)"
        title = f"{exp}: each method's tuned configuration, {which_sweep}"
        what = f"speedup over dense and the best peer with 95 % intervals, {table.name}"
        add("speedup", what, lambda p: plot_protocol_speedup(pd.read_csv(table), p, title))
        what = (
            f"speedup against communication / compute ratio, {table.name}'s evaluation runs "
            "composed with the performance model"
        )
        title2 = (
            f"{exp}: time to target across ratios, {which_sweep}, each method's "
            f"configuration tuned for `{HEADLINE}`"
        )

        def draw_ratios(p: Path) -> Path | None:
            df = ratios_table(res, pd.read_csv(table))
            return None if df.empty else ratios.plot(df, p, title2)

        add("ratios", what, draw_ratios)
    elif not speedups(stats[stats["experiment"] == exp]).empty:
        what = f"speedup over dense (mean +- std over seeds), {which}"
        target = target_text(runs["metric"].iloc[0], runs["target"].iloc[0])
        add("speedup", what, lambda p: plot_speedup(config_stats(runs), exp, p, target))
    if curves:
        what = f"per-step time by phase, {which}"
        add("breakdown", what, lambda p: plot_breakdown(breakdown_table(res, runs, exp), exp, p))
    return out


def plan(
    inputs: Inputs, experiments: list[str] | None = None, yours: Collection[str] = ()
) -> list[Figure]:
    """Every figure the inputs support; with ``experiments``, only theirs (not the scaling
    study's or the benchmarks').  ``yours``: a user's run ids, drawn on their own."""
    stats = config_stats(inputs.runs)
    out = []
    for exp in sorted(inputs.runs["experiment"].unique()):
        if experiments is None or exp in experiments:
            out += _experiment_figures(inputs, exp, stats, yours)
    if experiments is not None:
        return out
    where = inputs.results_dir / "figures"
    if inputs.scaling:
        p, what = where / "scaling_efficiency.png", scaling_caption(inputs.scaling)
        out.append(
            Figure(p, what, lambda p=p: plot_scaling(read_scaling(inputs.scaling), p), "scaling")
        )
    known = set(load_all().names())
    for name, csv in inputs.bench.items():
        for hw, rows in newest_runs(csv, inputs.problems) if name in known else []:
            p = where / f"bench_{name}_{slug(hw.split(';')[0])}.png"
            what = (
                f"bench {name}: newest run {rows['bench_id'].iloc[0]} on {hw.split(';')[0]} "
                f"({len(rows)} rows of {csv.name})"
            )
            out.append(Figure(p, what, lambda n=name, r=rows, p=p: replot(n, r, p), "bench", name))
    return out


def draw(figs: list[Figure]) -> list[Figure]:
    """Draw each figure; one that fails or has nothing to draw is marked, not fatal."""
    for f in figs:
        try:
            res = f.make()
        except Exception as e:  # noqa: BLE001 - a bad input skips its figure, not the report
            f.error = f"{type(e).__name__}: {e}"
            continue
        if isinstance(res, list):  # a benchmark's files
            f.extra, res = [p for p in res if p != f.path], res or None
        f.drawn = res is not None
    return figs
