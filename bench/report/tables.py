"""The report's data and tables: one results directory read into :class:`Inputs`, runs
grouped and compared over seeds (only within one :data:`GROUP`), and the Markdown tables.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from bench import methods
from bench.report.commands import CommandMaker
from bench.results import columns as col
from bench.results import records as rec
from bench.results.paths import bench_dir
from bench.sweeps import protocol
from bench.sweeps.intervals import ci_column

GROUP = ["experiment", "cluster", "hardware"]  # runs compare only inside one such group
CONFIG = ["comm", "cache", "update"]  # a configuration, inside a group
OUTCOMES = ("ok", "target_missed", "diverged")  # runs that trained: each reached or missed


class NoRecords(Exception):
    """The results directory holds no record to draw from."""


@dataclass
class Inputs:
    """Everything read from one results directory."""

    results_dir: Path
    records: list[dict[str, Any]]
    runs: pd.DataFrame  # :func:`run_table` of the records
    problems: list[str] = field(default_factory=list)  # skipped lines, missing curves
    bench: dict[str, Path] = field(default_factory=dict)  # benchmark name -> its CSV
    ablation: list[Path] = field(default_factory=list)
    scaling: list[Path] = field(default_factory=list)


def load_inputs(results_dir: str | Path) -> Inputs:
    """Read the records, and find the curves and CSVs; :class:`NoRecords` if there are none."""
    d = Path(results_dir)
    if not d.is_dir():
        raise NoRecords(f"{d} is not a directory")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = rec.load_records(d)
    problems = [str(w.message) for w in caught]
    if not records:
        skipped = (
            f" ({len(problems)} line(s) skipped, the first: {problems[0]})" if problems else ""
        )
        raise NoRecords(f"no run record in {rec.runs_path(d)}{skipped}")
    runs = run_table(records, d)
    problems += [
        f"{r.run_id}: curve {r.curve_path} missing (the record's own numbers are used)"
        for r in runs.itertuples()
        if r.trained and not r.has_curve  # an error record may have no curve
    ]
    problems += col.older_records(records, rec.RECORD_FIELDS)
    return Inputs(
        results_dir=d,
        records=records,
        runs=runs,
        problems=problems,
        bench={p.stem: p for p in sorted(bench_dir(d).glob("*.csv"))},
        ablation=sorted((d / "ablation").glob("*.csv")),
        scaling=sorted((d / "scaling").glob("*.csv")),
    )


def num(x: Any) -> float | None:
    """A finite number, or None (absent, null, text, NaN)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def cfg_of(r: Mapping[str, Any], group: str, key: str) -> Any:
    c = r.get("config")
    g = c.get(group) if isinstance(c, dict) else None
    return g.get(key) if isinstance(g, dict) else None


def cluster_label(r: dict[str, Any]) -> str:
    """``local 2x2``, ``emulated 2x2 paper-scaled link`` (the profile's bandwidth differs a
    little between sweeps), ``emulated 2x2 at 100mbit``."""
    nnodes = num(r.get("nnodes")) or num(cfg_of(r, "cluster", "nnodes"))
    world = num(r.get("world_size"))
    per = num(cfg_of(r, "cluster", "nproc_per_node"))
    if per is None and world and nnodes:
        per = world / nnodes
    name = cfg_of(r, "cluster", "name") or "?"
    dims = f"{nnodes or 1:g}x{per:g}" if per else f"{nnodes or 1:g} node(s)"
    link, prof = "", r.get("cluster_profile")
    if name == "emulated" and isinstance(prof, dict) and prof.get("profile"):
        link = f" {prof['profile']}-scaled link"
    elif name == "emulated" and (bw := cfg_of(r, "cluster", "inter_node_bandwidth")):
        link = f" at {bw}"
    return f"{name} {dims}{link}"


def comm_label(r: dict[str, Any]) -> str:
    """The method and the knobs its spec names (``hitopk d=0.01 schedule 0.1/0.01``,
    ``powersgd r=4``), each from the record or else its config."""
    if not r.get("comm"):
        return "?"
    spec, out = methods.of(r), methods.method_of(r)
    for tag, key in spec.label_keys if spec else ():
        v = r.get(key.replace(".", "_")) or cfg_of(r, *key.split(".", 1))
        if isinstance(v, list):
            v = "/".join(f"{x:g}" for x in (num(x) for x in v) if x is not None)
            out += f" {tag} {v}" if v else ""
        elif num(v):
            out += f" {tag}={num(v):g}"
    return out


