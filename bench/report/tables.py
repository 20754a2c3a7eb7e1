"""The report's data and tables: one results directory read into :class:`Inputs`, runs
grouped and compared over seeds, and the Markdown tables built from them.

Runs compare only within one experiment, cluster and hardware (:data:`GROUP`); a protocol
sweep's tables come from :mod:`bench.sweeps.protocol`.  The paper's numbers are cited
constants (:data:`SPEEDUP_CLAIM`, :data:`RECORDS`); a run's command is recovered from its
config with Hydra (:class:`CommandMaker`).
"""

from __future__ import annotations

import enum
import math
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bench.config import register_configs
from bench.methods import method_of, peers
from bench.results import columns as col
from bench.results import records as rec
from bench.results.env import REPO_ROOT
from bench.results.paths import bench_dir
from bench.sweeps.intervals import ci_column

GROUP = ["experiment", "cluster", "hardware"]  # runs compare only inside one such group
CONFIG = ["comm", "cache", "update"]  # a configuration, inside a group
OUTCOMES = ("ok", "target_missed", "diverged")  # runs that trained: each reached or missed
SPARSE = ("topk", "mstopk", "randomk", "hitopk")
OURS = ("hitopk", "mstopk")  # the paper's methods

PEERS = peers()  # what a user would pick instead of dense fp32


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


def _cfg(r: dict[str, Any], group: str, key: str) -> Any:
    c = r.get("config")
    g = c.get(group) if isinstance(c, dict) else None
    return g.get(key) if isinstance(g, dict) else None


def cluster_label(r: dict[str, Any]) -> str:
    """``local 2x2``: the launcher, nodes x workers per node."""
    nnodes = num(r.get("nnodes")) or num(_cfg(r, "cluster", "nnodes"))
    world = num(r.get("world_size"))
    per = num(_cfg(r, "cluster", "nproc_per_node"))
    if per is None and world and nnodes:
        per = world / nnodes
    name = _cfg(r, "cluster", "name") or "?"
    dims = f"{nnodes or 1:g}x{per:g}" if per else f"{nnodes or 1:g} node(s)"
    return f"{name} {dims}{link_label(r) if name == 'emulated' else ''}"


def link_label(r: dict[str, Any]) -> str:
    """An emulated run's link: `` paper-scaled link`` (its profile; the bandwidth the
    profile chose differs a little between sweeps) or `` at 100mbit``."""
    prof = r.get("cluster_profile")
    if isinstance(prof, dict) and prof.get("profile"):
        return f" {prof['profile']}-scaled link"
    bw = _cfg(r, "cluster", "inter_node_bandwidth")
    return f" at {bw}" if bw else ""


def hardware_label(r: dict[str, Any]) -> str:
    """The compute of a record's hardware line (the host is dropped for a GPU)."""
    hw = str(r.get("hardware") or "").split(";")[0].strip()
    return hw or "unknown hardware"


def comm_label(r: dict[str, Any]) -> str:
    """The method, with its density, dense warm-up epochs and per-epoch density schedule
    when it sparsifies (PowerSGD: its rank)."""
    comm = method_of(r) if r.get("comm") else "?"
    if comm == "powersgd":
        rank = num(_cfg(r, "comm", "powersgd_rank"))
        return comm + (f" r={rank:g}" if rank else "")
    if comm not in SPARSE:
        return comm
    d = num(r.get("comm_density")) or num(_cfg(r, "comm", "density"))
    wu = num(r.get("comm_warmup_epochs")) or 0
    sched = r.get("comm_density_schedule") or _cfg(r, "comm", "density_schedule") or []
    steps = "/".join(f"{x:g}" for x in (num(v) for v in sched) if x is not None)
    return (
        comm
        + (f" d={d:g}" if d else "")
        + (f" wu={wu:g}" if wu else "")
        + (f" schedule {steps}" if steps else "")
    )


