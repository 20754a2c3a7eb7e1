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


def _run(tmp: Path, run_id: str, comm: str, n: int, epochs: list[tuple[int, int, float]]):
    """A record and its curve: (samples, steps, training seconds) per epoch."""
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
            "config": {"results": {"sweep_id": SWEEP}, "cluster": cl},
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
    return {"sweep_id": SWEEP, "numel": 1_000_000, "sizes": sizes, "predictions": pred}


@pytest.fixture
def table(tmp_path: Path) -> pd.DataFrame:
    from bench.sweeps.common import sweep_records

    # the first epoch (warm-up) is slow and left out; later epochs: (samples, steps, s)
    _run(tmp_path, "n1", "nocomm", 1, [(64, 2, 9.0), (128, 4, 0.4)])  # 0.1 s/step, 320/s
    _run(tmp_path, "d1", "dense", 1, [(64, 2, 9.0), (128, 4, 0.4)])
    # the launch's two warm-up runs (the first 7x slower), left out of the compute-only step
    _run(tmp_path, "n2w", "nocomm", 2, [(128, 2, 9.0), (256, 4, 5.6)])
    _run(tmp_path, "n2", "nocomm", 2, [(128, 2, 9.0), (256, 4, 1.2), (256, 4, 1.2)])  # 0.3
    _run(tmp_path, "d2", "dense", 2, [(128, 2, 9.0), (256, 4, 1.6)])  # 0.4 s/step
    _run(tmp_path, "h2", "hitopk", 2, [(128, 2, 9.0), (256, 4, 1.0)])  # 0.25 s/step
    # the size's last run: the compute-only step after the methods, 0.2 s/step
    _run(tmp_path, "n2b", "nocomm", 2, [(128, 2, 9.0), (256, 4, 0.8)])
    append_record(tmp_path, {"run_id": "dead", "status": "error",
                             "config": {"results": {"sweep_id": SWEEP}}})  # fmt: skip
    return st.build_table(sweep_records(tmp_path, SWEEP), _plan_doc())


def test_efficiency_arithmetic_on_fixture_rows(table: pd.DataFrame) -> None:
    assert list(table.columns) == st.COLUMNS
    meas = table[table["kind"] == "measured"].set_index("run_id")
    assert set(meas.index) == {"n1", "d1", "n2b", "d2", "h2"}  # the error run has no time
    assert meas.loc["d2", "step_s"] == pytest.approx(0.4)  # warm-up epoch left out
    # the compute-only run after the methods; the two before them warmed the launch up
    n2 = meas.loc["n2b"]
    assert n2["step_s"] == pytest.approx(0.2) and n2["measured_steps"] == 4
    assert math.isnan(n2["compute_only_spread"])  # one run: no spread
    assert meas.loc["d2", "compute_only_step_s"] == pytest.approx(0.2)
    assert meas.loc["d2", "efficiency"] == pytest.approx(0.2 / 0.4)
    assert meas.loc["h2", "efficiency"] == pytest.approx(0.2 / 0.25)
    assert n2["efficiency"] == pytest.approx(1.0)
    # textbook: throughput(N) / (N x throughput(1x1 nocomm)): 160 / (2 x 320)
    assert meas.loc["d2", "throughput"] == pytest.approx(160.0)
    assert meas.loc["d2", "textbook_efficiency"] == pytest.approx(0.25)
    assert meas.loc["d2", "model_error"] == pytest.approx(0.6 / 0.4 - 1)
    assert meas.loc["h2", "predicted_efficiency"] == pytest.approx(0.2 / 0.3)
    # dense ring allreduce of 1 M fp32 over 2 nodes: 4 MB over each link at 40 Mbit/s
    assert meas.loc["d2", "link_ratio"] == pytest.approx(4e6 * 8 / 40e6 / 0.2, rel=0.05)
    assert math.isnan(meas.loc["d1", "link_ratio"])  # one node: no link
    assert meas.loc["d2", "target_ratio"] == pytest.approx(1.34)


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
    # an old-format table (nnodes, nproc_per_node; no prediction) still draws
    old = pd.DataFrame({"sweep_id": "s0", "cluster": "local", "comm": ["dense", "dense"],
                        "nnodes": [1, 2], "nproc_per_node": 1, "efficiency": [1.0, 0.7],
                        "kind": "measured"})  # fmt: skip
    assert fs.plot_scaling(old, tmp_path / "old.png") is not None


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