def _row(r: dict[str, Any], results_dir: Path) -> dict[str, Any]:
    run_id = str(r.get("run_id"))
    curve = rec.curve_path(results_dir, run_id)
    tt = num(r.get("time_to_target_s"))
    status = str(r.get("status") or "?")
    price = num(cfg_of(r, "results", "cost_per_hour"))  # USD per hour, where recorded
    return {
        "run_id": run_id,
        "experiment": str(r.get("experiment") or cfg_of(r, "train", "experiment") or "?"),
        "comm_name": methods.method_of(r) if r.get("comm") else "?",
        "comm": comm_label(r),
        "cache": str(r.get("cache") or "?"),
        "update": str(r.get("update") or "?"),
        "cluster": cluster_label(r),
        # the compute of the hardware line (the host is dropped for a GPU)
        "hardware": str(r.get("hardware") or "").split(";")[0].strip() or "unknown hardware",
        "seed": cfg_of(r, "train", "seed"),
        "status": status,
        "trained": status in OUTCOMES,
        "reached": status in OUTCOMES and tt is not None,
        # a tuning-protocol run's role: "tune" runs are never among the reported numbers
        "protocol_role": str((r.get("protocol") or {}).get("role") or ""),
        "protocol_trial": str((r.get("protocol") or {}).get("trial") or ""),
        "sweep_id": str(cfg_of(r, "results", "sweep_id") or ""),
        "protocol_cluster": str(cfg_of(r, "results", "protocol_cluster") or ""),
        "time_to_target_s": tt,
        # DAWNBench ranks by cost too: none is assumed where the run recorded no price
        "cost_to_target_usd": None if price is None or tt is None else price * tt / 3600,
        "metric": str(r.get("target_metric") or "?"),
        "target": num(r.get("target_value")),
        "curve_path": curve,
        "has_curve": curve.is_file(),
        # evaluations inside an epoch (train.eval_every_steps): points the curve lacks
        "evals": list(r.get("evals") or []),
    }


def run_table(records: list[dict[str, Any]], results_dir: Path) -> pd.DataFrame:
    """One row per record: identity, group, configuration and outcome."""
    return pd.DataFrame([_row(r, results_dir) for r in records])


def read(path: Path, **kw: Any) -> pd.DataFrame | None:
    """A CSV, or None when it is missing or unreadable."""
    try:
        return pd.read_csv(path, **kw)
    except (OSError, ValueError, pd.errors.ParserError):
        return None


def curve(results_dir: Path, run_id: str) -> pd.DataFrame | None:
    """A run's curve with today's column names, or None when it is missing or unreadable."""
    df = read(rec.curve_path(results_dir, run_id))
    return None if df is None else df.rename(columns=col.RENAMES)


# what names one run of a protocol sweep: a second record of it is the run made again
JOB = ["sweep_id", "protocol_role", "protocol_trial", "comm_name", "seed", "protocol_cluster"]


