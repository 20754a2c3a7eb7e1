"""``python -m reproduce advise [options]``

Ranks the protocol's default methods by the performance model's step time and scaling
efficiency for a cluster (``--nodes`` x ``--workers``, or ``--profile paper``: 16 x 8 V100 at
25 Gbit/s) and a model (``--model``, or ``--params`` cut into 25 MiB buckets), and prints
every input it used with its source: given, cited, assumed (``bench/cluster/projection.py``)
or measured (``--costs cpu``: this machine's newest ``bench cluster`` calibration, with its
run and hardware).  A method it cannot rank gets a line saying why.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.results.paths import bench_csv
from reproduce._cli import REFERENCE, RESULTS, Parser

USAGE = """advise [--profile paper | --nodes N --workers M --inter-gbps G --intra-gbps G]
       [--model resnet50|transformer_base | --params N] [--batch B --px P | --compute-ms T]
       [--density D] [--powersgd-rank R] [--nic-efficiency E] [--hidden H]
       [--costs gpu|cpu] [--results-dir DIR] [--dry-run]
                          ranks comm methods by the performance model's step time and
                          scaling efficiency, with what is measured and what is assumed"""

# parameters counted from the models' DDP buckets (bench.cluster.projection)
MODELS = ("resnet50", "transformer_base")
CITED_COMPUTE = ("resnet50",)  # models with a cited V100 compute time per step
# the settings the answer is quoted for (bench.launch.profile): one cluster, other compute
_PAPER = {"nodes": 16, "workers": 8, "inter_gbps": 25.0, "intra_gbps": 800.0}
PROFILES = {name: dict(_PAPER) for name in ("paper", "paper-224", "paper-b64", "paper-fp16")}
PROFILE_SOURCE = "profile paper: Shi et al. (MLSys 2021), 16 nodes x 8 V100, 25 Gbit/s, NVLink"
# bounds past which an input is not a cluster or a model (refused, one line)
LIMITS = {
    "nodes": (1, 100_000),
    "workers": (1, 1024),
    "inter_gbps": (1e-3, 1e5),
    "intra_gbps": (1e-3, 1e5),
    "params": (1, 10**13),
    "compute_ms": (1e-3, 1e7),
    "batch": (1, 10**6),
    "px": (8, 10_000),
    "powersgd_rank": (1, 1024),
    "sync_every": (1, 10**6),
    "demo_chunk": (1, 4096),
    "demo_topk": (1, 4096 * 4096),
}


def _parser() -> argparse.ArgumentParser:
    ap = Parser(
        "advise",
        summary="Ranks the communication methods by the performance model's predicted step "
        "time and scaling efficiency for a cluster and a model; nothing is run.",
        example="python -m reproduce advise --nodes 16 --workers 8 --inter-gbps 25 "
        "--model resnet50",
        details=__doc__,
    )
    for flag, kw in (
        ("profile", dict(choices=sorted(PROFILES), help=f"a named cluster: {PROFILE_SOURCE}")),
        ("nodes", dict(type=int, help="nodes (count, >= 1)")),
        ("workers", dict(type=int, help="workers (GPUs) per node (count, >= 1)")),
        ("inter-gbps", dict(type=float, help="line rate of each node's link, Gbit/s")),
        ("intra-gbps", dict(type=float, help="bandwidth between the workers of a node, Gbit/s "
                            "(default: the NVLink assumption)")),
        ("model", dict(choices=MODELS, help="model (default resnet50)")),
        ("params", dict(type=int, help="gradient elements, instead of --model")),
        ("batch", dict(type=int, help="resnet50: images per GPU per step (default 256)")),
        ("px", dict(type=int, help="resnet50: training image size, px (default 128)")),
        ("compute-ms", dict(type=float, help="forward + backward per step per worker, ms (> 0)")),
        ("density", dict(type=float, default=0.001,
                         help="top-k density, in (0, 1] (default 0.001)")),
        ("powersgd-rank", dict(type=int, default=4, help="PowerSGD's rank (default 4)")),
        ("sync-every", dict(type=int, default=20,
                            help="DiLoCo's period H, inner steps (default 20)")),
        ("demo-chunk", dict(type=int, default=64, help="DeMo's chunk (default 64)")),
        ("demo-topk", dict(type=int, default=32, help="DeMo's top-k per chunk (32)")),
        ("nic-efficiency", dict(type=float, help="share of the line rate TCP reaches, in (0, 1] "
                                "(default: the assumption)")),
        ("hidden", dict(type=float, help="share of aggregation hidden behind the backward pass, "
                        "in [0, 1], every method (default: the assumption, or this machine's "
                        "measurement with --costs cpu)")),
        ("costs", dict(choices=("gpu", "cpu"), default="gpu", help="per-element aggregation "
                       "costs: assumed GPU ones, or this machine's measured")),
        ("results-dir", dict(help=f"where the benchmark CSVs are (default {RESULTS}/; "
                             f"--results-dir {REFERENCE} for the committed ones; must exist "
                             "when given)")),
    ):  # fmt: skip
        ap.add_argument(f"--{flag}", **kw)  # type: ignore[arg-type]
    ap.add_argument("--dry-run", action="store_true", help="print the inputs; predict nothing")
    return ap


def _fail(msg: str) -> None:
    _parser().error(msg)


def _inputs(a: argparse.Namespace) -> dict[str, Any]:
    """The cluster and model with each value's source; one error line on a bad input."""

    def bounded(name: str, value: float | None) -> None:
        lo, hi = LIMITS[name]
        if value is not None and not lo <= value <= hi:
            _fail(f"--{name.replace('_', '-')} must be in [{lo:g}, {hi:g}], got {value:g}")

    base = dict(PROFILES[a.profile]) if a.profile else {}
    p: dict[str, Any] = {"src": {}}
    for key in ("nodes", "workers", "inter_gbps", "intra_gbps"):
        flag = f"--{key.replace('_', '-')}"
        v = getattr(a, key)
        if v is not None:
            p[key], p["src"][key] = v, f"given ({flag})"
        elif key in base:
            p[key], p["src"][key] = base[key], PROFILE_SOURCE
        elif key == "intra_gbps":
            from bench.cluster.projection import ASSUMPTIONS

            x = ASSUMPTIONS["intra_bw"]
            p[key], p["src"][key] = x.value * 8 / 1e9, x.source
        else:
            _fail(f"{flag} is required without --profile")
        bounded(key, p[key])
    for name in list(LIMITS)[4:]:  # the model's and the methods' (the cluster's: above)
        bounded(name, getattr(a, name))
    if not 0 < a.density <= 1:
        _fail(f"--density must be in (0, 1], got {a.density:g}")
    if a.nic_efficiency is not None and not 0 < a.nic_efficiency <= 1:
        _fail(f"--nic-efficiency must be in (0, 1], got {a.nic_efficiency:g}")
    if a.hidden is not None and not 0 <= a.hidden <= 1:
        _fail(f"--hidden must be in [0, 1], got {a.hidden:g}")
    if a.params is not None and a.model is not None:
        _fail("give --model or --params, not both")
    if a.results_dir is not None and not Path(a.results_dir).is_dir():
        _fail(f"--results-dir {a.results_dir}: no such directory")
    p["model"] = "custom" if a.params is not None else (a.model or "resnet50")
    if (a.batch or a.px) and (p["model"] != "resnet50" or a.compute_ms is not None):
        _fail("--batch and --px set the cited ResNet-50 compute time; not with --compute-ms")
    if a.compute_ms is None and p["model"] not in CITED_COMPUTE:
        _fail(
            f"no cited compute time for {p['model']}; give --compute-ms (models with a cited "
            f"one: {', '.join(CITED_COMPUTE)})"
        )
    return p