def cost_to_target(r: Mapping[str, Any]) -> float | None:
    """USD to reach the target: the recorded ``results.cost_per_hour`` x the time to
    target; None when either is unknown (no cost is assumed)."""
    cost, tt = num(_cfg(r, "results", "cost_per_hour")), num(r.get("time_to_target_s"))
    return None if cost is None or tt is None else cost * tt / 3600


def _row(r: dict[str, Any], results_dir: Path) -> dict[str, Any]:
    run_id = str(r.get("run_id"))
    curve = rec.curve_path(results_dir, run_id)
    tt = num(r.get("time_to_target_s"))
    status = str(r.get("status") or "?")
    return {
        "run_id": run_id,
        "experiment": str(r.get("experiment") or _cfg(r, "train", "experiment") or "?"),
        "comm_name": method_of(r) if r.get("comm") else "?",
        "comm": comm_label(r),
        "cache": str(r.get("cache") or "?"),
        "update": str(r.get("update") or "?"),
        "cluster": cluster_label(r),
        "hardware": hardware_label(r),
        "hardware_full": str(r.get("hardware") or ""),
        "seed": _cfg(r, "train", "seed"),
        "status": status,
        "trained": status in OUTCOMES,
        "reached": status in OUTCOMES and tt is not None,
        # a tuning-protocol run's role: "tune" runs chose a configuration and are never
        # among the reported numbers (the appendix shows them)
        "protocol_role": str((r.get("protocol") or {}).get("role") or ""),
        "protocol_trial": str((r.get("protocol") or {}).get("trial") or ""),
        "sweep_id": str(_cfg(r, "results", "sweep_id") or ""),
        "time_to_target_s": tt,
        # DAWNBench ranks by cost too: USD to the target where the run recorded its price
        # (results.cost_per_hour); none where it did not
        "cost_to_target_usd": cost_to_target(r),
        "epochs_to_target": num(r.get("epochs_to_target")),
        "train_time_s": num(r.get("train_time_s")),
        "best_value": num(r.get("best_value")),
        "metric": str(r.get("target_metric") or "?"),
        "target": num(r.get("target_value")),
        "git_sha": r.get("git_sha"),
        "curve_path": curve,
        "has_curve": curve.is_file(),
        # evaluations inside an epoch (train.eval_every_steps): points the curve lacks
        "evals": list(r.get("evals") or []),
    }


def run_table(records: list[dict[str, Any]], results_dir: Path) -> pd.DataFrame:
    """One row per record: identity, group, configuration and outcome."""
    return pd.DataFrame([_row(r, results_dir) for r in records])


def curve(results_dir: Path, run_id: str) -> pd.DataFrame | None:
    """A run's curve with today's column names, or None when it is missing or unreadable."""
    try:
        return rec.load_curve(results_dir, run_id)
    except (OSError, ValueError, pd.errors.ParserError):
        return None


def config_stats(runs: pd.DataFrame) -> pd.DataFrame:
    """Per group and configuration: runs that trained, runs that reached the target, and the
    mean and standard deviation (over seeds) of the time to target of those that reached it."""
    from bench.sweeps.protocol import TIMING_SEEDS, TUNE_SEEDS

    trained = runs[runs["trained"]]
    if "protocol_role" in trained:  # a protocol's tuning and timing runs report nothing
        trained = trained[~trained["protocol_role"].isin(("tune", "time"))]
    # nor does any run on a tuning seed (a study made to choose, e.g. placement-20261203)
    trained = trained[~trained["seed"].isin((*TUNE_SEEDS, *TIMING_SEEDS))]
    rows = []
    for key, g in trained.groupby(GROUP + CONFIG, sort=True):
        tt = g.loc[g["reached"], "time_to_target_s"].astype(float)
        rows.append(
            {
                **dict(zip(GROUP + CONFIG, key, strict=True)),
                "comm_name": g["comm_name"].iloc[0],
                "n_runs": len(g),
                "n_reached": len(tt),
                "tt_mean": tt.mean() if len(tt) else None,
                "tt_std": tt.std(ddof=1) if len(tt) > 1 else (0.0 if len(tt) else None),
                "cost": _cost_text(g),
                "run_ids": list(g["run_id"]),
            }
        )
    cols = [*GROUP, *CONFIG, "comm_name", "n_runs", "n_reached", "tt_mean", "tt_std", "cost",
            "run_ids"]  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


