"""Time to target across communication / compute ratios: a run's steps to target, each
charged by the phase it sent in (its hook's log, else its config), times the model's time
per step on the paper's cluster, with a bootstrap interval over seeds.  Why and how:
docs/internals/report.md.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench import methods
from bench.cluster import projection
from bench.comm.stats import parse_phases
from bench.launch import profile
from bench.methods import Knobs, MethodSpec
from bench.results import columns as col
from bench.results.records import load_curve, load_records

BASELINE = methods.names(group="baseline")[0]  # what every speedup is against


@dataclass(frozen=True)
class Phase:
    steps: int
    method: str  # the method these steps ran as (the baseline in a warm-up)
    knobs: Knobs  # its knobs, typed
    density: float = field(init=False)  # of the knobs: what it sent (1.0: whole buckets)
    rank: int = field(init=False)  # of the knobs: PowerSGD's rank (4 for the others)

    def __post_init__(self) -> None:
        object.__setattr__(self, "density", float(getattr(self.knobs, "density", 1.0)))
        object.__setattr__(self, "rank", int(getattr(self.knobs, "rank", 4)))


@dataclass(frozen=True)
class Run:
    run_id: str
    group: str  # the configuration (method and its tuning)
    comm: str
    seed: int | None
    reached: bool
    phases: tuple[Phase, ...]  # up to the target, or the whole run when it missed
    time_to_target_s: float | None  # measured, this machine
    train_time_s: float | None
    steps_run: int
    accounting: str = "recorded"  # the phases: as the hook logged them, or "config" (older)
    workload: str = "classification"  # its config's train.workload: the network projected
    factor: float = 1.0  # its steps' carry-over to 8 nodes against dense's, where it differs

    @property
    def steps(self) -> int:
        return sum(p.steps for p in self.phases)


def default_group(rec: Mapping[str, Any]) -> str:
    trial = (rec.get("protocol") or {}).get("trial")
    return f"{methods.method_of(rec)} {trial}" if trial else methods.method_of(rec)


def _target_steps(rec: Mapping[str, Any], curve: pd.DataFrame) -> int | None:
    """Optimizer steps to the target: the record's, else up to the first evaluated epoch
    at or above it (older records); None when it was missed."""
    if rec.get("steps_to_target") is not None:
        return int(rec["steps_to_target"])
    metric = col.metric_column(str(rec["target_metric"]))
    target, steps = float(rec["target_value"]), 0
    for _, row in curve.iterrows():
        steps += int(row[col.STEPS]) if row[col.STEPS] == row[col.STEPS] else 0
        v = row.get(metric)
        if v is not None and v == v and float(v) >= target:
            return steps
    return None


def configured_phases(spec: MethodSpec, rec: Mapping[str, Any], curve: pd.DataFrame) -> list[Phase]:
    """An older record's phases from its config, each step as its spec sends it."""
    steps = [int(v) if v == v else 0 for v in curve[col.STEPS]]
    per = steps[0] if steps else 0  # an older run's epochs are alike
    c = (rec.get("config") or {}).get("comm") or {}
    warm = int(c.get("warmup_epochs", rec.get("comm_warmup_epochs")) or 0) * per
    k = spec.knobs_of({
        "comm.density": rec.get("comm_density"), "comm.powersgd_rank": c.get("powersgd_rank"),
        "comm.density_schedule": rec.get("comm_density_schedule") or [],
        "comm.schedule_steps": per, "comm.warmup_steps": max(warm, int(c.get("warmup_steps") or 0)),
    })  # fmt: skip
    out: list[list[Any]] = []
    for method, kk in spec.phases(k, range(sum(steps))):
        if out and out[-1][0] == method and out[-1][1] == kk:
            out[-1][2] += 1
        else:
            out.append([method, kk, 1])
    # a warm-up step's knobs as the method it ran as has them
    return [Phase(n, m, methods.get(m).knobs_of(kk.overrides())) for m, kk, n in out]