def latest_of_each_job(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` less each protocol run's records but its latest, as the sweep's own tables
    count them: a run made again on resume (``--rerun``, after an interruption) counts once."""
    if runs.empty or not set(JOB) <= set(runs.columns):
        return runs
    job = runs[JOB].astype(str)
    again = (runs["sweep_id"] != "") & (runs["protocol_role"] != "") & job.duplicated(keep="last")
    return runs[~again]


def config_stats(runs: pd.DataFrame) -> pd.DataFrame:
    """Per group and configuration: runs, runs reached, time to target's mean and std over seeds."""
    # a protocol's tuning and timing runs report nothing, nor does a run on a tuning seed
    runs = latest_of_each_job(runs)  # a run made again counts once, as its latest record
    trained = runs[runs["trained"] & ~runs["protocol_role"].isin(("tune", "time"))]
    trained = trained[~trained["seed"].isin((*protocol.TUNE_SEEDS, *protocol.TIMING_SEEDS))]
    rows = []
    for key, g in trained.groupby(GROUP + CONFIG, sort=True):
        reached = g[g["reached"]]
        tt = reached["time_to_target_s"].astype(float)
        usd = reached["cost_to_target_usd"].dropna().astype(float)
        priced = "" if len(usd) == len(reached) else f" ({len(usd)} of {len(reached)} runs priced)"
        rows.append(
            {
                **dict(zip(GROUP + CONFIG, key, strict=True)),
                "comm_name": g["comm_name"].iloc[0],
                "n_runs": len(g),
                "n_reached": len(tt),
                "tt_mean": tt.mean() if len(tt) else None,
                "tt_std": tt.std(ddof=1) if len(tt) > 1 else (0.0 if len(tt) else None),
                # ``$0.12 (2 of 3 runs priced)``: the runs that reached it and had a price
                "cost": f"${usd.mean():,.4g}{priced}" if len(usd) else "",
                "run_ids": list(g["run_id"]),
            }
        )
    cols = [*GROUP, *CONFIG, "comm_name", "n_runs", "n_reached", "tt_mean", "tt_std", "cost",
            "run_ids"]  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


def ratio(base: pd.Series, other: pd.Series) -> tuple[float | None, float | None]:
    """Speedup of ``other`` over ``base`` (mean time ratio) and its standard deviation
    (relative errors added in quadrature); None when either reached the target in no run."""
    bm, om = num(base.get("tt_mean")), num(other.get("tt_mean"))
    if not bm or not om:
        return None, None
    s = bm / om
    rel = math.hypot((num(base.get("tt_std")) or 0.0) / bm, (num(other.get("tt_std")) or 0.0) / om)
    return s, s * rel


def speedups(stats: pd.DataFrame) -> pd.DataFrame:
    """Each configuration against its group's baseline (same cache and update), where it ran."""
    out = []
    for _, g in stats.groupby([*GROUP, "cache", "update"], sort=True):
        base = g[g["comm_name"] == methods.baseline()]
        if base.empty or len(g) < 2:
            continue
        for _, o in g.iterrows():
            s, sd = ratio(base.iloc[0], o)
            out.append({**o.to_dict(), "speedup": s, "speedup_std": sd})
    return pd.DataFrame(out)


TUNING_SUFFIX = "-tuning"


def is_protocol(path: Path) -> bool:
    """Whether ``path`` is a protocol sweep's table or its tuning table."""
    stem = path.stem.removesuffix(TUNING_SUFFIX)
    return (path.parent / f"{stem}.plan.json").exists()


def plan_of(table: Path) -> dict[str, Any]:
    """The sweep's plan (``<sweep_id>.plan.json`` beside its table)."""
    return json.loads(table.with_name(f"{table.stem}.plan.json").read_text())


def protocol_name(table: Path) -> str:
    """The protocol a sweep's table ran (its plan's name; "" when unreadable)."""
    try:
        return str(plan_of(table).get("name", ""))
    except (OSError, ValueError):
        return ""


# the protocol whose tables answer while the current one has no sweep committed: its rules
# are retired from the code, its tables are read as files (docs/protocol.md, History)
STANDING = "equal-budget-v2"


def answering(paths: Sequence[Path]) -> str:
    """The protocol whose sweeps answer: the current one once it has a table, else STANDING."""
    names = {protocol_name(p) for p in paths if not p.stem.endswith(TUNING_SUFFIX)}
    return protocol.NAME if protocol.NAME in names else STANDING


RULES = (  # the standing protocol's (STANDING); v3's rules: docs/protocol.md
    "Protocol v2: per cluster, each method's trial of lowest median time to target on the "
    "tuning seeds (its steps x that cluster's time per step: the timing pass on the check "
    "cluster, the performance model at each paper ratio), then trained on fresh evaluation "
    "seeds.  Times are means over the evaluation seeds with a miss counted at its whole run, "
    "brackets 95 % bootstrap intervals; speedups are geometric-mean ratios with 95 % Welch "
    "intervals on log time, a win only when the interval excludes 1.0 (docs/protocol.md)."
)


def protocol_section(paths: list[Path], base: Path) -> list[str]:
    """Every sweep of the answering protocol with its tuning trials; a link to each earlier one."""
    tables = [p for p in paths if is_protocol(p) and not p.stem.endswith(TUNING_SUFFIX)]
    if not tables:
        return ["No protocol sweep yet: `python -m reproduce ablation` runs one.", ""]
    out: list[str] = []
    name = answering(tables)
    earlier = [p for p in tables if protocol_name(p) != name]
    base_name = methods.baseline()
    for p in (p for p in tables if p not in earlier):
        df = pd.read_csv(p)
        show = pd.DataFrame(
            {
                "for cluster": df["for_cluster"],
                "experiment": df["experiment"],
                "comm": df["comm"],
                "trial": df["trial"],
                "reached": [f"{a}/{b}" for a, b in zip(df["n_reached"], df["n_runs"])],
                "time to target, s": ci_column(df, "time_to_target", 1),
                f"vs {base_name}": ci_column(df, "speedup_vs_dense", 2),
                f"verdict vs {base_name}": df["verdict_vs_dense"],
                "best peer": df["best_peer"],
                "vs best peer": ci_column(df, "speedup_vs_peer", 2),
                "verdict vs peer": df["verdict_vs_peer"],
            }
        )
        out += [f"From `{rel(p, base)}` ({len(df)} configurations). {RULES}", ""]
        out += [*md_table(show), ""]
        tuning = p.with_name(f"{p.stem}{TUNING_SUFFIX}.csv")
        if tuning.exists():
            t = pd.read_csv(tuning)
            cols = ["cluster", "comm", "trial", "overrides", "n_runs", "n_reached"]
            t = t[[*cols, "median_steps", "median_time_s", "selected"]]
            t = t.astype(object).where(t.notna(), "")
            out += [f"Its tuning trials (`{tuning.name}`):", "", *md_table(t, exact=True), ""]
    if earlier:
        out += [
            "Sweeps of an earlier protocol, superseded (its rules and faults: "
            "docs/protocol.md); their tables stay as recorded:",
            "",
        ]
        for p in earlier:
            t = rel(p.with_name(f"{p.stem}{TUNING_SUFFIX}.csv"), base)
            out.append(
                f"- `{protocol_name(p) or '?'}`: [{rel(p, base)}]({rel(p, base)}), its tuning "
                f"trials [{t}]({t})"
            )
        out.append("")
    return out


def shaped_to(cluster: str) -> str | None:
    """``1.34`` of a measured cluster shaped to a named ratio (``measured-1.34``), else None."""
    head, _, ratio = cluster.partition("-")
    return ratio if head == "measured" and ratio else None


def cluster_title(cluster: str, ratio: float) -> str:
    """``paper (projected, ratio 1.34)``, ``measured at 1.34 (emulated 2 x 2)``, or an older
    sweep's check cluster (ratio NaN: measured on its clock)."""
    if ratio != ratio:
        at = shaped_to(cluster)
        return f"measured at {at} (emulated 2 x 2)" if at else f"{cluster} 2 x 2 (measured)"
    return f"{cluster} (projected, ratio {ratio:.2f})"


def verdict_text(v: Any, n: int) -> str:
    return str(v) if str(v) in ("faster", "slower") else f"no difference (n = {n})"


def target_text(metric: str, target: float | None) -> str:
    """``93 % top-5``, ``98 % top-1``, ``BLEU 90``: the target as the field says it."""
    name = "BLEU" if metric == "bleu" else metric.replace("top", "top-")
    if target is None:
        return name
    if metric == "bleu":
        return f"BLEU {100 * target:g}"
    return f"{100 * target:g} % {name}"


def rel(path: Path, base: Path) -> str:
    return Path(os.path.relpath(path, base)).as_posix()


def md_table(df: pd.DataFrame, exact: bool = False) -> list[str]:
    """A frame as Markdown table lines (numbers to 4 significant digits unless ``exact``)."""

    def cell(v: object) -> str:
        if isinstance(v, float) and not exact:
            return "" if v != v else f"{v:.4g}"
        return str(v) if exact else str(v).replace("|", "/")

    head = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + " --- |" * len(df.columns)]
    return head + [
        "| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)
    ]


def protocol_tables(inputs: Inputs) -> dict[str, Path]:
    """experiment -> the table of its newest sweep of the protocol that answers."""
    out: dict[str, Path] = {}
    name = answering([p for p in inputs.ablation if is_protocol(p)])
    for p in sorted(inputs.ablation):
        if p.stem.endswith(TUNING_SUFFIX) or protocol_name(p) != name:
            continue
        df = read(p, usecols=["experiment"])
        for exp in [] if df is None else df["experiment"].dropna().unique():
            out[str(exp)] = p
    return out


def figure_tables(inputs: Inputs) -> dict[str, Path]:
    """experiment -> the protocol table its figures draw: the answering protocol's newest,
    else the newest of an earlier protocol (a workload whose current sweep is under way)."""
    out: dict[str, Path] = {}
    for p in sorted(inputs.ablation):
        if p.stem.endswith(TUNING_SUFFIX) or not protocol_name(p):
            continue
        df = read(p, usecols=["experiment"])
        for exp in [] if df is None else df["experiment"].dropna().unique():
            out[str(exp)] = p
    return out | protocol_tables(inputs)


def not_yet(exp: str, base: Path, records: list[dict]) -> str:
    """What stands in for ``exp``'s answer while no table of the current protocol has it: its
    sweep under way (the newest plan without a table, with its recorded runs) and the older
    protocol's table it will replace; "" when neither exists."""
    said, folder = [], base / "ablation"
    plans = [(p, plan) for p in sorted(folder.glob("*.plan.json")) if (plan := _plan(p))]
    mine = [(p, plan) for p, plan in plans if plan.get("experiment") == exp]
    going = [p for p, plan in mine if plan.get("name") == protocol.NAME]
    if going and not going[-1].with_name(going[-1].name.replace(".plan.json", ".csv")).exists():
        sid = going[-1].name.removesuffix(".plan.json")
        n = sum(1 for r in records if cfg_of(r, "results", "sweep_id") == sid)
        part = folder / "partial" / f"{sid}.csv"  # its table so far, the stages recorded
        so_far = f"; its tables so far: `ablation/partial/{sid}*.csv`" if part.exists() else ""
        said.append(
            f"its `{protocol.NAME}` sweep `{sid}` is under way ({n} runs recorded{so_far}; "
            f"`python -m reproduce ablation --resume {sid}` goes on)"
        )
    older = [(p, plan["name"]) for p, plan in mine if plan.get("name") not in ("", protocol.NAME)]
    older = [(p, n) for p, n in older if p.with_name(p.name.replace(".plan.json", ".csv")).exists()]
    if older:
        p, n = older[-1]
        said.append(
            f"the `{n}` answer it replaces, whose faults v3 fixes (docs/protocol.md, History), "
            f"is `ablation/{p.name.replace('.plan.json', '.csv')}`"
        )
    return "; ".join(said)


def _plan(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def fmt_s(x: Any) -> str:
    v = num(x)
    return "-" if v is None else f"{v:,.1f} s"


# REPORT.md's "Figures" when no figure answers the question (no protocol or scaling sweep)
NO_FIGURES = (
    "No figure answers the question yet: these records hold no protocol sweep (`python -m "
    "reproduce ablation` runs one) and no scaling sweep; the figures drawn from them are in "
    "[{0}]({0})."
)


