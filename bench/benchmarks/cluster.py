"""Benchmark ``cluster``: :mod:`.aggbench` on 2 emulated nodes x 2 workers at 1 and 10 Gbit/s
(network namespaces, ``tc``: root and iproute2), beside the model calibrated on the same run
predicting every case held out; protocol: docs/internals/benchmarks.md (cluster)."""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib.pyplot as plt

from bench import methods
from bench.benchmarks import BENCHMARKS, BenchmarkSpec
from bench.benchmarks.harness import BenchRun
from bench.cluster import perfmodel as pm
from bench.cluster import projection
from bench.cluster.emulated import run_nodes, wire_comparison
from bench.cluster.linkcheck import run_link_check
from bench.cluster.netns import EmulatedCluster, parse_bandwidth, require_tools
from bench.cluster.projection import GPU_COSTS
from bench.results.plots import BENCH_COLOURS, save_figure

if TYPE_CHECKING:
    from bench.cluster.perfmodel import Cluster, Costs

BANDWIDTHS = ("1gbit", "10gbit")
BASE = methods.names(group="baseline")[0]  # every speedup is against it
# measured: the baseline and the benchmarked sparse hooks; what-if: the baseline and the paper's
COMMS = tuple(s.name for s in methods.specs() if s.benched and (s.sparse or s.name == BASE))
WHATIF = (BASE, *methods.paper())
OVERLAP_BW = "1gbit"  # the overlap case runs on this link
# and once where the link, not the CPU, is the limit: 2 nodes x 1 one-thread worker (the
# cores are not oversubscribed), 5 MB DDP buckets, a link slow enough for dense to wait on
LINK_BOUND = {"bandwidth": "400mbit", "procs": 1, "bucket_mb": 5.0}
NODES, PROCS = 2, 2
DENSITY = 0.001


@contextlib.contextmanager
def _emulated(bw: str, quick: bool) -> Iterator[tuple[EmulatedCluster, dict[str, Any], Path]]:
    """A fresh emulated cluster at ``bw``, its link check and a scratch folder."""
    with tempfile.TemporaryDirectory(prefix="tkb-bench-") as tmp:
        with EmulatedCluster(NODES, parse_bandwidth(bw), 0.0) as c:
            # not strict: at 10 Gbit/s a 2-core machine's veths may not keep up; the model
            # is calibrated on the measured link either way, and link_ok says which it was
            yield c, run_link_check(c, 0.25, 0.25 if quick else 0.5, strict=False), Path(tmp)


def _run_json(
    c: Any, procs: int, module: str, args: list[str], what: str, out: Path, **kw: Any
) -> Any:
    """``module`` on every node of ``c``: what its rank 0 wrote to ``out``."""
    args = ["--out", str(out), *args]
    rc = run_nodes(c, procs, module, args, rdzv_timeout_s=300, timeout_s=1800, **kw)
    if rc != 0 or not out.exists():
        raise RuntimeError(f"the {what} failed (exit status {rc})")
    return json.loads(out.read_text())