def run_from_record(rec: Mapping[str, Any], curve: pd.DataFrame) -> Run | None:
    """``rec``'s phases up to its target (missed: the whole run): as its hook logged them,
    else from its config; a method that is not a comm hook sends its own knobs every step
    (its log is not what crosses the nodes).  None without step counts or a price."""
    spec = methods.of(rec)
    if col.STEPS not in curve.columns or spec is None or spec.kind == "reference":
        return None
    steps_run = int(curve[col.STEPS].fillna(0).sum())
    own = spec.kind != "hook"
    logged = []
    if not own and col.COMM_PHASES in curve.columns:  # what its hook logged (newer runs)
        for seg in (s for cell in curve[col.COMM_PHASES] for s in parse_phases(cell)):
            knobs = {"comm.density": seg.density, "comm.powersgd_rank": seg.rank or 4}
            logged.append(Phase(seg.steps, seg.method, methods.get(seg.method).knobs_of(knobs)))
    if own:
        base = [Phase(steps_run, spec.name, spec.knobs_of(rec.get("config") or {}))]
    else:
        base = logged or configured_phases(spec, rec, curve)
    target = _target_steps(rec, curve)
    phases, left = [], math.inf if target is None else target
    for p in base:  # up to the target
        n = min(p.steps, left)
        if n:
            phases.append(replace(p, steps=int(n)))
        left -= n
    train = (rec.get("config") or {}).get("train") or {}
    seed = train.get("seed")
    return Run(
        run_id=str(rec["run_id"]),
        group=default_group(rec),
        comm=spec.name,
        seed=None if seed is None else int(seed),
        reached=target is not None,
        phases=tuple(phases),
        time_to_target_s=rec.get("time_to_target_s"),
        train_time_s=rec.get("train_time_s"),
        steps_run=steps_run,
        accounting="recorded" if logged or own else "config",
        workload=str(train.get("workload") or "classification"),
    )


def load_runs(
    results_dir: str | Path,
    select: Callable[[Mapping[str, Any]], bool] = lambda r: True,
    group: Callable[[Mapping[str, Any]], str] = default_group,
) -> tuple[list[Run], list[str]]:
    """The runs ``select`` keeps (never a protocol tuning run), and those left out with why."""
    runs, skipped = [], []
    for rec in load_records(results_dir):
        if (rec.get("protocol") or {}).get("role") == "tune" or not select(rec):
            continue
        if rec.get("status") not in ("ok", "target_missed"):
            skipped.append(f"{rec.get('run_id')}: status {rec.get('status')}")
            continue
        try:
            curve = load_curve(results_dir, str(rec["run_id"]))
        except FileNotFoundError:
            skipped.append(f"{rec['run_id']}: no curve")
            continue
        run = run_from_record(rec, curve)
        if run is None:
            skipped.append(f"{rec['run_id']}: no step counts, or a method the model lacks")
            continue
        runs.append(run if group is default_group else replace(run, group=group(rec)))
    return runs, skipped


@functools.lru_cache(maxsize=8)
def compute_for_ratio(ratio: float, workload: str = "classification") -> float:
    """The V100 compute per step (s) at which dense fp32 on the paper's cluster takes
    ``ratio`` times it (central NIC efficiency)."""
    if not ratio > 0:
        raise ValueError(f"a communication/compute ratio must be > 0, got {ratio}")
    a, spec = projection.ASSUMPTIONS, methods.get(BASELINE)
    c = projection.paper_cluster(profile.PAPER["nodes"], profile.PAPER["gbps"],
                                 a["nic_efficiency"].value)  # fmt: skip
    wl = projection.paper_workload(0.0, {}, workload=workload)
    k = spec.knobs_of({})
    return spec.aggregation_time(wl.buckets, c, projection.GPU_COSTS, k, wl.shapes) / ratio


@functools.lru_cache(maxsize=4096)
def step_time_s(
    method: str, knobs: Knobs, ratio: float, nic_efficiency: float | None = None,
    hidden: float | None = None, workload: str = "classification",
) -> float:  # fmt: skip
    """The model's time per step (s) of ``method`` at ``ratio`` on the paper's cluster."""
    a = projection.ASSUMPTIONS
    nic = a["nic_efficiency"].value if nic_efficiency is None else nic_efficiency
    h = a["hidden"].value if hidden is None else hidden
    spec = methods.get(method)
    c = projection.paper_cluster(profile.PAPER["nodes"], profile.PAPER["gbps"], nic)
    compute = compute_for_ratio(ratio, workload)
    wl = projection.paper_workload(compute, {method: h, spec.comm: h}, workload=workload)
    return spec.step_time(wl, c, projection.GPU_COSTS, knobs)


def run_time_s(run: Run, ratio: float, **model: Any) -> float:
    """``run``'s projected time to target (or to its end, missed) at ``ratio`` (s)."""
    return run.factor * sum(
        p.steps * step_time_s(p.method, p.knobs, ratio, workload=run.workload, **model)
        for p in run.phases
    )


def corners() -> list[dict[str, float | None]]:
    """The model's inputs at the central assumptions, then at each corner of NIC
    efficiency x hidden share: the band of a composed column."""
    a = projection.ASSUMPTIONS
    nic, hid = a["nic_efficiency"], a["hidden"]
    return [{"nic_efficiency": None, "hidden": None}] + [
        {"nic_efficiency": n, "hidden": h} for n in (nic.low, nic.high) for h in (hid.low, hid.high)
    ]