def test_plan_runs_the_compute_only_step_first_at_every_size() -> None:
    plan = sc.Plan(sweep_id="x", comms=("dense", "hitopk"), topologies=((1, 1), (2, 1), (2, 2)))
    n = "nocomm"
    # per size: a dense run that warms the launch up, a compute-only run that calibrates
    # the model's compute, the methods, the compute-only run the efficiency divides by
    d = "dense"
    assert plan.points() == [(1, 1, d), (1, 1, n), (1, 1, d), (1, 1, n),
                             (2, 1, d), (2, 1, n), (2, 1, d), (2, 1, "hitopk"), (2, 1, n),
                             (2, 2, d), (2, 2, n), (2, 2, d), (2, 2, "hitopk"),
                             (2, 2, n)]  # fmt: skip
    jobs = dict(plan.jobs())
    assert "cluster=local" in jobs[(1, 1, "dense")] and "cluster=emulated" in jobs[(2, 1, "dense")]
    assert "data.batch_size=128" in jobs[(2, 2, "hitopk")]  # 32 per worker
    assert sc.parse_topologies("2x1, 1x1") == [(1, 1), (2, 1)]


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
    # the estimate reads earlier scaling runs: one of 1x1, 12 s, in a reference of its own
    ref = tmp_path / "ref"
    train = {"max_steps_per_epoch": 2, "epochs": 3}
    cfg = {"results": {"sweep_id": "scaling-old"}, "train": train}
    old = {"run_id": "old", "status": "ok", "experiment": "dawnbench_digits", "nnodes": 1}
    append_record(ref, {**old, "world_size": 1, "wall_time_s": 12.0, "config": cfg})
    monkeypatch.setattr("reproduce._dryrun.REFERENCE", str(ref))
    cli.main(["--quick", "--dry-run", "--results-dir", str(tmp_path / "res")])
    out = capsys.readouterr().out
    n = int(re.search(r"(\d+) runs in 2 launches", out)[1])  # 1x1's four, 2x1's
    assert "first: python -m reproduce train" in out
    assert "expected time: about 48 s for 4 run(s)" in out  # 1x1's four runs
    assert f"{n - 4} run(s) of sizes never run before not counted" in out
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
    assert len(meas) == 5 and (meas["step_s"] > 0).all()  # nocomm's 2 runs a size: 1 row
    assert meas["predicted_step_s"].notna().all() and meas["efficiency"].between(0, 3).all()
    assert (df["kind"] == "projected").sum() == 2 * 5
    assert plan.stat().st_mtime < min((tmp_path / "curves").stat().st_mtime, csv.stat().st_mtime)