def _cost_text(g: pd.DataFrame) -> str:
    """``$0.12 (2 of 3 runs priced)``: the mean cost to target of the runs that reached it
    and recorded a cost per hour; "" when none did."""
    if "cost_to_target_usd" not in g:
        return ""
    reached = g[g["reached"]]
    c = reached["cost_to_target_usd"].dropna().astype(float)
    if c.empty:
        return ""
    priced = "" if len(c) == len(reached) else f" ({len(c)} of {len(reached)} runs priced)"
    return f"${c.mean():,.4g}{priced}"


def ratio(base: pd.Series, other: pd.Series) -> tuple[float | None, float | None]:
    """Speedup of ``other`` over ``base`` (mean time ratio) and its standard deviation
    (relative errors added in quadrature); None when either reached the target in no run."""
    bm, om = num(base.get("tt_mean")), num(other.get("tt_mean"))
    if not bm or not om:
        return None, None
    s = bm / om
    rel = math.hypot((num(base.get("tt_std")) or 0.0) / bm, (num(other.get("tt_std")) or 0.0) / om)
    return s, s * rel


def speedups(stats: pd.DataFrame, axis: str, baseline: str) -> pd.DataFrame:
    """Each configuration against the one of its group that differs only in ``axis``,
    set to ``baseline`` (comm ``dense``, cache ``none``, update ``naive``)."""
    if stats.empty:
        return stats.assign(speedup=[], speedup_std=[], baseline=[])
    rest = [c for c in GROUP + CONFIG if c != axis]
    key = "comm_name" if axis == "comm" else axis
    out = []
    for _, g in stats.groupby(rest, sort=True):
        base = g[g[key] == baseline]
        if base.empty:
            continue
        b = base.iloc[0]
        if len(g) < 2:
            continue  # the baseline alone: nothing to compare
        for _, o in g.iterrows():
            s, sd = ratio(b, o)
            base = {"baseline": b[axis], "base_tt": b["tt_mean"], "base_run_ids": b["run_ids"]}
            base |= {"base_reached": b["n_reached"], "base_runs": b["n_runs"]}
            out.append({**o.to_dict(), "speedup": s, "speedup_std": sd, **base})
    return pd.DataFrame(out)


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

CONF_DIR = REPO_ROOT / "conf"
GROUPS = ("model", "data", "cache", "optim", "comm", "cluster")
# keys that differ between runs of one command without being asked for; results.dir too,
# so that a command copied from the report writes to the reader's default results
# directory, not into the committed reference results it was recorded in
_IGNORE = {
    "cluster.rdzv_id",
    "cluster.rdzv_port",
    "cluster.node_rank",
    "cluster.local_addr",
    "train.progress",
    "results.dir",
}


def known_experiments() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def _options(group: str) -> set[str]:
    return {p.stem for p in (CONF_DIR / group).glob("*.yaml")}


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d.value if isinstance(d, enum.Enum) else d}


def _text(v: Any) -> str:
    if isinstance(v, str) and v.startswith(str(REPO_ROOT) + "/"):
        v = v[len(str(REPO_ROOT)) + 1 :]  # a path inside the checkout, as typed from its root
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "'[" + ",".join(_text(x) for x in v) + "]'"
    if v is None:
        return "null"
    s = str(v)
    return f"'{s}'" if (not s or any(c in s for c in " ,[]{}()'\"=")) else s