def _newest(path: Path, kind: str) -> Any:
    import pandas as pd

    if not path.exists():
        return None
    df = pd.read_csv(path)
    if "kind" not in df.columns or not (df["kind"] == kind).any():
        return None
    df = df[df["kind"] == kind]
    if "scenario" in df.columns:  # the main case, not the link-bound variant
        df = df[df["scenario"].isna()] if df["scenario"].isna().any() else df
    return df[df["bench_id"] == df["bench_id"].iloc[-1]]


def _where(df: Any) -> str:
    hw = df["hardware"].iloc[0] if "hardware" in df.columns else "unrecorded hardware"
    return f"run {df['bench_id'].iloc[0]} on {hw}"


def _measured(a: argparse.Namespace) -> tuple[Any, float | dict[str, float], list[str]]:
    """Per-element costs, hidden share(s), and lines saying where each came from."""
    from bench.cluster import perfmodel as pm
    from bench.cluster.projection import ASSUMPTIONS, GPU_COSTS

    results = a.results_dir or RESULTS
    notes: list[str] = []
    ov = _newest(bench_csv(results, "cluster"), "overlap")
    ov = ov if ov is not None else _newest(bench_csv(results, "comm"), "overlap")
    h = ASSUMPTIONS["hidden"]
    hidden: float | dict[str, float] = h.value
    if a.hidden is not None:
        hidden = a.hidden
        notes.append(f"hidden = {a.hidden:g} for every method: given (--hidden)")
    elif a.costs == "cpu" and ov is not None:
        hidden = {str(r["method"]): float(r["hidden"]) for _, r in ov.iterrows()}
        shown = ", ".join(f"{m} {v:.2f}" for m, v in hidden.items())
        notes.append(f"hidden = {shown}: measured (overlap case), {_where(ov)}")
    else:
        notes.append(
            f"hidden = {h.value:g} for every method (band {h.low:g}..{h.high:g}): {h.source}"
        )
        if ov is not None:
            notes.append(
                f"not used: the overlap measurement of {_where(ov)} -- not the projected "
                "GPUs (it is used with --costs cpu)"
            )
    if a.costs == "cpu":
        m = _newest(bench_csv(results, "cluster"), "measured")
        if m is None or "model_reduce_ns_per_elem" not in m.columns:
            _fail(f"--costs cpu needs a bench cluster run's calibration in {results}/bench")
        r = m.iloc[0]
        k = pm.Costs(
            select_s=r["model_select_ns_per_elem"] * 1e-9,
            scatter_s=r["model_scatter_ns_per_pair"] * 1e-9,
            dense_s=r["model_dense_ns_per_elem"] * 1e-9,
            reduce_s=r["model_reduce_ns_per_elem"] * 1e-9,
        )
        src = f"measured, bench cluster {_where(m)}"
    else:
        k, src = GPU_COSTS, None
    for name in ("select_s", "scatter_s", "dense_s", "reduce_s"):
        x, unit = ASSUMPTIONS[name], "pair" if name == "scatter_s" else "element"
        notes.append(f"{name} = {getattr(k, name):.3g} s per {unit}: {src or x.source}")
    return k, hidden, notes