def table_cell(text: str) -> str:
    """``text`` as one Markdown table cell: a line break or a ``|`` would end the row."""
    return " ".join(str(text).split()).replace("|", "\\|")


def no_headline(names: Sequence[str], bench: Mapping[str, Path], base: Path) -> str:
    """A micro-benchmark section without a headline: what its CSVs hold, or how to measure them."""
    held = [
        f"{len(df)} rows in [{rel(bench[n], base)}]({rel(bench[n], base)})"
        for n in names
        if n in bench and (df := read(bench[n])) is not None
    ]
    if not held:
        return f"No rows recorded yet: `python -m reproduce bench {names[0]}` measures them."
    text = (
        f"Measured ({', '.join(held)}); these benchmarks have no one-line headline: their "
        "figures and tables are in the appendix."
    )
    return text + (cluster_projections(bench["cluster"]) if "cluster" in bench else "")


def cluster_projections(csv: Path) -> str:
    """The emulated-cluster benchmark's projection to the largest cluster (dense, the
    slowest link) of each machine's newest run, and why machines project differently."""
    df = read(csv, low_memory=False)
    need = {"kind", "bench_id", "hardware", "comm", "nodes", "procs_per_node", "efficiency"}
    if df is None or not need <= set(df.columns):
        return ""
    p = df[(df["kind"] == "projection") & (df["comm"] == methods.baseline())]
    p = p.dropna(subset=["efficiency"])
    parts, bands, hiddens = [], [], []
    newest = str(p["bench_id"].max()) if len(p) else ""
    for hw, g in p.groupby("hardware", sort=True):
        g = g[g["bench_id"] == g["bench_id"].max()]
        g = g[(g["nodes"] == g["nodes"].max())]
        g = g[g["procs_per_node"] == g["procs_per_node"].max()]
        link = ""
        if "bandwidth" in g.columns:  # the slowest link: its first row in the run's order
            g = g[g["bandwidth"] == g["bandwidth"].iloc[0]]
            link = f" at {g['bandwidth'].iloc[0]}"
        r = g.iloc[0]
        band = ""
        if {"efficiency_min", "efficiency_max"} <= set(g.columns) and pd.notna(r["efficiency_min"]):
            bands.append((float(r["efficiency_min"]), float(r["efficiency_max"])))
            band = f" (band {r['efficiency_min']:.2f}-{r['efficiency_max']:.2f})"
        hidden = r.get("hidden_source")
        hidden = hidden if isinstance(hidden, str) and hidden else "not recorded"
        hiddens.append(hidden.split(" (")[0].split(" of this run")[0])
        parts.append(
            f"{hw}: {r['efficiency']:.2f}{band} at {int(r['nodes'])} x "
            f"{int(r['procs_per_node'])}{link}, hidden share: {hidden} (run {r['bench_id']})"
        )
    if len(parts) < 2:
        return ""
    overlap = len(bands) == len(parts) and max(b[0] for b in bands) <= min(b[1] for b in bands)
    why = (
        "they take the share of communication hidden behind the backward pass from "
        "different sources: a share measured on CPU workers over gloo says little about V100s "
        "over NCCL, so the projection now assumes it for every method alike (central 1, band "
        f"0-1; docs/benchmarks.md) and the newest run's, {newest}, is the one to read"
        if len(set(hiddens)) > 1
        else "both take the hidden share from the same source, so they differ by what each "
        "run measured on its own CPU"
    )
    return (
        f"  Dense's projected efficiency differs by run and machine: {'; '.join(parts)}.  "
        f"They differ because {why}" + ("; their bands overlap." if overlap else ".")
    )