def _measure(bw: str, numel: int, reps: int, quick: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The aggregation worker's results and the link check, on a fresh emulated cluster."""
    with _emulated(bw, quick) as (c, link, tmp):
        args = ["--numel", str(numel), "--density", str(DENSITY), "--reps", str(reps)]
        args += ["--comms", ",".join(COMMS), "--calib-mb", "0.0625,1,2" if quick else "0.0625,2,8"]
        what = f"aggregation benchmark at {bw}"
        res = _run_json(c, PROCS, "bench.benchmarks.aggbench", args, what, tmp / "agg.json")
        if bw == OVERLAP_BW:
            res["overlap"] = _overlap(c, tmp, quick)
        return res, link


def _overlap(c: Any, tmp: Path, quick: bool, procs: int = PROCS, bucket_mb: float = 25.0) -> Any:
    """bench.benchmarks.overlap on the emulated cluster: a ResNet-18 step per method."""
    args = ["--methods", ",".join(COMMS), "--density", "0.01", "--bucket-mb", str(bucket_mb)]
    args += ["--batch", "2", "--image", "16", "--warmup", "1", "--reps", "1"] if quick else []
    # a port of its own: the aggregation run's rendezvous port may still be in TIME_WAIT
    module, what = "bench.benchmarks.overlap", "overlap benchmark"
    return _run_json(c, procs, module, args, what, tmp / "overlap.json", rdzv_port=29401)


def _knobs(comm: str, res: dict[str, Any]) -> Any:
    return methods.get(comm).knobs_of({"comm.density": res["density"]})


def _predict_ms(comm: str, res: dict[str, Any], c: Cluster, k: Costs, own: bool = True) -> float:
    """The model's aggregation time (ms); ``own``: with the method's own selection stage
    (error feedback included) per element, where this run measured it."""
    sel = res["calibration"].get(f"select_{comm}", []) if own else []
    if sel:
        k = replace(k, select_s=sum(t for _, t in sel) / max(1, sum(n for n, _ in sel)))
    return methods.get(comm).aggregation_time(res["buckets"], c, k, _knobs(comm, res)) * 1e3


def _wire(comm: str, res: dict[str, Any]) -> dict[str, float]:
    """Measured link bytes per step and node beside the cost function's prediction."""
    n, m = res["nodes"], res["procs_per_node"]
    link = methods.get(comm).traffic(res["buckets"], n, m, _knobs(comm, res)).link_bytes
    # minus the timing harness's own traffic (barrier and time allreduce per step)
    idle = res.get("harness_wire_bytes") or [[0.0, 0.0]] * n
    tx = [t - i for (t, _), (i, _) in zip(res[comm]["wire_bytes"], idle, strict=True)]
    return wire_comparison(link, tx)


def run(results_dir: str = "results", quick: bool = False) -> Path:
    require_tools()
    numel = 2_000_000 if quick else pm.RESNET50_NUMEL
    reps = 2 if quick else 5
    bench = BenchRun("cluster", results_dir)
    for bw in BANDWIDTHS:
        res, link = _measure(bw, numel, reps, quick)
        # the model calibrated on this run's micro-measurements (no aggregation case)
        keys = ("ring_shift", "intra_shift", "select", "scatter", "dense_pass", "reduce")
        pairs = {key: [tuple(x) for x in res["calibration"].get(key, [])] for key in keys}
        meas = pm.Measurements(inter_bw=link["bandwidth_gbps"] * 1e9 / 8,
                               inter_lat=link["latency_ms"] / 1e3, **pairs)  # fmt: skip
        base = pm.Cluster(res["nodes"], res["procs_per_node"], inter_bw=1.0)
        c, k = pm.calibrate(base, pm.Costs(), meas)
        for comm in COMMS:
            ms = res[comm]["median_ms"]
            pred = _predict_ms(comm, res, c, k)
            _row(bench, {"kind": "measured"}, bw, res, comm, numel, median_ms=ms,
                 min_ms=res[comm]["min_ms"], predicted_ms=pred, heldout_error=pred / ms - 1,
                 speedup_vs_dense=res[BASE]["median_ms"] / ms, efficiency=None,
                 **_wire(comm, res), link_gbps=link["bandwidth_gbps"], link_ok=link["ok"],
                 link_latency_ms=link["latency_ms"], model_inter_gbps=c.inter_bw * 8 / 1e9,
                 model_inter_lat_ms=c.inter_lat * 1e3, model_intra_lat_ms=c.intra_lat * 1e3,
                 intra_node_link_gbps=link.get("intra_node_bandwidth_gbps"),
                 model_intra_gbps=c.intra_bw * 8 / 1e9,
                 model_select_ns_per_elem=k.select_s * 1e9,
                 model_scatter_ns_per_pair=k.scatter_s * 1e9,
                 model_dense_ns_per_elem=k.dense_s * 1e9,
                 model_reduce_ns_per_elem=k.reduce_s * 1e9, reps=reps,
                 select_ms=res[comm]["select_ms"], comm_ms=res[comm]["comm_ms"])  # fmt: skip
        # the calibrated model with this machine's intra-node path replaced by NVLink (100
        # GB/s, 10 us), then also its CPU aggregation costs by GPU ones: what keeps the
        # hierarchical method from its paper speed-up here
        nvlink = replace(c, intra_bw=100e9, intra_lat=10e-6)
        for scenario, kk in (("nvlink", k), ("nvlink+gpu", GPU_COSTS)):
            t = {cm: _predict_ms(cm, res, nvlink, kk, own=False) for cm in WHATIF}
            for comm in WHATIF:
                head = {"kind": "whatif", "scenario": scenario}
                _row(bench, head, bw, res, comm, numel, median_ms=None, predicted_ms=t[comm],
                     speedup_vs_dense=t[BASE] / t[comm])  # fmt: skip
        _overlap_rows(bench, res.get("overlap", []), bw)
    lb = LINK_BOUND
    with _emulated(lb["bandwidth"], quick) as (c, link, tmp):
        rows = _overlap(c, tmp, quick, lb["procs"], lb["bucket_mb"])
    # recorded only: measured on CPU workers, not the projected V100s
    where = {"scenario": "link-bound", "nodes": NODES, "procs_per_node": lb["procs"]}
    _overlap_rows(bench, rows, lb["bandwidth"], link, **where)
    # the paper's cluster, every input assumed (hidden too: nothing here ran on V100s), for
    # the comm hooks a user would pick (not the selection variants)
    h = projection.ASSUMPTIONS["hidden"]
    source = f"assumed {h.value:g} (band {h.low:g}..{h.high:g}; bench.cluster.projection)"
    for r in projection.project([s for s in methods.specs(kind="hook") if s.group != "variant"]):
        eff = {k: r[k] for k in ("efficiency", "efficiency_min", "efficiency_max", "hidden")}
        _row(bench, {"kind": "projection"}, f"{r['gbps']}gbit", r, str(r["comm"]),
             pm.RESNET50_NUMEL, median_ms=None, predicted_ms=r["step_ms"], **eff,
             hidden_source=source)  # fmt: skip
    path = bench.save()
    _plot(bench)
    return path


def _row(bench: BenchRun, head: dict[str, str], bw: str, where: dict[str, Any], comm: str,
         numel: int, **extra: Any) -> None:  # fmt: skip
    """One row (``head``: its kind and scenario) of an aggregation case of ``comm`` on
    ``where``'s nodes and workers at its density (a sparse method's), measured or modelled."""
    bench.add(**head, bandwidth=bw, nodes=where["nodes"], procs_per_node=where["procs_per_node"],
              comm=comm, density=where["density"] if methods.get(comm).sparse else 1.0,
              numel=numel, **extra)  # fmt: skip


def _overlap_rows(
    bench: BenchRun, rows: list, bw: str, link: dict | None = None, **at: Any
) -> None:
    """Rows ``kind=overlap`` (bench.benchmarks.overlap's) at ``bw``, with ``link``'s check."""
    checked = {"link_gbps": link["bandwidth_gbps"], "link_ok": link["ok"]} if link else {}
    for r in rows:
        bench.add(**r, comm=r["method"], **at, bandwidth=bw, median_ms=r["step_ms"], **checked)


def _plot(bench: BenchRun) -> None:
    """``cluster.png`` (measured vs model, per bandwidth) and ``cluster.scaling.png``."""
    df = bench.frame()
    hw = bench.meta["hardware"]
    meas = df[df["kind"] == "measured"]
    fig, axes = plt.subplots(1, len(BANDWIDTHS), figsize=(5.5 * len(BANDWIDTHS), 5), squeeze=False)
    for ax, bw in zip(axes[0], BANDWIDTHS, strict=True):
        d = meas[meas["bandwidth"] == bw]
        x = range(len(d))
        ax.bar([i - 0.2 for i in x], d["median_ms"], 0.4, label="measured (median)",
               color=BENCH_COLOURS["measured"])  # fmt: skip
        ax.bar([i + 0.2 for i in x], d["predicted_ms"], 0.4, color=BENCH_COLOURS["model"],
               edgecolor="k", lw=0.5, label="model (held out: not fitted to this run)")  # fmt: skip
        ticks = zip(d["comm"], d["speedup_vs_dense"], strict=True)
        ax.set_xticks(list(x), [f"{c}\n{s:.1f}x" for c, s in ticks])
        for t, c in zip(ax.get_xticklabels(), d["comm"], strict=True):
            t.set_color(methods.colour(c))
        ax.set_ylim(0, 1.15 * float(max(d["median_ms"].max(), d["predicted_ms"].max())))
        ax.set_ylabel(
            f"aggregation time per step (ms, median of n = {int(d['reps'].median())})", fontsize=9
        )
        ax.grid(axis="y", alpha=0.3)
        for i, (ms, err) in enumerate(zip(d["predicted_ms"], d["heldout_error"], strict=True)):
            ax.annotate(f"{err:+.0%}", (i + 0.2, ms), ha="center", va="bottom", fontsize=7)
        link = d["link_gbps"].iloc[0] if len(d) else float("nan")
        ax.set_title(f"{bw} (link check {link:.2g} Gbit/s): 2 nodes x 2 workers, density "
                     f"{DENSITY}", fontsize=9)  # fmt: skip
    h, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(h, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle(f"ResNet-50 gradient aggregation, emulated cluster (number: the model's error; "
                 f"under each method: its speedup over dense)\n{hw}", fontsize=9)  # fmt: skip
    fig.tight_layout(rect=(0, 0.35 / fig.get_figheight(), 1, 1))
    save_figure(fig, bench.png_path, layout=False)

    proj = df[df["kind"] == "projection"]
    bws = list(dict.fromkeys(proj["bandwidth"]))
    fig, axes = plt.subplots(
        1, max(len(bws), 1), figsize=(4.2 * max(len(bws), 1), 4.4), sharey=True, squeeze=False
    )
    # a method projected alike to one before it (bf16: fp16's bytes) is drawn as that one
    same: dict[str, str] = {}
    first: dict[tuple, str] = {}
    for comm, d in proj.groupby("comm", sort=False):
        key = tuple(d.sort_values(["bandwidth", "nodes"])["efficiency"])
        same.update({str(comm): first[key]} if key in first else {})
        first.setdefault(key, str(comm))
    comms = [c for c in dict.fromkeys(proj["comm"]) if c not in same]
    dashes = ("-", (0, (5, 1)), (0, (3, 1, 1, 1)), ":", "--", "-.", (0, (1, 2)))
    styles = {c: dashes[i % len(dashes)] for i, c in enumerate(comms)}
    for ax, bw in zip(axes[0], bws, strict=False):
        dbw = proj[proj["bandwidth"] == bw]
        for comm in comms:
            dc = dbw[dbw["comm"] == comm].sort_values("nodes")
            if dc.empty:
                continue
            # a dash tuple is no format string: linestyle=
            ax.plot(dc["nodes"], dc["efficiency"], linestyle=styles[comm], marker=".",
                    color=methods.colour(comm), label=comm)  # fmt: skip
            if dc["efficiency_min"].notna().all():
                ax.fill_between(dc["nodes"], dc["efficiency_min"], dc["efficiency_max"],
                                color=methods.colour(comm), alpha=0.08)  # fmt: skip
        ax.set_title(f"inter-node link {bw.replace('gbit', ' Gbit/s')}", fontsize=9)
        ax.set(xlabel="nodes (8 GPUs each)", ylim=(0, 1.05))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("scaling efficiency")
    axes[0][0].legend(fontsize=8, loc="lower left", title="line: assumption's value",
                      title_fontsize=7)  # fmt: skip
    src = proj["hidden_source"].dropna()
    # the rows say how their hidden share was taken (older runs: measured here, 0..measured)
    hidden = (
        "share of communication hidden behind compute: 0 to 1 (assumed)"
        if len(src) and src.astype(str).str.startswith("assumed").all()
        else "share of communication hidden behind compute: from none to the share measured "
        "on CPU workers"
    )
    fig.suptitle(
        "Projection to the paper's cluster (ResNet-50; top-k at density 0.001; dense = NCCL "
        f"hierarchical{''.join(f'; {a} as {b}' for a, b in same.items())})"
        f"\nbands: V100 compute, NIC 0.5-0.9 of line rate, {hidden}"
        f"\n(bench.cluster.projection); drawn on {hw}",
        fontsize=8,
    )
    save_figure(fig, bench.png_path.with_suffix(".scaling.png"))


BENCHMARKS.register("cluster")(BenchmarkSpec(run=run, replot=_plot))