def _workload(a: argparse.Namespace, p: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The model's buckets, shapes, compute and update time, and their source lines."""
    from bench.cluster import perfmodel as pm
    from bench.cluster import projection

    A = projection.ASSUMPTIONS
    notes = []
    if p["model"] == "custom":
        buckets, shapes = pm.buckets_for(a.params), None
        notes.append(f"params = {a.params:,}: given (--params), in 25 MiB buckets, no shapes")
    else:
        buckets, shapes = projection.model_buckets(p["model"])
        notes.append(
            f"params = {sum(buckets):,} in {len(buckets)} DDP buckets: counted from "
            f"{p['model']}'s parameters (bench.cluster.projection.model_buckets)"
        )
    if a.compute_ms is not None:
        compute = a.compute_ms / 1e3
        notes.append(f"compute = {a.compute_ms:g} ms per step: given (--compute-ms)")
    else:
        from bench.launch.profile import SETTINGS  # the paper's 256 at 128 px by default

        st = SETTINGS.get(a.profile or "paper", SETTINGS["paper"])
        batch, px = a.batch or st.batch, a.px or st.px
        compute = projection.v100_compute_s(batch, px)
        notes.append(
            f"compute = {compute * 1e3:.1f} ms per step ({batch} images at {px} px): "
            f"{projection.V100_SOURCE}, x ({px}/224)**2 for the area"
        )
    update = A["update_s"].value * sum(buckets) / pm.RESNET50_NUMEL
    notes.append(
        f"update_s = {update * 1e3:.2f} ms: {A['update_s'].source}, scaled by the parameters"
    )
    bw = A["backward_frac"]
    notes.append(f"backward_frac = {bw.value:.3g}: {bw.source}")
    return {"buckets": buckets, "shapes": shapes, "compute": compute, "update": update}, notes


def answers(results: str, profile: str | None) -> list[Any]:
    """The newest v2 protocol table per workload, cut to the rows tuned for ``profile``."""
    import pandas as pd

    if profile is None:
        return []
    cluster = "paper" if profile == "paper-fp16" else profile  # paper-fp16 is paper's point
    newest: dict[str, Any] = {}
    for path in sorted((Path(results) / "ablation").glob("ablation-*.csv")):
        if path.stem.endswith("-tuning"):
            continue
        df = pd.read_csv(path)
        if "for_cluster" not in df.columns or df.empty:
            continue
        df = df[df["for_cluster"] == cluster].assign(table=str(path))
        if not df.empty:
            newest[str(df["experiment"].iloc[0])] = df
    return list(newest.values())


def _selected(tables: list[Any], spec: Any, results: str) -> dict[str, Any]:
    """The config overrides of ``spec``'s configuration the answer selected ({}: none run)."""
    from bench import methods
    from bench.sweeps.common import sweep_records

    for df in tables:
        hit = df[df["comm"] == spec.name]
        if hit.empty:
            continue
        sweep, trial = Path(str(hit["table"].iloc[0])).stem, str(hit["trial"].iloc[0])
        for r in sweep_records(results, sweep):
            ours = methods.method_of(r) == spec.name
            if ours and (r.get("protocol") or {}).get("trial") == trial:
                return spec.knobs_of(r.get("config") or {}).overrides()
    return {}


def _answer_lines(tables: list[Any], fastest: str) -> list[str]:
    """The answer's time to target at this profile per workload; why the ranking differs."""
    from bench.methods import names
    from bench.report.tables import verdict_text
    from bench.sweeps.intervals import ci_text

    base = names(group="baseline")[0]
    out = []
    for df in tables:
        df = df.sort_values("time_to_target_mean_s")
        out.append(
            f"the answer for this profile, {df['experiment'].iloc[0]} "
            f"({Path(df['table'].iloc[0]).name}): time to target = each method's steps x its "
            "step time here, every method tuned for this cluster"
        )
        out.append(f"{'method':>17} {'trial':>22} {'steps':>7} {'time s':>8}  vs dense")
        for _, r in df.iterrows():
            vs = (
                "baseline"
                if r["comm"] == base
                else ci_text(r["speedup_vs_dense"], r["speedup_vs_dense_ci_low"],
                             r["speedup_vs_dense_ci_high"], 2, "x") + " "
                + verdict_text(r["verdict_vs_dense"], int(r["n_runs"]))
            )  # fmt: skip
            out.append(
                f"{r['comm']:>17} {str(r['trial']):>22} {r['steps_to_target_mean']:7.0f} "
                f"{r['time_to_target_mean_s']:8.2f}  {vs}"
            )
        top = df.iloc[0]["comm"]
        row = df[df["comm"] == fastest]
        if fastest != top and not row.empty and row.iloc[0]["verdict_vs_dense"] == "slower":
            steps = float(row.iloc[0]["steps_to_target_mean"])
            dense = df[df["comm"] == base]["steps_to_target_mean"]
            d = f" against {base}'s {float(dense.iloc[0]):.0f}" if not dense.empty else ""
            out.append(
                f"why the ranking differs: {fastest} has the shortest step here, but it needs "
                f"{steps:.0f} steps to the target{d}, so the answer has it slower than dense; "
                f"first to the target: {top}"
            )
        elif fastest and row.empty:
            out.append(
                f"why the ranking differs: {fastest} has the shortest step, but this sweep did "
                f"not run it (no steps to target measured); first to the target: {top}"
            )
        elif fastest != top:
            out.append(
                f"why the ranking differs: {fastest} has the shortest step, {top} the "
                "shortest time to the target (fewer steps)"
            )
    return out


def _not_ranked(
    specs: list[Any], ranked: list[Any], nodes: int, no_shapes: bool, hidden: Any
) -> dict[str, str]:
    """Method -> why it is not ranked (its spec's reason, or the first check it fails)."""
    out = {s.name: s.not_modelled for s in specs if s.not_modelled}
    measured = hidden if isinstance(hidden, Mapping) else None
    checks = (
        lambda s: nodes < s.min_nodes
        and (
            "it synchronises nodes, and there is one"
            if s.kind == "sync"
            else f"it needs {s.min_nodes} or more nodes (one node has no inter-node stage)"
        ),
        lambda s: no_shapes and s.shapes_why
        and f"--params gives no parameter shapes, and {s.shapes_why}",
        lambda s: measured is not None and s.kind == "hook" and s in ranked
        and s.name not in measured
        and "no overlap measurement of it in the run used (--hidden gives one)",
    )  # fmt: skip
    for check in checks:
        for s in specs:
            if s.kind != "reference" and s.name not in out and (why := check(s)):
                out[s.name] = why
    return out


def main(argv: list[str]) -> None:
    a = _parser().parse_args(argv)
    p = _inputs(a)
    from bench import methods
    from bench.cluster import perfmodel as pm
    from bench.cluster import projection

    A, given_nic = projection.ASSUMPTIONS, a.nic_efficiency is not None
    nic = a.nic_efficiency if given_nic else A["nic_efficiency"].value
    nic_src = "given (--nic-efficiency)" if given_nic else A["nic_efficiency"].source
    w, wnotes = _workload(a, p)
    k, hidden, knotes = _measured(a)
    s = p["src"]
    print(
        f"cluster: {p['nodes']} x {p['workers']}, {p['inter_gbps']:g} Gbit/s between nodes "
        f"(x {nic:g} NIC efficiency), {p['intra_gbps']:g} Gbit/s inside; model {p['model']}, "
        f"density {a.density:g}, PowerSGD rank {a.powersgd_rank}"
    )
    notes = [
        f"nodes = {p['nodes']}: {s['nodes']}",
        f"workers = {p['workers']} per node: {s['workers']}",
        f"inter_bw = {p['inter_gbps']:g} Gbit/s: {s['inter_gbps']}",
        f"nic_efficiency = {nic:g}: {nic_src}",
        f"intra_bw = {p['intra_gbps']:g} Gbit/s: {s['intra_gbps']}",
        f"inter_lat = {A['inter_lat'].value * 1e6:g} us: {A['inter_lat'].source}",
        f"intra_lat = {A['intra_lat'].value * 1e6:g} us: {A['intra_lat'].source}",
        *wnotes,
        *knotes,
    ]
    if a.dry_run:
        print("\n".join(notes))
        return
    c = pm.Cluster(p["nodes"], p["workers"], inter_bw=p["inter_gbps"] * 1e9 / 8 * nic,
                   inter_lat=A["inter_lat"].value, intra_bw=p["intra_gbps"] * 1e9 / 8,
                   intra_lat=A["intra_lat"].value, hierarchical_dense=True)  # fmt: skip
    ranked = [methods.get(m) for m in methods.defaults()]
    shares = hidden if isinstance(hidden, dict) else {s.name: hidden for s in ranked}
    wl = projection.paper_workload(w["compute"], shares, w["buckets"], w["shapes"])
    wl = dataclasses.replace(wl, update_s=w["update"])
    if c.world == 1:
        print("one worker: nothing to aggregate, every method takes the compute time")
    results = a.results_dir or REFERENCE
    tables = answers(results, a.profile)
    skipped = _not_ranked(methods.specs(), ranked, p["nodes"], w["shapes"] is None, hidden)
    # each method at the knobs the answer selected for the profile, else the flags'
    flags = {"comm.density": a.density, "comm.powersgd_rank": a.powersgd_rank,
             "sync.sync_every": a.sync_every, "optim.demo_chunk": a.demo_chunk,
             "optim.demo_topk": a.demo_topk}  # fmt: skip
    knobs = {
        s.name: s.knobs_of({**flags, **_selected(tables, s, results)})
        for s in ranked
        if s.name not in skipped
    }

    def step(m: str, ww: Any, cc: Any) -> float:
        return methods.get(m).step_time(ww, cc, k, knobs[m])

    rows = [(step(m, wl, c), m) for m in knobs]
    # the band: every assumption the user did not give at its low and high end
    h = A["hidden"]
    hb = (None,) if a.hidden is not None or isinstance(hidden, dict) else (h.low, h.high)
    ne = A["nic_efficiency"]
    nb = (nic,) if given_nic else (ne.low, ne.high)
    cs = A["compute_s"]
    cb = (1.0,) if a.compute_ms is not None else (cs.low / cs.value, cs.high / cs.value)

    def band(m: str) -> tuple[float, float]:
        effs = []
        for hh, nn, cf in itertools.product(hb, nb, cb):
            cc = dataclasses.replace(c, inter_bw=p["inter_gbps"] * 1e9 / 8 * nn)
            sh = {**shares, m: hh} if hh is not None else shares
            ww = dataclasses.replace(wl, compute_s=wl.compute_s * cf, hidden=sh)
            effs.append((ww.compute_s + ww.update_s) / step(m, ww, cc))
        return min(effs), max(effs)

    print(f"{'method':>17} {'step ms':>9} {'efficiency':>10} {'band':>11} {'hidden':>7}")
    for t, m in sorted(rows):
        eff = (wl.compute_s + wl.update_s) / t
        lo, hi = band(m)
        lo, hi = min(lo, eff), max(hi, eff)
        span = f"{lo:.2f}-{hi:.2f}"
        print(f"{m:>17} {t * 1e3:9.1f} {eff:10.3f} {span:>11} {shares.get(m, 0.0):7.2f}")
    if tables:
        print("\n".join(_answer_lines(tables, sorted(rows)[0][1] if rows else "")))
    elif a.profile:
        print(
            f"per step only: no protocol sweep tuned for {a.profile} under "
            f"{results}/ablation, so a method's steps to target are not "
            "weighed here (python -m reproduce ablation runs one)"
        )
    print(
        "band: the efficiency with each assumption not given (hidden share, NIC efficiency, "
        "compute time) at the low and high end of its range"
    )
    for m, why in skipped.items():
        print(f"not ranked: {m}: {why}")
    print("\n".join(notes))
