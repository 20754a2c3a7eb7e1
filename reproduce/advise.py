"""``python -m reproduce advise [options]``

Ranks every communication method the performance model covers by predicted step time and
scaling efficiency for a cluster and a model, and prints the table with its inputs, each
marked measured (where it was measured, from the committed benchmark CSVs) or assumed
(with its source, ``bench/cluster/projection.py``).

The cluster is ``--nodes`` x ``--workers`` with ``--inter-gbps`` between nodes and
``--intra-gbps`` inside a node, or ``--profile paper`` (16 x 8 V100, 25 Gbit/s, NVLink).
The model is ``--model resnet50|transformer_base`` or ``--params N`` (elements, cut into
25 MiB buckets).  Aggregation costs per element are GPU ones (assumed) with ``--costs
gpu``, or this machine's, from the newest ``bench cluster`` calibration, with ``--costs
cpu``; the share of aggregation hidden behind the backward pass is the newest overlap
measurement per method.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.results.paths import bench_csv
from reproduce._cli import Parser

USAGE = """advise [--profile paper | --nodes N --workers M --inter-gbps G --intra-gbps G]
       [--model resnet50|transformer_base | --params N] [--density D] [--costs gpu|cpu]
       [--compute-ms T] [--dry-run]
                          ranks comm methods by the performance model's step time and
                          scaling efficiency, with what is measured and what is assumed"""

MODELS = {"resnet50": 25_557_032, "transformer_base": 63_100_000}
PROFILES = {"paper": {"nodes": 16, "workers": 8, "inter_gbps": 25.0, "intra_gbps": 800.0}}
METHODS = ("dense", "mstopk", "hitopk")  # the selection cost modelled is MSTopK's


def _parser() -> argparse.ArgumentParser:
    ap = Parser(
        "advise",
        summary="Ranks the communication methods by the performance model's predicted step "
        "time and scaling efficiency for a cluster and a model; nothing is run.",
        example="python -m reproduce advise --nodes 16 --workers 8 --inter-gbps 25 "
        "--model resnet50",
        details=__doc__,
    )
    ap.add_argument("--profile", choices=sorted(PROFILES))
    ap.add_argument("--nodes", type=int)
    ap.add_argument("--workers", type=int, help="workers per node")
    ap.add_argument("--inter-gbps", type=float)
    ap.add_argument("--intra-gbps", type=float, default=800.0)
    ap.add_argument("--model", choices=sorted(MODELS))
    ap.add_argument("--params", type=int, help="gradient elements (instead of --model)")
    ap.add_argument("--density", type=float, default=0.001)
    ap.add_argument("--costs", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--compute-ms", type=float, help="forward+backward per step (default: V100)")
    ap.add_argument("--results-dir", default="results")
    ap.add_argument("--dry-run", action="store_true", help="print the inputs; predict nothing")
    return ap


def _inputs(a: argparse.Namespace) -> dict[str, Any]:
    """The cluster and model; one error line on anything missing or out of range."""
    p = dict(PROFILES[a.profile]) if a.profile else {}
    for key in ("nodes", "workers", "inter_gbps"):
        if getattr(a, key) is not None:
            p[key] = getattr(a, key)
        if key not in p:
            _parser().error(f"--{key.replace('_', '-')} is required without --profile")
    p.setdefault("intra_gbps", a.intra_gbps)
    if p["nodes"] < 1 or p["workers"] < 1 or p["inter_gbps"] <= 0 or p["intra_gbps"] <= 0:
        _parser().error("nodes and workers must be >= 1 and bandwidths > 0")
    if not 0 < a.density <= 1:
        _parser().error(f"--density must be in (0, 1], got {a.density}")
    if a.params is not None and a.params < 1:
        _parser().error(f"--params must be >= 1, got {a.params}")
    p["params"] = a.params or MODELS[a.model or "resnet50"]
    p["model"] = a.model or ("custom" if a.params else "resnet50")
    return p


def _newest(path: Path, kind: str) -> Any:
    import pandas as pd

    if not path.exists():
        return None
    df = pd.read_csv(path)
    if "kind" not in df.columns or not (df["kind"] == kind).any():
        return None
    df = df[df["kind"] == kind]
    return df[df["bench_id"] == df["bench_id"].iloc[-1]]


def _measured(results_dir: str, costs: str) -> tuple[Any, dict[str, float], list[str]]:
    """Per-element costs and hidden shares, and lines saying where each came from."""
    from bench.cluster import perfmodel as pm
    from bench.cluster.projection import GPU_COSTS

    notes, hidden, k = [], {}, GPU_COSTS
    ov = _newest(bench_csv(results_dir, "cluster"), "overlap")
    if ov is None:
        ov = _newest(bench_csv(results_dir, "comm"), "overlap")
    if ov is not None:
        hidden = {str(r["method"]): float(r["hidden"]) for _, r in ov.iterrows()}
        notes.append(f"measured: hidden share per method, overlap run {ov['bench_id'].iloc[0]}")
    else:
        notes.append("assumed: nothing hidden behind the backward pass (no overlap measurement)")
    if costs == "cpu":
        m = _newest(bench_csv(results_dir, "cluster"), "measured")
        if m is None or "model_reduce_ns_per_elem" not in m.columns:
            raise SystemExit("error: advise: --costs cpu needs a bench cluster run's calibration")
        r = m.iloc[0]
        k = pm.Costs(
            select_s=r["model_select_ns_per_elem"] * 1e-9,
            scatter_s=r["model_scatter_ns_per_pair"] * 1e-9,
            dense_s=r["model_dense_ns_per_elem"] * 1e-9,
            reduce_s=r["model_reduce_ns_per_elem"] * 1e-9,
        )
        notes.append(f"measured: per-element costs, bench cluster run {r['bench_id']}")
    else:
        notes.append("assumed: GPU per-element costs (select, scatter, dense, reduce)")
    return k, hidden, notes


def main(argv: list[str]) -> None:
    a = _parser().parse_args(argv)
    p = _inputs(a)
    from bench.cluster import perfmodel as pm
    from bench.cluster import projection

    A = projection.ASSUMPTIONS
    compute = a.compute_ms / 1e3 if a.compute_ms else A["compute_s"].value
    nic = A["nic_efficiency"].value
    print(
        f"cluster: {p['nodes']} x {p['workers']}, {p['inter_gbps']:g} Gbit/s between nodes "
        f"(x {nic:g} NIC efficiency), {p['intra_gbps']:g} Gbit/s inside; model {p['model']} "
        f"({p['params']:,} gradient elements), density {a.density:g}"
    )
    k, hidden, notes = _measured(a.results_dir, a.costs)
    src = "given (--compute-ms)" if a.compute_ms else A["compute_s"].source
    notes.append(f"{'given' if a.compute_ms else 'assumed'}: compute {compute * 1e3:.0f} ms: {src}")
    notes += [f"assumed: {n} = {x.value:g}: {x.source}" for n, x in A.items() if n != "compute_s"]
    if a.dry_run:
        print("\n".join(notes))
        return
    c = pm.Cluster(
        p["nodes"],
        p["workers"],
        inter_bw=p["inter_gbps"] * 1e9 / 8 * nic,
        inter_lat=A["inter_lat"].value,
        intra_bw=p["intra_gbps"] * 1e9 / 8,
        intra_lat=A["intra_lat"].value,
        hierarchical_dense=True,
    )
    wl = projection.paper_workload(compute, hidden, pm.buckets_for(p["params"]))
    rows = []
    for m in METHODS:
        if m == "hitopk" and p["nodes"] < 2:
            continue  # hitopk needs 2 nodes
        rows.append((pm.step_time(m, wl, a.density, c, k), m))
    print(f"{'method':>8} {'step ms':>9} {'efficiency':>10} {'hidden':>7}")
    for t, m in sorted(rows):
        eff = (wl.compute_s + wl.update_s) / t
        print(f"{m:>8} {t * 1e3:9.1f} {eff:10.3f} {hidden.get(m, 0.0):7.2f}")
    print("\n".join(notes))
