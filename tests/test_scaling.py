"""``reproduce scaling``: the plan (sizes, the compute-only run first, one launch per
size), the efficiency arithmetic on fixture rows, the model's predictions and projection,
the figure from fixture rows, the no-communication hook, dry runs and bad input."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest
import torch

from bench.cluster import perfmodel as pm
from bench.methods import get
from bench.results.records import append_record
from bench.sweeps import scaling as sc
from bench.sweeps import scaling_model as sm
from bench.sweeps import scaling_table as st
from reproduce import scaling as cli
from tests.conftest import TINY, run_cli

SWEEP = "scaling-test-0001"
R0, CAL, WARM = sc.SEED, sc.CALIBRATION_SEED, sc.WARMUP_SEED


def _run(tmp: Path, run_id: str, comm: str, n: int, epochs: list[tuple[int, int, float]],
         seed: int = R0, **cfg) -> None:  # fmt: skip
    """A record and its curve: (samples, steps, training seconds) per epoch; ``seed`` its
    role (a round's, the calibration's or the warm-up's)."""
    curve = tmp / "curves" / f"{run_id}.csv"
    curve.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(
        {
            "epoch": range(1, len(epochs) + 1),
            "data/samples": [s for s, _, _ in epochs],
            "data/steps": [k for _, k, _ in epochs],
            "clock/epoch_s": [t for _, _, t in epochs],
        }
    ).to_csv(curve, index=False)
    cl = {"name": "emulated" if n > 1 else "local", "nnodes": n, "nproc_per_node": 1}
    cl["inter_node_bandwidth"] = "40mbit"
    append_record(
        tmp,
        {
            "run_id": run_id,
            "status": "target_missed",
            "comm": comm,
            "curve": str(curve),
            "cluster_profile": {"target_ratio": 1.34} if n > 1 else None,
            "config": {
                "results": {"sweep_id": SWEEP},
                "cluster": cl,
                "train": {"seed": seed},
                **cfg,
            },  # fmt: skip
        },
    )


def _plan_doc(dense_2: float = 0.6) -> dict:
    pred = [
        {"nodes": 1, "workers_per_node": 1, "comm": "nocomm", "predicted_step_s": 0.1},
        {"nodes": 1, "workers_per_node": 1, "comm": "dense", "predicted_step_s": 0.1},
        {"nodes": 2, "workers_per_node": 1, "comm": "nocomm", "predicted_step_s": 0.2},
        {"nodes": 2, "workers_per_node": 1, "comm": "dense", "predicted_step_s": dense_2},
        {"nodes": 2, "workers_per_node": 1, "comm": "hitopk", "predicted_step_s": 0.3},
    ]
    for p in pred:
        p["predicted_compute_only_step_s"] = 0.1 if p["nodes"] == 1 else 0.2
    sizes = [{"nodes": 1, "workers_per_node": 1, "inter_node_bandwidth": None},
             {"nodes": 2, "workers_per_node": 1, "inter_node_bandwidth": "40mbit"}]  # fmt: skip
    return {"sweep_id": SWEEP, "numel": 1_000_000, "sizes": sizes, "predictions": pred,
            "repeats": 3, "schedule": {}}  # fmt: skip


# seconds of 4 measured steps in each of 3 rounds (the warm-up epoch, 9 s, left out)
ROUNDS = {
    (1, "nocomm"): (0.4, 0.4, 0.4),  # 0.1 s/step, 320 samples/s
    (1, "dense"): (0.4, 0.44, 0.36),
    (2, "nocomm"): (0.8, 0.84, 0.76),  # about 0.2 s/step
    (2, "dense"): (1.6, 1.7, 1.5),  # about 0.4 s/step
    (2, "hitopk"): (1.0, 1.1, 0.9),  # about 0.25 s/step
}


@pytest.fixture
def table(tmp_path: Path) -> pd.DataFrame:
    from bench.sweeps.common import sweep_records

    for (n, comm), secs in ROUNDS.items():
        for r, t in enumerate(secs):
            _run(tmp_path, f"{comm[0]}{n}-{r}", comm, n, [(64 * n, 2, 9.0), (128 * n, 4, t)],
                 R0 + r)  # fmt: skip
    # the size's warm-up (slow, left out) and calibration (the model's compute input)
    _run(tmp_path, "w2", "dense", 2, [(128, 2, 9.0), (256, 4, 5.6)], WARM)
    _run(tmp_path, "cal2", "nocomm", 2, [(128, 2, 9.0), (256, 4, 0.8)], CAL)
    append_record(tmp_path, {"run_id": "dead", "status": "error", "comm": "dense",
                             "config": {"results": {"sweep_id": SWEEP}}})  # fmt: skip
    return st.build_table(sweep_records(tmp_path, SWEEP), _plan_doc())


def test_the_table_gives_each_point_its_rounds_mean_and_interval(table: pd.DataFrame) -> None:
    from bench.sweeps.intervals import log_mean_interval, log_t_interval

    assert list(table.columns) == st.COLUMNS
    meas = table[table["kind"] == "measured"].set_index(["nodes", "comm"])
    assert set(meas.index) == set(ROUNDS)  # the warm-up and the error run: no row
    assert (meas["n_runs"] == 3).all()
    for key, secs in ROUNDS.items():
        steps = [t / 4 for t in secs]
        row = meas.loc[key]
        m, lo, hi = log_mean_interval(steps)
        assert row["step_s"] == pytest.approx(m)  # the geometric mean over the rounds
        assert row[["step_s_ci_low", "step_s_ci_high"]].tolist() == pytest.approx([lo, hi])
        assert lo < row["step_s"] < hi or lo == hi
        assert row["measured_steps"] == 4 and len(row["run_id"].split()) == 3
    d2, h2, n2 = meas.loc[(2, "dense")], meas.loc[(2, "hitopk")], meas.loc[(2, "nocomm")]
    # efficiency: the ratio of the geometric means, Welch's t on their logs
    e, lo, hi = log_t_interval([t / 4 for t in ROUNDS[(2, "nocomm")]],
                               [t / 4 for t in ROUNDS[(2, "dense")]])  # fmt: skip
    assert d2["efficiency"] == pytest.approx(e) == pytest.approx(n2["step_s"] / d2["step_s"])
    assert (d2["efficiency_ci_low"], d2["efficiency_ci_high"]) == pytest.approx((lo, hi))
    assert 0.4 < lo < e < hi < 0.6  # about 0.2 / 0.4
    assert 0.6 < h2["efficiency_ci_low"] < h2["efficiency"] < h2["efficiency_ci_high"] < 1.0
    assert n2["efficiency"] == 1.0 and math.isnan(n2["efficiency_ci_low"])  # by definition
    # the calibration run (0.2 s/step) beside the compute-only rounds
    assert n2["calibration_step_s"] == pytest.approx(0.2)
    assert n2["compute_drift"] == pytest.approx(n2["step_s"] / 0.2 - 1)
    # textbook: throughput(N) / (N x throughput(1x1 nocomm)): about 160 / (2 x 320)
    assert d2["textbook_efficiency"] == pytest.approx(0.25, rel=0.05)
    # the model beside it: the plan's 0.6 with the calibration as its compute (0.2 = plan's)
    assert d2["predicted_step_s"] == pytest.approx(0.6)
    assert d2["model_error"] == pytest.approx(0.6 / d2["step_s"] - 1)
    assert h2["predicted_efficiency"] == pytest.approx(0.2 / 0.3)
    # dense ring allreduce of 1 M fp32 over 2 nodes: 4 MB over each link at 40 Mbit/s
    assert d2["link_ratio"] == pytest.approx(4e6 * 8 / 40e6 / n2["step_s"], rel=0.05)
    assert math.isnan(meas.loc[(1, "dense"), "link_ratio"])  # one node: no link
    assert d2["target_ratio"] == pytest.approx(1.34)
    text = st.format_table(table)  # printed with the intervals and n
    assert re.search(r"dense\s+3\s+0\.\d{3} \[0\.3\d\d, 0\.4\d\d\]\s+0\.50 \[0\.4", text)


def test_one_round_has_no_interval_and_a_point_above_1_reads_by_one_rule(tmp_path) -> None:
    """An efficiency above 1 holds 1 within its interval, or is a measurement fault (its
    interval above 1, or none): the table's note, its summary, the figure and the
    report's text say the same."""
    assert st.above_one(0.98, 0.9, 1.05) == "" and st.above_one(1.004, math.nan, math.nan) == ""
    assert st.above_one(1.03, 0.97, 1.09) == st.HOLDS_ONE
    assert st.above_one(1.10, 1.05, 1.15) == st.FAULT == st.above_one(1.1, math.nan, math.nan)
    from bench.report import scaling as fs
    from bench.sweeps.common import sweep_records

    # 2x1: hitopk as fast as the reference (holds 1), topk 15 % faster in every round
    for r, (ref, hit, top) in enumerate(((0.8, 0.78, 0.70), (0.84, 0.86, 0.72),
                                         (0.76, 0.74, 0.66))):  # fmt: skip
        for comm, t in (("nocomm", ref), ("hitopk", hit), ("topk", top)):
            _run(tmp_path, f"{comm}-{r}", comm, 2, [(128, 2, 9.0), (256, 4, t)], R0 + r)
        _run(tmp_path, f"one-{r}", "nocomm", 1, [(64, 2, 9.0), (128, 4, 0.4)], R0 + r)
    table = st.build_table(sweep_records(tmp_path, SWEEP), _plan_doc())
    meas = table[table["kind"] == "measured"].set_index("comm")
    assert st.ABOVE_ONE[st.HOLDS_ONE] in meas.loc["hitopk", "note"]
    assert st.ABOVE_ONE[st.FAULT] in meas.loc["topk", "note"]
    assert "measurement fault" in meas.loc["topk", "note"]
    lines = st.summary(table)
    assert lines[0].startswith("holds 1: hitopk 1.0") and "fault: topk 1.1" in lines[1]
    csv = tmp_path / "s.csv"
    table.to_csv(csv, index=False)
    (text, _) = fs.scaling_lines([csv])
    assert "fault: topk 1.1" in text and "measurement fault, not a gain" in text
    assert "holds 1: hitopk 1.0" in text
    ax = _axes(fs, pd.read_csv(csv), tmp_path)[0]
    rings = [ln for ln in ax.lines if ln.get_markersize() == 11 and ln.get_mec() == "k"]
    topk_eff = meas.loc["topk", "efficiency"]
    assert [list(r.get_ydata()) for r in rings if len(r.get_ydata())] == [[topk_eff]]
    assert "measurement fault" in " ".join(t.get_text() for t in ax.texts)
    # one round: no interval, so a point above 1 is marked, never explained
    one = table.assign(efficiency_ci_low=math.nan, efficiency_ci_high=math.nan)
    assert st.above_one_of(one[one["kind"] == "measured"]).tolist().count(st.FAULT) == 2


def _axes(fs, frame: pd.DataFrame, tmp: Path) -> list:
    """The axes of the scaling figure drawn from ``frame``."""
    kept = []
    real = fs.save_figure

    def keep(fig, path):
        kept.extend(fig.axes)
        return real(fig, path)

    fs.save_figure = keep
    try:
        assert fs.plot_scaling(frame, tmp / "scaling.png") is not None
    finally:
        fs.save_figure = real
    return kept


def test_projection_only_after_the_model_holds(table: pd.DataFrame, tmp_path: Path) -> None:
    proj = table[table["kind"] == "projected"]
    assert set(proj["comm"]) == {"dense", "hitopk"} and (proj["workers_per_node"] == 8).all()
    at16 = proj[proj["nodes"] == 16].set_index("comm")
    assert at16.loc["hitopk", "efficiency"] > at16.loc["dense", "efficiency"]
    assert (proj["efficiency_min"] <= proj["efficiency"] + 1e-12).all()
    assert (proj["efficiency"] <= proj["efficiency_max"] + 1e-12).all()
    assert (
        "extrapolated 64x beyond the largest measured size (2 CPU workers" in at16.iloc[0]["note"]
    )
    assert not proj["model_holds"].any()  # dense on 2x1 off by +50 %
    assert "not drawn" in st.summary(table)[-1]
    from bench.sweeps.common import sweep_records

    held = st.build_table(sweep_records(tmp_path, SWEEP), _plan_doc(dense_2=0.42))
    assert held[held["kind"] == "projected"]["model_holds"].all()


def test_figure_from_fixture_rows(table: pd.DataFrame, tmp_path: Path, monkeypatch) -> None:
    from PIL import Image

    from bench.report import scaling as fs

    figs = []
    real = fs.save_figure

    def keep(fig, path):
        figs.append((fig._suptitle.get_text() if fig._suptitle else "",
                     [(a.get_xlabel(), a.get_ylabel(), a.get_legend()) for a in fig.axes],
                     len(fig.legends)))  # fmt: skip
        return real(fig, path)

    monkeypatch.setattr(fs, "save_figure", keep)
    csv = tmp_path / "t.csv"
    table.to_csv(csv, index=False)
    png = fs.plot_scaling(pd.read_csv(csv), tmp_path / "scaling.png")
    assert png is not None and png.stat().st_size > 10_000
    assert Image.open(png).size[0] <= 2400
    title, axes, fig_legends = figs[0]
    assert SWEEP in title and fig_legends == 0
    assert all(x for x, _, _ in axes) and "efficiency" in axes[0][1]
    assert sum(leg is not None for _, _, leg in axes) == 1  # one legend
    assert "geometric mean of 3 runs with its 95 % interval" in title
    # an old-format table (nnodes, nproc_per_node; no prediction) still draws
    old = pd.DataFrame({"sweep_id": "s0", "cluster": "local", "comm": ["dense", "dense"],
                        "nnodes": [1, 2], "nproc_per_node": 1, "efficiency": [1.0, 0.7],
                        "kind": "measured"})  # fmt: skip
    assert fs.plot_scaling(old, tmp_path / "old.png") is not None


def test_every_method_in_its_colour_with_its_bars_in_every_panel_it_has_data(tmp_path):
    from matplotlib.colors import to_hex

    from bench import methods
    from bench.report import scaling as fs

    rows = [{"sweep_id": "s", "kind": "measured", "cluster": "emulated", "comm": c,
             "nodes": n, "workers_per_node": m, "efficiency": e, "efficiency_ci_low": e - 0.05,
             "efficiency_ci_high": e + 0.05, "n_runs": 3, "predicted_step_s": 0.2}
            for n, m in ((2, 1), (4, 1), (2, 2), (4, 2))
            for c, e in (("nocomm", 1.0), *((c, 0.5) for c in methods.defaults()))]  # fmt: skip
    rows = [r for r in rows if not (r["comm"] == "demo" and r["workers_per_node"] == 2)]
    frame = pd.DataFrame(rows)
    axes = _axes(fs, frame, tmp_path)
    for ax, per in zip(axes[:2], (1, 2), strict=True):
        want = {methods.colour(c) for c in frame[frame["workers_per_node"] == per]["comm"]
                if c != "nocomm"}  # fmt: skip
        bars = [b for b in ax.containers if b.has_yerr]
        assert {to_hex(b.lines[0].get_color()) for b in bars} == want
        spans = [
            (seg[:, 1].max() - seg[:, 1].min())
            for b in bars
            for seg in b.lines[2][0].get_segments()
        ]
        assert min(spans) == pytest.approx(0.1)  # each bar: its 95 % interval


def _calibration(**kw) -> sm.Calibration:
    base = dict(buckets=(250_000, 160_000), shapes=((), ()), reduce_s=1e-9, dense_s=1e-9,
                scatter_s=1e-8, select_s={"topk": 2e-8, "mstopk": 1e-8}, update_s=0.002,
                msg_lat_s=1e-4, intra_bw=1e9, cores=2)  # fmt: skip
    return sm.Calibration(**{**base, **kw})


def test_predictions_order_methods_on_a_slow_link() -> None:
    cal = _calibration()
    at = {c: get(c).knobs_of({"comm.density": 0.01}) for c in ("nocomm", "dense", "fp16", "hitopk")}
    p = {c: sm.predict(c, 4, 1, 0.3, 40e6, cal, at[c])["predicted_step_s"]
         for c in ("nocomm", "dense", "fp16", "hitopk")}  # fmt: skip
    f = sm.contention(4, 1, 2)
    assert p["nocomm"] == pytest.approx(0.3 + 0.002 * f)
    assert p["nocomm"] < p["hitopk"] < p["fp16"] < p["dense"]
    faster = sm.predict("dense", 4, 1, 0.3, 400e6, cal)["predicted_step_s"]
    assert faster < p["dense"]
    assert 0.9 < pm.link_efficiency() < 1.0  # TCP/IP framing


def test_plan_runs_a_warm_up_a_calibration_then_rotated_rounds_at_every_size() -> None:
    plan = sc.Plan(sweep_id="x", comms=("dense", "hitopk"), topologies=((1, 1), (2, 1)),
                   repeats=2)  # fmt: skip
    n, d, h = "nocomm", "dense", "hitopk"
    # per size: a dense run that warms the launch up, a compute-only run that calibrates
    # the model's compute, then each round: the methods and the compute-only reference,
    # the second round rotated by half its length
    assert plan.points() == [
        (1, 1, d, WARM), (1, 1, n, CAL), (1, 1, d, R0), (1, 1, n, R0),
        (1, 1, n, R0 + 1), (1, 1, d, R0 + 1),
        (2, 1, d, WARM), (2, 1, n, CAL), (2, 1, d, R0), (2, 1, h, R0), (2, 1, n, R0),
        (2, 1, h, R0 + 1), (2, 1, n, R0 + 1), (2, 1, d, R0 + 1),
    ]  # fmt: skip
    jobs = dict(plan.jobs())
    assert "cluster=local" in jobs[(1, 1, d, R0)] and "cluster=emulated" in jobs[(2, 1, d, R0)]
    assert "data.batch_size=64" in jobs[(2, 1, h, R0 + 1)]  # 32 per worker
    assert f"train.seed={R0 + 1}" in jobs[(2, 1, h, R0 + 1)]
    assert sc.parse_topologies("2x1, 1x1") == [(1, 1), (2, 1)]


def test_the_default_plan_runs_every_default_method_n_times_a_point() -> None:
    """Every default method, the sync strategies and DeMo included, ``repeats`` times at
    every size it runs at, beside as many compute-only runs; a sync strategy's runs
    measure whole periods of its outer synchronisation after a warm-up that holds one."""
    from collections import Counter

    from bench import methods

    plan = sc.Plan(sweep_id="x", repeats=3)
    assert set(plan.comms) == set(methods.defaults())
    kinds = {methods.get(c).kind for c in plan.comms}
    assert {"hook", "sync", "optimizer"} <= kinds  # DiLoCo & co., DeMo
    counts = Counter(p[:3] for p in plan.points() if p[3] >= sc.SEED)
    for n, m in plan.topologies:
        want = plan.methods_at(n, m) + ["nocomm"]
        assert {c for (a, b, c) in counts if (a, b) == (n, m)} == set(want)
        assert all(counts[(n, m, c)] == 3 for c in want)
    assert set(plan.methods_at(2, 2)) == set(methods.defaults())
    jobs = plan.jobs()
    for c in plan.comms:
        h = plan.period_of(c)
        warm, meas = plan.schedule(c)
        assert warm * plan.steps >= h and (meas * plan.steps) % h == 0 and meas >= 2
        epochs = next(j for p, j in jobs if p[2] == c and p[3] == sc.SEED)
        assert f"train.epochs={warm + meas}" in epochs
        assert f"train.eval_every={warm + meas}" in epochs
        if methods.get(c).kind == "sync":
            assert h > 1
    assert (len(jobs), len(plan.pending([]))) == (len(plan.points()),) * 2


@pytest.mark.parametrize("period, steps", [(10, 5), (10, 4), (10, 2), (7, 3), (1, 4), (4, 8)])
def test_a_periodic_method_measures_whole_periods_after_one(period: int, steps: int) -> None:
    warm, meas = sc.schedule(period, steps, 2)
    assert warm * steps >= period and warm >= 1
    assert (meas * steps) % period == 0 and meas >= 2
    assert sc.schedule(period, steps, 2) <= (warm, meas)  # the fewest such epochs
    assert all((k * steps) % period for k in range(2, meas))


def test_the_table_leaves_a_sync_strategys_warm_up_out_and_checks_its_periods(tmp_path):
    from bench.sweeps.common import sweep_records

    sync = {"sync": {"name": "diloco", "sync_every": 10}}
    # 2 warm-up epochs of 5 steps (the first outer step in the second), 2 measured
    for r in range(2):
        _run(tmp_path, f"dl{r}", "dense", 2, [(128, 5, 9.0), (128, 5, 4.0), (128, 5, 1.0),
                                              (128, 5, 2.0)], R0 + r, **sync)  # fmt: skip
        _run(tmp_path, f"n{r}", "nocomm", 2, [(128, 5, 9.0), (128, 5, 1.0)], R0 + r)
    # a run whose data gave 4 steps an epoch: 8 measured steps are not whole periods
    _run(tmp_path, "dl2", "dense", 2, [(128, 4, 9.0), (128, 4, 4.0), (128, 4, 1.0),
                                       (128, 4, 1.0)], R0 + 2, **sync)  # fmt: skip
    doc = {**_plan_doc(), "schedule": {"diloco": [2, 2], "nocomm": [1, 1]}}
    meas = st.build_table(sweep_records(tmp_path, SWEEP), doc).set_index("comm")
    assert meas.loc["diloco", "n_runs"] == 3 and meas.loc["diloco", "measured_steps"] == 10
    assert meas.loc["diloco", "step_s_ci_low"] < 0.3 < meas.loc["diloco", "step_s_ci_high"]
    assert "measured 8 steps, not whole periods of 10" in meas.loc["diloco", "note"]
    assert meas.loc["nocomm", "step_s"] == pytest.approx(0.2)


def test_nocomm_hook_returns_the_local_gradient_and_sends_nothing() -> None:
    from bench.benchmarks.buckets import FakeBucket
    from bench.comm import HOOKS, is_sparse
    from bench.comm.config import HookOptions

    spec = HOOKS.get("nocomm")
    assert spec.measurement and not is_sparse("nocomm")
    state, hook = spec.build(HookOptions(), None, None)
    b = FakeBucket(0, [torch.Size([100])], True, seed=1)
    before = b.buffer().clone()
    assert torch.equal(hook(state, b).wait(), before)
    stats = state.stats.pop()
    assert stats["comm/bytes_per_step"] == 0 and state.step == 1


def test_dry_run_runs_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    import bench.sweeps.common as common

    def no_run(*a, **k):
        raise AssertionError("a dry run started a job")

    monkeypatch.setattr(common, "run_queued", no_run)
    monkeypatch.setattr(sc.Plan, "prepare", no_run)
    # the estimate reads earlier scaling runs: one of 1x1, 12 s for 6 steps, in a reference
    ref = tmp_path / "ref"
    train = {"max_steps_per_epoch": 2, "epochs": 3, "seed": 0}
    cfg = {"results": {"sweep_id": "scaling-old"}, "train": train,
           "cluster": {"nnodes": 1, "nproc_per_node": 1}}  # fmt: skip
    old = {"run_id": "old", "status": "ok", "experiment": "dawnbench_digits", "comm": "dense"}
    append_record(ref, {**old, "wall_time_s": 12.0, "config": cfg})
    monkeypatch.setattr("reproduce._dryrun.REFERENCE", str(ref))
    cli.main(["--quick", "--dry-run", "--results-dir", str(tmp_path / "res")])
    out = capsys.readouterr().out
    # per size a warm-up, a calibration and 2 rounds: 1x1's 6 runs, 2x1's 8
    assert "14 runs in 2 launches" in out and "then 2 round(s) of 2 method(s)" in out
    assert "first: python -m reproduce train" in out
    from reproduce._dryrun import duration

    # 1x1's 6 runs of 6 steps at 2 s a step, and 2 sizes' profile and launch
    want = duration(6 * 12.0 + 2 * sc.SIZE_OVERHEAD_S)
    assert f"expected time: about {want} for 6 run(s) to go" in out
    assert "8 run(s) of sizes never run before not counted" in out
    cli.main(["--quick", "--dry-run", "--verbose", "--results-dir", str(tmp_path / "res")])
    out = capsys.readouterr().out
    assert "comm=nocomm" in out and "run 8: python -m reproduce train" in out
    assert "cluster=local cluster.nnodes=2 cluster.nproc_per_node=1" in out
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--comm", "dense,zip"], "unknown comm 'zip'"),
        (["--comm", "nocomm"], "unknown comm 'nocomm'"),  # the reference, not a method
        (["--topologies", "2x1"], "must include 1x1"),
        (["--topologies", "1x1,2by2"], "'2by2' is not NODESxWORKERS"),
        (["--topologies", "1x1,2x1,2x1"], "'2x1' is given twice"),
        (["--epochs", "1"], "--epochs must be >= 2"),
        (["--cluster", "moon"], "the study runs on emulated or local"),
        (["--experiment", "nope"], "unknown experiment 'nope'"),
        (
            ["--resume", "sc-x", "--steps", "9"],
            "--resume sc-x runs the sweep's saved plan, so --steps would be ignored",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, message, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--dry-run", "--results-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_quick_scaling_measures_predicts_and_projects(tmp_path: Path) -> None:
    tiny = [o for o in TINY if not o.startswith(("train.", "data.batch_size"))]
    p = run_cli("scaling", "--quick", "--batch-per-worker", "16",
                "--results-dir", str(tmp_path), *tiny, timeout=900)  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (csv,) = (tmp_path / "scaling").glob("*.csv")
    (plan,) = (tmp_path / "scaling").glob("*.plan.json")
    df = pd.read_csv(csv)
    meas = df[df["kind"] == "measured"]
    assert len(meas) == 5 and (meas["step_s"] > 0).all()  # a row per (size, method)
    assert (meas["n_runs"] == 2).all() and meas["step_s_ci_low"].notna().all()
    assert meas["predicted_step_s"].notna().all() and meas["efficiency"].between(0, 3).all()
    assert (df["kind"] == "projected").sum() == 2 * 5
    assert plan.stat().st_mtime < min((tmp_path / "curves").stat().st_mtime, csv.stat().st_mtime)


def test_a_resumed_sweep_runs_only_what_has_no_finished_record(tmp_path: Path, capsys) -> None:
    plan = sc.Plan(sweep_id=SWEEP, cluster="local", comms=("dense",),
                   topologies=((1, 1), (2, 1)), results_dir=str(tmp_path), repeats=2,
                   launcher="submitit_local")  # fmt: skip
    sc.write_plan({**_plan_doc(), "repeats": 2}, tmp_path, plan)
    ep = [(64, 2, 9.0), (128, 4, 0.4)]
    for run_id, comm, n, seed in (("w1", "dense", 1, WARM), ("c1", "nocomm", 1, CAL),
                                  ("d1", "dense", 1, R0), ("n1", "nocomm", 1, R0),
                                  ("c2", "nocomm", 2, CAL)):  # fmt: skip
        _run(tmp_path, run_id, comm, n, ep, seed)
    cfg = {"results": {"sweep_id": SWEEP}, "cluster": {"nnodes": 2, "nproc_per_node": 1},
           "train": {"seed": R0}}  # fmt: skip
    append_record(tmp_path, {"run_id": "x", "status": "error", "comm": "dense", "config": cfg})
    # per size: the warm-up, the calibration, then 2 rounds of dense and nocomm (the second
    # rotated); 2x1's first dense failed (it measured nothing): 1x1 lacks its second round,
    # 2x1 all but its calibration
    assert plan.pending() == [4, 5, 6, 8, 9, 10, 11]
    loaded, doc = sc.load(tmp_path, SWEEP)
    assert loaded.topologies == ((1, 1), (2, 1)) and loaded.launcher == "submitit_local"
    assert loaded.jobs() == plan.jobs() and doc["predictions"]
    cli.main(["--status", SWEEP, "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "launcher submitit_local" in out and "5 of 12 runs done, 7 to go" in out
    cli.main(["--aggregate", SWEEP, "--results-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert "partial" in out and "missing: scaling: 5 of 12 runs done" in err
    part = pd.read_csv(tmp_path / "scaling" / "partial" / f"{SWEEP}.csv")
    assert set(part[part["kind"] == "measured"]["run_id"]) == {"n1", "d1"}
    assert not (tmp_path / "scaling" / f"{SWEEP}.csv").exists()
    # the rest recorded: nothing is run again, and the table is complete
    for i in plan.pending():
        n, _, comm, seed = plan.points()[i]
        _run(tmp_path, f"r{i}", comm, n, ep, seed)
    sent: list = []
    assert plan.pending() == []
    assert plan.run(tmp_path, lambda jobs, *_: sent.extend(jobs) or []) == [] and sent == []
    cli.main(["--aggregate", SWEEP, "--results-dir", str(tmp_path)])
    assert "partial" not in capsys.readouterr().out
    done = pd.read_csv(tmp_path / "scaling" / f"{SWEEP}.csv")
    assert (done[done["kind"] == "measured"]["n_runs"] == 2).all()
    # the same sweep id with another command: refused before anything runs
    with pytest.raises(SystemExit) as e:
        cli.main(["--sweep-id", SWEEP, "--cluster", "local", "--comm", "dense", "--topologies",
                  "1x1,4x1", "--dry-run", "--results-dir", str(tmp_path)])  # fmt: skip
    assert e.value.code == 2 and "differs in repeats, topologies" in capsys.readouterr().err
    # a plan made before the rounds: refused with the table it wrote named
    old = tmp_path / "scaling" / "scaling-old.plan.json"
    old.write_text('{"sweep_id": "scaling-old", "predictions": []}')
    with pytest.raises(SystemExit) as e:
        cli.main(["--aggregate", "scaling-old", "--results-dir", str(tmp_path)])
    assert "made before --repeats" in capsys.readouterr().err


def test_the_figure_reads_an_older_csv_beside_a_newer_one(tmp_path: Path) -> None:
    from bench.report.scaling import newest_sweep

    old = pd.DataFrame({"sweep_id": ["scaling-1"], "comm": ["dense"], "nnodes": [2],
                        "nproc_per_node": [1], "efficiency": [0.7]})  # fmt: skip
    new = pd.DataFrame({"sweep_id": ["scaling-2"], "comm": ["dense"], "nodes": [4],
                        "workers_per_node": [1], "efficiency": [0.5],
                        "predicted_step_s": [0.3]})  # fmt: skip
    df = newest_sweep(pd.concat([old, new], ignore_index=True, sort=False))
    assert list(df["nodes"]) == [4] and list(df["workers_per_node"]) == [1]
    assert list(newest_sweep(old)["nodes"]) == [2]


def test_a_narrower_check_run_later_does_not_hide_the_study_it_checks() -> None:
    """The figure and the report draw the sweep that measured the most methods; a later
    sweep of fewer methods is reported beside it as a model check, not instead of it."""
    from bench.report.scaling import later_check_lines, later_checks, newest_sweep

    def sweep(sid: str, comms: list[str], sizes: list[tuple[int, int]]) -> pd.DataFrame:
        rows = [{"sweep_id": sid, "kind": "measured", "comm": c, "nodes": n,
                 "workers_per_node": m, "efficiency": 0.5, "step_s": 0.2,
                 "predicted_step_s": 0.19, "model_error": -0.05}
                for c in [*comms, "nocomm"] for n, m in sizes]  # fmt: skip
        return pd.DataFrame(rows)

    study = sweep("scaling-1", ["dense", "fp16", "hitopk"], [(2, 1), (2, 2), (4, 2)])
    check = sweep("scaling-2", ["dense", "diloco"], [(2, 2), (4, 2)])
    both = pd.concat([study, check], ignore_index=True)
    assert set(newest_sweep(both)["sweep_id"]) == {"scaling-1"}
    assert [set(d["sweep_id"]) for d in later_checks(both)] == [{"scaling-2"}]
    (line, _) = later_check_lines(both)
    assert "`scaling-2`" in line and "diloco 0.50 at 2x2, 0.50 at 4x2" in line
    wider = sweep("scaling-3", ["dense", "fp16", "hitopk", "diloco"], [(2, 2)])
    assert set(newest_sweep(pd.concat([both, wider]))["sweep_id"]) == {"scaling-3"}
    assert later_checks(pd.concat([both, wider])) == []  # nothing after the study


def test_the_report_says_what_the_measured_curve_shows(table: pd.DataFrame, tmp_path: Path) -> None:
    from bench.report.scaling import scaling_lines

    csv = tmp_path / "s.csv"
    table.to_csv(csv, index=False)
    (text, _) = scaling_lines([csv])
    assert f"sweep `{SWEEP}`" in text
    # 0.2 / 0.4 and 0.2 / 0.25, each with its interval over the rounds
    assert re.search(r"dense 0\.50 \[0\.\d\d, 0\.\d\d\] at 2x1", text)
    assert re.search(r"hitopk 0\.80 \[0\.\d\d, 0\.\d\d\] at 2x1", text)
    assert "not drawn" in text and "within 25%" in text


def test_the_calibration_run_sets_the_model_compute_at_its_size(tmp_path: Path) -> None:
    """The model's compute at a size is its calibration run's step (made after the
    warm-up, before any round): the prediction shifts by calibration - the plan's
    compute-only step, and the plan's own prediction stays beside it."""
    from bench.sweeps.common import sweep_records

    ep = [(128, 2, 9.0)]
    _run(tmp_path, "w", "dense", 2, [*ep, (256, 4, 4.0)], WARM)  # 1 s/step: left out
    _run(tmp_path, "cal", "nocomm", 2, [*ep, (256, 4, 1.0)], CAL)  # 0.25 s/step
    for r in range(2):
        _run(tmp_path, f"d{r}", "dense", 2, [*ep, (256, 4, 2.6)], R0 + r)  # 0.65 s/step
        _run(tmp_path, f"n{r}", "nocomm", 2, [*ep, (256, 4, 1.2)], R0 + r)  # 0.3 s/step
    table = st.build_table(sweep_records(tmp_path, SWEEP), _plan_doc(dense_2=0.6))
    two = table[table["kind"] == "measured"].set_index("comm")
    assert two.loc["dense", "run_id"] == "d0 d1" and two.loc["nocomm", "run_id"] == "n0 n1"
    assert two.loc["dense", "step_s"] == pytest.approx(0.65)
    assert two.loc["nocomm", "compute_only_step_s"] == pytest.approx(0.3)
    assert two.loc["nocomm", "calibration_step_s"] == pytest.approx(0.25)
    assert two.loc["nocomm", "compute_drift"] == pytest.approx(0.3 / 0.25 - 1)
    assert "+20% at 2x1" in st.summary(table)[-2]  # the drift, said
    # the plan predicted 0.6 with a compute-only step of 0.2: 0.4 of communication
    assert two.loc["dense", "predicted_before_launch_s"] == pytest.approx(0.6)
    assert two.loc["dense", "predicted_step_s"] == pytest.approx(0.25 + 0.4)
    assert two.loc["dense", "model_error"] == pytest.approx(0.65 / 0.65 - 1)
    assert two.loc["dense", "model_error_before_launch"] == pytest.approx(0.6 / 0.65 - 1)
    assert two.loc["nocomm", "predicted_step_s"] == pytest.approx(0.25)