def corner_times(run: Run, ratio: float) -> list[float]:
    """``run``'s projected time to target at ``ratio`` (s) at each of :func:`corners`."""
    return [run_time_s(run, ratio, **c) for c in corners()]


def time_band(runs: Sequence[Run], ratio: float) -> tuple[float, float, float]:
    """The projected mean time to target of ``runs`` at ``ratio`` (s): central, and the
    lowest and highest over :func:`corners`.  NaN without runs."""
    if not runs:
        return math.nan, math.nan, math.nan
    per = np.mean([corner_times(r, ratio) for r in runs], axis=0)
    return float(per[0]), float(per.min()), float(per.max())


def _by_seed(runs: Sequence[Run]) -> list[list[Run]]:
    out: dict[Any, list[Run]] = {}
    for i, r in enumerate(runs):
        out.setdefault(r.seed if r.seed is not None else ("run", i), []).append(r)
    return list(out.values())


def compose(
    runs: Sequence[Run],
    ratios: Iterable[float],
    baseline: str = BASELINE,
    n_boot: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """Per ratio, configuration and comparison (``baseline``, the best peer there): the
    projected mean time to target and speedup, with seed intervals and model bands."""
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(r.group, []).append(r)
    if baseline not in groups:
        raise ValueError(f"no runs of the baseline {baseline!r}; groups: {sorted(groups)}")
    # runs of one seed are replicates (same trajectory up to noise): one sample per seed
    seeds = {g: _by_seed(rs) for g, rs in groups.items()}
    rng = np.random.default_rng(seed)
    boot = {g: rng.integers(0, len(ss), size=(n_boot, len(ss))) for g, ss in seeds.items()}
    rows = []
    for ratio in ratios:
        # per corner of the model's inputs: each group's time per seed (mean of its runs), s
        times = [
            {
                g: np.array([np.mean([run_time_s(r, ratio, **c) for r in rs]) for rs in ss])
                for g, ss in seeds.items()
            }
            for c in corners()
        ]
        means = {g: float(t.mean()) for g, t in times[0].items()}
        peers = [g for g in means if groups[g][0].comm in methods.peers()]
        peer = min(peers, key=lambda g: means[g]) if peers else None
        for g, rs in groups.items():
            for vs, role in ((baseline, BASELINE), (peer, "best peer")):
                if vs is None or vs == g:
                    continue
                lo, hi = [], []
                for t in times:
                    s = t[vs][boot[vs]].mean(axis=1) / t[g][boot[g]].mean(axis=1)
                    lo.append(float(np.percentile(s, 2.5)))
                    hi.append(float(np.percentile(s, 97.5)))
                rows.append({
                    "ratio": ratio, "group": g, "comm": rs[0].comm, "vs": vs, "vs_role": role,
                    "n_runs": len(rs), "n_seeds": len(seeds[g]),
                    "n_reached": sum(r.reached for r in rs),
                    "steps_mean": float(np.mean([r.steps for r in rs])),
                    "time_to_target_s": means[g], "speedup": means[vs] / means[g],
                    "ci_low": lo[0], "ci_high": hi[0], "band_low": min(lo), "band_high": max(hi),
                    "win": lo[0] > 1.0,
                })  # fmt: skip
    return pd.DataFrame(rows)


def named_ratios() -> dict[str, float]:
    """Each named profile's dense fp32 comm / compute."""
    return {
        name: profile.dense_time_s("paper") / profile.compute_time_s(name)
        for name in profile.PROFILES
    }


def best_peer_spans(d: pd.DataFrame) -> list[tuple[str, float, float]]:
    """(peer, first ratio, last ratio) of each stretch where the same peer is the best."""
    at = d.dropna(subset=["vs"]).groupby("ratio", sort=True)["vs"].first()
    spans: list[tuple[str, float, float]] = []
    for r, peer in at.items():
        if spans and spans[-1][0] == peer:
            spans[-1] = (peer, spans[-1][1], float(r))
        else:
            spans.append((str(peer), float(r), float(r)))
    return spans


def plot(df: pd.DataFrame, path: str | Path, title: str) -> Path:
    """Speedup against ratio, against dense and against the best peer, with the 95 % seed
    interval shaded and the best peer at each ratio as a strip along the bottom."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from bench.results.plots import save_figure

    widths = {"width_ratios": [1, 1, 0.34]}
    fig, all_axes = plt.subplots(1, 3, figsize=(14, 4.8), gridspec_kw=widths)
    axes, legend_ax = all_axes[:2], all_axes[2]
    named = {k: v for k, v in named_ratios().items() if k != "paper-fp16"}  # = paper's point
    spans: list[tuple[str, float, float]] = []
    # each configuration its own line style and marker too: colours alone do not tell
    # every pair apart (two shades of one family)
    looks = dict(zip(dict.fromkeys(df["group"]), itertools.cycle(LOOKS)))
    for ax, role in zip(axes, (BASELINE, "best peer"), strict=True):
        d = df[df["vs_role"] == role]
        for g, dg in d.groupby("group", sort=False):
            comm = str(dg["comm"].iloc[0])
            spec = methods.get(comm)
            if role != BASELINE and (comm == BASELINE or comm in methods.peers()):
                continue  # against the best peer: the methods that are not peers
            dg = dg.sort_values("ratio")
            c, lw = spec.colour, spec.width
            z = 2 if spec.group == "paper" else 3  # the thick lines under the thin ones
            n = int(dg["n_seeds"].iloc[0])
            ls, mk = looks[g]
            ax.plot(dg["ratio"], dg["speedup"], color=c, lw=lw, ls=ls, marker=mk, ms=5,
                    markevery=2, zorder=z, label=f"{g} (n = {n} seeds)")  # fmt: skip
            ax.fill_between(dg["ratio"], dg["ci_low"], dg["ci_high"], color=c, alpha=0.18,
                            lw=0, zorder=1)  # fmt: skip
        peers_and_base = (BASELINE, *methods.peers())  # not drawn against the best peer
        shown = d[~d["comm"].isin(peers_and_base)] if role != BASELINE else d
        top = max(1.1, 1.08 * float(shown["ci_high"].max())) if len(shown) else 1.1
        ax.set_ylim(-0.07 * top, top)  # the strip (4 % of the height) sits below zero
        base = f"{BASELINE} (the baseline: 1 by definition)"
        ax.axhline(1.0, color=methods.colour(BASELINE) if role == BASELINE else "k", lw=1.2,
                   label=base if role == BASELINE else None)  # fmt: skip
        for r in named.values():
            ax.axvline(r, color="k", lw=0.5, ls="--", zorder=0)
        ax.set_xscale("log")
        ax.set_xlabel("dense fp32 communication / compute per step (ratio, log)")
        top = ax.secondary_xaxis("top")  # the named settings above the frame: off the curves
        top.set_xticks(list(named.values()), list(named), fontsize=7)
        top.minorticks_off()
        ax.grid(alpha=0.3, which="both")
        if role != BASELINE:
            spans = best_peer_spans(d)
            edges = sorted(d["ratio"].unique())
            for peer, lo, hi in spans:
                i, j = edges.index(lo), edges.index(hi)
                left = (edges[i - 1] * lo) ** 0.5 if i else lo
                right = (edges[j + 1] * hi) ** 0.5 if j + 1 < len(edges) else hi
                ax.axvspan(left, right, ymin=0, ymax=0.04, color=methods.colour(peer), lw=0)
            # where the best peer changes
            switch = "".join(f", {b[0]} from {b[1]:.2g}" for b in spans[1:])
            first = f"{spans[0][0]}" if spans else "?"
            ax.set_title(f"against the best peer at each ratio: {first}{switch}", fontsize=9)
        else:
            ax.set_title("against dense DDP", fontsize=9)
    for ax in axes:
        ax.set_yticks([t for t in ax.get_yticks() if 0 <= t <= ax.get_ylim()[1]])
        ax.set_ylabel("speedup in time to target (x, > 1 is sooner)")
    seen: dict[str, Any] = {}  # one entry per configuration, from both panels
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, h)
    for peer in dict.fromkeys(p for p, _, _ in spans):
        seen[f"strip: best peer is {peer}"] = Patch(color=methods.colour(peer))
    handles, labels = list(seen.values()), list(seen)
    legend_ax.axis("off")  # the legend's own panel: it covers no data
    legend_ax.legend(handles, labels, loc="center left", fontsize=8, frameon=False)
    fig.suptitle(title + "\nline: speedup from the mean steps to target x the model's time per "
                 "step; shaded: its 95 % bootstrap interval over seeds; top axis: the named "
                 "settings", fontsize=9)  # fmt: skip
    return save_figure(fig, path)


GRID = tuple(round(10 ** (x / 8), 3) for x in range(-8, 9))  # 0.1 .. 10, log-spaced
# (line style, marker) of each configuration in :func:`plot`, in turn
LOOKS = (("-", "o"), ("--", "s"), ("-.", "^"), (":", "D"), ("-", "v"), ("--", "P"), ("-.", "X"))