class CommandMaker:
    """Recovers commands, composing each distinct recipe once (composition takes seconds)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, ...], dict[str, Any] | None] = {}

    def _compose(self, choices: tuple[str, ...]) -> dict[str, Any] | None:
        if choices not in self._cache:
            register_configs()
            try:
                with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                    cfg = compose(config_name="config", overrides=list(choices))
                self._cache[choices] = _flat(OmegaConf.to_container(cfg, resolve=True))
            except (HydraException, OmegaConfBaseException, ValueError):
                self._cache[choices] = None
        return self._cache[choices]

    def choices(self, record: dict[str, Any]) -> list[str]:
        """``experiment=...`` and the group options a record's config names."""
        config = record.get("config") if isinstance(record.get("config"), dict) else {}
        exp = record.get("experiment") or config.get("experiment")
        out = [f"experiment={exp}"] if exp in known_experiments() else []
        for g in GROUPS:
            name = (config.get(g) or {}).get("name") if isinstance(config.get(g), dict) else None
            if name in _options(g):
                out.append(f"{g}={name}")
        return out

    def overrides(self, record: dict[str, Any]) -> list[str] | None:
        """The overrides that make this record's config; None when it cannot be composed."""
        if isinstance(record.get("overrides"), list):
            return [str(o) for o in record["overrides"]]
        choices = self.choices(record)
        base = self._compose(tuple(choices))
        if base is None or not isinstance(record.get("config"), dict):
            return None
        rec = _flat({k: v for k, v in record["config"].items() if k != "experiment"})
        diff = [
            f"{k}={_text(v)}"
            for k, v in rec.items()
            if k in base and k not in _IGNORE and base[k] != v and _text(base[k]) != _text(v)
        ]
        exp = [c for c in choices if c.startswith("experiment=")]
        groups = [c for c in choices if not c.startswith("experiment=")]
        recipe = self._compose(tuple(exp)) or {}
        kept = [c for c in groups if recipe.get(c.split("=")[0] + ".name") != c.split("=")[1]]
        return exp + kept + diff

    def command(self, record: dict[str, Any]) -> str:
        """``python -m reproduce train ...`` that makes a run like this record's."""
        if isinstance(record.get("command"), str):
            return record["command"]
        ov = self.overrides(record)
        if ov is None:
            return "(not recoverable from the record: its config does not compose today)"
        return " ".join(["python -m reproduce train", *ov])

    def command_with(self, record: dict[str, Any], comm: str) -> str:
        """The command of ``record`` with ``comm=<comm>``: its comm keys kept only for a
        sparse method, which needs them (density, warm-up)."""

        ov = self.overrides(record)
        if ov is None:
            return f"python -m reproduce train experiment={record.get('experiment')} comm={comm}"
        ov = [o for o in ov if not o.startswith(("comm=", "results.sweep_id="))]
        if comm not in SPARSE:
            ov = [o for o in ov if not o.startswith("comm.")]
        keep_results = [o for o in ov if o.startswith("results.")]
        ov = [o for o in ov if not o.startswith("results.")]
        return " ".join(["python -m reproduce train", *ov, f"comm={comm}", *keep_results])


TUNING_SUFFIX = "-tuning"


def is_protocol(path: Path) -> bool:
    """Whether ``path`` is a protocol sweep's table or its tuning table."""
    stem = path.stem.removesuffix(TUNING_SUFFIX)
    return (path.parent / f"{stem}.plan.json").exists()


V1_RULES = (
    "Protocol v1: each method's configuration was chosen on tuning seeds by the fixed rule "
    "(lowest median measured time to target, misses at the budget), then trained on fresh "
    "evaluation seeds.  Times are means over the evaluation seeds with a miss counted at "
    "the budget; brackets are 95 % bootstrap intervals over seeds; a ratio is a win only "
    "when its interval excludes 1.0."
)
V2_RULES = (
    "Protocol v2: per cluster, each method's trial of lowest median time to target on the "
    "tuning seeds (its steps x that cluster's time per step: the timing pass on the check "
    "cluster, the performance model at each paper ratio), then trained on fresh evaluation "
    "seeds.  Times are means over the evaluation seeds with a miss counted at its whole run, "
    "brackets 95 % bootstrap intervals; speedups are geometric-mean ratios with 95 % Welch "
    "intervals on log time, a win only when the interval excludes 1.0 (docs/protocol.md)."
)