def record_of(inputs: Inputs, run_id: str) -> dict:
    return next(r for r in inputs.records if r.get("run_id") == run_id)


def records_section(inputs: Inputs, maker: CommandMaker) -> list[str]:
    lines = [
        "| run | experiment | comm / cache / update | cluster | hardware | status "
        "| time to target | command |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for _, r in inputs.runs.iterrows():
        cmd = maker.command(record_of(inputs, r["run_id"]))
        usd = num(r.get("cost_to_target_usd"))
        cost = f" (${usd:,.4g})" if usd is not None else ""  # only where a price is recorded
        lines.append(
            f"| {r['run_id']} | {r['experiment']} | {r['comm']} / {r['cache']} / {r['update']} | "
            f"{r['cluster']} | {r['hardware']} | {r['status']} "
            f"| {fmt_s(r['time_to_target_s'])}{cost} | `{cmd}` |"
        )
    return lines


def csv_section(
    paths: list[Path], columns: list[str], base: Path, made_by: str, runs: pd.DataFrame
) -> list[str]:
    """Each sweep CSV as a table of ``columns``, with the hardware of its runs from the records."""
    if not paths:
        return [f"No CSV yet: `{made_by}` writes one.", ""]
    hw = dict(zip(runs["run_id"], runs["hardware"], strict=True)) if len(runs) else {}

    def hardware(row: pd.Series) -> str:
        if str(row.get("kind")) == "projected":
            return "projection (alpha-beta model)"
        ids = str(row.get("run_ids", row.get("run_id", ""))).replace(",", " ").split()
        return "; ".join(sorted({hw[i] for i in ids if i in hw})) or "not in the records"

    out = []
    for p in paths:
        try:
            df = pd.read_csv(p)
        except (OSError, ValueError, pd.errors.ParserError) as e:
            out += [f"- {rel(p, base)}: unreadable ({e})", ""]
            continue
        if "hardware" not in df and len(df):
            df = df.assign(hardware=[hardware(r) for _, r in df.iterrows()])
        cols = [c for c in columns if c in df.columns]
        out += [f"From `{rel(p, base)}` ({len(df)} rows):", "", *md_table(df[cols]), ""]
    return out