def test_a_resumed_sweep_runs_only_what_has_no_finished_record(tmp_path: Path, capsys) -> None:
    plan = sc.Plan(sweep_id=SWEEP, cluster="local", comms=("dense",),
                   topologies=((1, 1), (2, 1)), results_dir=str(tmp_path),
                   launcher="submitit_local")  # fmt: skip
    sc.write_plan(_plan_doc(), tmp_path, plan)
    _run(tmp_path, "n1", "nocomm", 1, [(64, 2, 9.0), (128, 4, 0.4)])
    _run(tmp_path, "d1", "dense", 1, [(64, 2, 9.0), (128, 4, 0.4)])
    _run(tmp_path, "n2", "nocomm", 2, [(128, 2, 9.0), (256, 4, 0.8)])
    cfg = {"results": {"sweep_id": SWEEP}, "cluster": {"nnodes": 2, "nproc_per_node": 1}}
    append_record(tmp_path, {"run_id": "x", "status": "error", "comm": "dense", "config": cfg})
    # per size: dense (the warm-up), nocomm (the calibration), dense, nocomm; 2x1's dense
    # failed (it measured nothing): 1x1 lacks its second dense and nocomm runs, 2x1 both
    # dense runs and its last nocomm
    assert plan.pending() == [2, 3, 4, 6, 7]
    loaded, doc = sc.load(tmp_path, SWEEP)
    assert loaded.topologies == ((1, 1), (2, 1)) and loaded.launcher == "submitit_local"
    assert loaded.jobs() == plan.jobs() and doc["predictions"]
    cli.main(["--status", SWEEP, "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "launcher submitit_local" in out and "3 of 8 runs done, 5 to go" in out
    cli.main(["--aggregate", SWEEP, "--results-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert "partial" in out and "missing: scaling: 3 of 8 runs done" in err
    part = pd.read_csv(tmp_path / "scaling" / "partial" / f"{SWEEP}.csv")
    assert set(part[part["kind"] == "measured"]["run_id"]) == {"n1", "d1", "n2"}
    assert not (tmp_path / "scaling" / f"{SWEEP}.csv").exists()
    # the same sweep id with another command: refused before anything runs
    with pytest.raises(SystemExit) as e:
        cli.main(["--sweep-id", SWEEP, "--cluster", "local", "--comm", "dense", "--topologies",
                  "1x1,4x1", "--dry-run", "--results-dir", str(tmp_path)])  # fmt: skip
    assert e.value.code == 2 and "differs in topologies" in capsys.readouterr().err


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
    assert "dense 0.50 at 2x1" in text and "hitopk 0.80 at 2x1" in text  # 0.2 / 0.4, / 0.25
    assert "not drawn" in text and "within 25%" in text


def test_the_calibration_run_sets_the_model_compute_at_its_size(tmp_path: Path) -> None:
    """With a calibration run (the third compute-only run of a size), the model's compute
    at that size is its measured step: the prediction shifts by calibration - the plan's
    compute-only step, and the plan's own prediction stays beside it."""
    from bench.sweeps.common import sweep_records

    _run(tmp_path, "n1", "nocomm", 1, [(64, 2, 9.0), (128, 4, 0.4)])
    _run(tmp_path, "d1", "dense", 1, [(64, 2, 9.0), (128, 4, 0.4)])
    for i in range(sm.OLD_WARMUP_NOCOMM):  # a plan of compute-only warm-ups: left out
        _run(tmp_path, f"w{i}", "nocomm", 2, [(128, 2, 9.0), (256, 4, 5.6)])
    _run(tmp_path, "cal", "nocomm", 2, [(128, 2, 9.0), (256, 4, 1.0)])  # 0.25 s/step
    _run(tmp_path, "d2", "dense", 2, [(128, 2, 9.0), (256, 4, 2.6)])  # 0.65 s/step
    _run(tmp_path, "ref", "nocomm", 2, [(128, 2, 9.0), (256, 4, 1.2)])  # 0.3 s/step
    doc = {**_plan_doc(dense_2=0.6), "calibration_runs": 1}
    table = st.build_table(sweep_records(tmp_path, SWEEP), doc)
    meas = table[table["kind"] == "measured"].set_index("comm")
    two = meas[meas["nodes"] == 2]
    assert two.loc["nocomm", "run_id"] == "ref"  # the reference: the run after the methods
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
    one = meas[meas["nodes"] == 1]  # no calibration run at 1x1 here: the plan's prediction
    assert one.loc["dense", "predicted_step_s"] == pytest.approx(0.1)


def test_the_dense_warm_up_is_left_out_and_the_later_dense_run_kept(tmp_path: Path) -> None:
    """A plan whose launches open with a dense warm-up: the size's dense row is its later
    run, and the first compute-only run is the calibration."""
    from bench.sweeps.common import sweep_records

    _run(tmp_path, "wd", "dense", 2, [(128, 2, 9.0), (256, 4, 4.0)])  # warm-up: 1 s/step
    _run(tmp_path, "cal", "nocomm", 2, [(128, 2, 9.0), (256, 4, 1.0)])  # 0.25 s/step
    _run(tmp_path, "d2", "dense", 2, [(128, 2, 9.0), (256, 4, 2.6)])  # 0.65 s/step
    _run(tmp_path, "ref", "nocomm", 2, [(128, 2, 9.0), (256, 4, 1.2)])
    doc = {**_plan_doc(dense_2=0.6), "calibration_runs": 1, "warmup_runs": 1,
           "warmup_comm": "dense"}  # fmt: skip
    meas = st.build_table(sweep_records(tmp_path, SWEEP), doc)
    two = meas[(meas["kind"] == "measured") & (meas["nodes"] == 2)].set_index("comm")
    assert two.loc["dense", "run_id"] == "d2" and two.loc["dense", "step_s"] == pytest.approx(0.65)
    assert two.loc["nocomm", "run_id"] == "ref"
    assert two.loc["nocomm", "calibration_step_s"] == pytest.approx(0.25)
    assert two.loc["dense", "predicted_step_s"] == pytest.approx(0.25 + 0.4)