def protocol_section(paths: list[Path], base: Path) -> list[str]:
    """Markdown lines: every protocol sweep among ``paths`` (none: a line saying how), each
    under the rules of its protocol version."""
    tables = [p for p in paths if is_protocol(p) and not p.stem.endswith(TUNING_SUFFIX)]
    if not tables:
        return ["No protocol sweep yet: `python -m reproduce ablation` runs one.", ""]
    out: list[str] = []
    for p in tables:
        df = pd.read_csv(p)
        v2 = "for_cluster" in df
        show = pd.DataFrame(
            {
                **({"for cluster": df["for_cluster"]} if v2 else {}),
                "experiment": df["experiment"],
                "comm": df["comm"],
                "trial": df["trial"],
                "reached": [f"{a}/{b}" for a, b in zip(df["n_reached"], df["n_runs"])],
                "time to target, s": ci_column(df, "time_to_target", 1),
                "vs dense": ci_column(df, "speedup_vs_dense", 2),
                "verdict vs dense": df["verdict_vs_dense"],
                "best peer": df["best_peer"],
                "vs best peer": ci_column(df, "speedup_vs_peer", 2),
                "verdict vs peer": df["verdict_vs_peer"],
            }
        )
        out += [
            f"From `{rel(p, base)}` ({len(df)} configurations). {V2_RULES if v2 else V1_RULES}",
            "",
            *md_table(show),
            "",
        ]
        tuning = p.with_name(f"{p.stem}{TUNING_SUFFIX}.csv")
        if tuning.exists():
            t = pd.read_csv(tuning)
            cols = ["comm", "trial", "overrides", "n_runs", "n_reached", "median_time_s"]
            if v2 and {"cluster", "median_steps"} <= set(t.columns):
                cols = ["cluster", *cols[:5], "median_steps", "median_time_s"]
            t = t[[*cols, "selected"]].astype(object).where(t.notna(), "")
            out += [f"Its tuning trials (`{tuning.name}`):", "", *md_table(t, exact=True), ""]
    return out


def cluster_title(cluster: str, ratio: float) -> str:
    """``paper (ratio 1.34)``, or the check cluster's label (a v2 table's ``for_cluster``
    and ``ratio``; NaN: measured on the check cluster's clock)."""
    if ratio != ratio:
        return f"{cluster} 2 x 2 (measured: the end-to-end check)"
    return f"{cluster} (ratio {ratio:.2f})"


def verdict_text(v: Any, n: int, short: bool = False) -> str:
    v = str(v)
    if v in ("faster", "slower"):
        return v
    return f"no difference (n = {n})" if short else f"no difference measurable at n = {n}"


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
    """experiment -> the table of its newest protocol sweep (sweep ids sort by time)."""
    out: dict[str, Path] = {}
    for p in sorted(inputs.ablation):
        if not is_protocol(p) or p.stem.endswith(TUNING_SUFFIX):
            continue
        try:
            exps = pd.read_csv(p, usecols=["experiment"])["experiment"].dropna().unique()
        except (OSError, ValueError, pd.errors.ParserError):
            continue
        for exp in exps:
            out[str(exp)] = p
    return out


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
    priced = "cost" in g and bool(g["cost"].fillna("").astype(bool).any())
    lines = [
        "| comm | cache | update | time to target (mean +- std over seeds) | vs dense DDP "
        "| vs strongest peer |" + (" cost to target (mean, USD) |" if priced else ""),
        "| --- | --- | --- | --- | --- | --- |" + (" --- |" if priced else ""),
    ]
    for _, r in g.sort_values(["comm_name", "comm"]).iterrows():
        vs_d = vs_p = ""
        if r["comm_name"] in OURS:
            vs_d = sooner_text(_dense(g, r), r, "dense")
            peer = strongest_peer(g, r)
            vs_p = sooner_text(peer, r, "fp16 / PowerSGD") + (
                f" ({peer['comm']})" if peer is not None else ""
            )
        cost = f" {r['cost'] or 'not recorded'} |" if priced else ""
        lines.append(
            f"| {r['comm']} | {r['cache']} | {r['update']} | {tt_text(r)} | {vs_d} | {vs_p} |"
            + cost
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


def runs_dir(report_dir: str | Path) -> str:
    """The results directory a report's commands write to: the one it was made from (a
    user's ``runs/``, never the committed results unless made from them); for a report
    beside the reference (``<dir>/with-reference/``), the user's ``<dir>``."""
    d = Path(report_dir)
    return str(d.parent if d.name == "with-reference" else d)


# REPORT.md's "Figures" when no figure answers the question (no protocol or scaling sweep)
NO_FIGURES = (
    "No figure answers the question yet: these records hold no protocol sweep (`python -m "
    "reproduce ablation` runs one) and no scaling sweep; the figures drawn from them are in "
    "[{0}]({0})."
)


def table_cell(text: str) -> str:
    """``text`` as one Markdown table cell: a line break or a ``|`` in it would end the
    row (and break the rendered table), so both are written inline."""
    return " ".join(str(text).split()).replace("|", "\\|")


def no_headline(names: Sequence[str], bench: Mapping[str, Path], base: Path) -> str:
    """A micro-benchmark section with no headline row: what its CSVs hold (these
    benchmarks have no one-line headline; their figures are in the appendix), or the
    command that measures them when none is recorded."""
    held = []
    for n in names:
        if n not in bench:
            continue
        try:
            rows = len(pd.read_csv(bench[n]))
        except (OSError, ValueError, pd.errors.ParserError):
            continue
        held.append(f"{rows} rows in [{rel(bench[n], base)}]({rel(bench[n], base)})")
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
    try:
        df = pd.read_csv(csv, low_memory=False)
    except (OSError, ValueError, pd.errors.ParserError):
        return ""
    need = {"kind", "bench_id", "hardware", "comm", "nodes", "procs_per_node", "efficiency"}
    if not need <= set(df.columns):
        return ""
    p = df[(df["kind"] == "projection") & (df["comm"] == "dense")].dropna(subset=["efficiency"])
    parts, bands, hiddens = [], [], []
    newest = str(p["bench_id"].max()) if len(p) else ""
    for hw, g in p.groupby("hardware", sort=True):
        g = g[g["bench_id"] == g["bench_id"].max()]
        g = g[(g["nodes"] == g["nodes"].max())]
        g = g[g["procs_per_node"] == g["procs_per_node"].max()]
        if "bandwidth" in g.columns:  # the slowest link: its first row in the run's order
            g = g[g["bandwidth"] == g["bandwidth"].iloc[0]]
        r = g.iloc[0]
        where = f"{int(r['nodes'])} x {int(r['procs_per_node'])}"
        link = f" at {r['bandwidth']}" if "bandwidth" in g.columns else ""
        band = ""
        if {"efficiency_min", "efficiency_max"} <= set(g.columns) and pd.notna(r["efficiency_min"]):
            bands.append((float(r["efficiency_min"]), float(r["efficiency_max"])))
            band = f" (band {r['efficiency_min']:.2f}-{r['efficiency_max']:.2f})"
        hidden = r.get("hidden_source")
        hidden = hidden if isinstance(hidden, str) and hidden else "not recorded"
        hiddens.append(hidden.split(" (")[0].split(" of this run")[0])
        how = f", hidden share: {hidden}"
        parts.append(
            f"{hw}: {r['efficiency']:.2f}{band} at {where}{link}{how} (run {r['bench_id']})"
        )
    if len(parts) < 2:
        return ""
    overlap = len(bands) == len(parts) and max(b[0] for b in bands) <= min(b[1] for b in bands)
    sources = set(hiddens)
    why = (
        "they take the share of communication hidden behind the backward pass from "
        "different sources: a share measured on CPU workers over gloo says little about V100s "
        "over NCCL, so the projection now assumes it for every method alike (central 1, band "
        f"0-1; docs/benchmarks.md) and the newest run's, {newest}, is the one to read"
        if len(sources) > 1
        else "both take the hidden share from the same source, so they differ by what each "
        "run measured on its own CPU"
    )
    return (
        f"  Dense's projected efficiency differs by run and machine: {'; '.join(parts)}.  "
        f"They differ because {why}" + ("; their bands overlap." if overlap else ".")
    )


def scaling_caption(paths: Sequence[Path], newest: Any) -> str:
    """The scaling figure's caption: the one sweep it draws (``newest``: the figure's rule
    picking it from the CSVs' rows) and its CSV, not every CSV read."""
    frames = []
    for f in paths:
        try:
            frames.append(pd.read_csv(f).assign(_csv=f.name))
        except (OSError, ValueError, pd.errors.ParserError):
            continue
    df = newest(pd.concat(frames, ignore_index=True, sort=False)) if frames else None
    if df is None or df.empty or "sweep_id" not in df.columns or df["sweep_id"].isna().all():
        return f"scaling efficiency against nodes, from {', '.join(f.name for f in paths)}"
    csv = ", ".join(dict.fromkeys(df["_csv"]))
    rest = len(paths) - len(set(df["_csv"]))
    older = f"; {rest} other scaling CSV(s) in the appendix" if rest > 0 else ""
    return (
        f"scaling efficiency against nodes, sweep {df['sweep_id'].iloc[0]} ({csv}: of the "
        f"sweeps with the model's predictions, the one that measured the most methods and "
        f"sizes){older}"
    )


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
    # words after the command in parentheses are a note (or an alternative: "(or: ...)"),
    # never part of what is pasted; an override's own "choice(a,b)" has no space before it
    cmd, _, after = " ".join(parts).partition(" (")
    after = after.strip().removesuffix(")").strip()
    note = (text[0] if first else note).strip(" (") or ("" if after.startswith("or:") else after)
    return f"`{cmd.strip()}`" + (f" ({note})" if note else "")


def unrun_experiments(inputs: Inputs) -> list[str]:
    ran = set(inputs.runs["experiment"])
    return [f"- {e}: {recipe_command(e)}" for e in known_experiments() if e not in ran]


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


def with_hardware(df: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """A sweep table with the hardware of its runs (``run_id`` or ``run_ids`` looked up in
    the records); a projected row names the model instead."""
    if "hardware" in df:
        return df
    hw = dict(zip(runs["run_id"], runs["hardware"], strict=True)) if len(runs) else {}

    def one(row: pd.Series) -> str:
        if str(row.get("kind")) == "projected":
            return "projection (alpha-beta model)"
        ids = str(row.get("run_ids", row.get("run_id", ""))).replace(",", " ").split()
        found = sorted({hw[i] for i in ids if i in hw})
        return "; ".join(found) or "not in the records"

    return df.assign(hardware=[one(r) for _, r in df.iterrows()]) if len(df) else df


def csv_section(
    paths: list[Path], columns: list[str], base: Path, made_by: str, runs: pd.DataFrame
) -> list[str]:
    if not paths:
        return [f"No CSV yet: `{made_by}` writes one.", ""]
    out = []
    for p in paths:
        try:
            df = pd.read_csv(p)
        except (OSError, ValueError, pd.errors.ParserError) as e:
            out += [f"- {rel(p, base)}: unreadable ({e})", ""]
            continue
        df = with_hardware(df, runs)
        cols = [c for c in columns if c in df.columns]
        out += [f"From `{rel(p, base)}` ({len(df)} rows):", "", *md_table(df[cols]), ""]
    return out
