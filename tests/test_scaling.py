"""``reproduce scaling``: throughput from each run's last epoch, efficiency against the
1 x 1 run, the model's projection (and a clear error when its interface changes), dry
runs that run nothing, bad input refused."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from bench.results.records import append_record
from bench.sweeps import scaling as sc
from reproduce import scaling as cli
from tests.conftest import TINY, run_cli

SWEEP = "scaling-test-0001"


def _run(tmp: Path, run_id: str, comm: str, n: int, m: int, epochs: list[tuple[int, float]]):
    """A record and its curve: (samples, training seconds) per epoch."""
    curve = tmp / "curves" / f"{run_id}.csv"
    curve.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(
        {
            "epoch": range(1, len(epochs) + 1),
            "data/samples": [s for s, _ in epochs],
            "clock/epoch_s": [t for _, t in epochs],
        }
    ).to_csv(curve, index=False)
    total_s, total_t = sum(s for s, _ in epochs), sum(t for _, t in epochs)
    append_record(
        tmp,
        {
            "run_id": run_id,
            "status": "target_missed",
            "comm": comm,
            "nnodes": n,
            "throughput_samples_per_s": total_s / total_t,
            "curve": str(curve),
            "config": {
                "results": {"sweep_id": SWEEP},
                "cluster": {"name": "local", "nnodes": n, "nproc_per_node": m},
            },
        },
    )


def test_measured_throughput_is_the_last_epochs_and_efficiency_is_against_1x1(
    tmp_path: Path,
) -> None:
    from bench.sweeps.common import sweep_records

    _run(tmp_path, "one", "dense", 1, 1, [(100, 10.0), (200, 2.0)])  # warm-up epoch slow
    _run(tmp_path, "d2", "dense", 2, 1, [(400, 20.0), (400, 2.5)])
    _run(tmp_path, "h2", "hitopk", 2, 1, [(400, 20.0), (360, 2.0)])
    append_record(
        tmp_path,
        {"run_id": "dead", "status": "error", "config": {"results": {"sweep_id": SWEEP}}},
    )
    df = sc.measured(sweep_records(tmp_path, SWEEP), SWEEP)
    assert list(df.columns) == sc.COLUMNS and set(df["kind"]) == {"measured"}
    rows = {r.run_id: r for r in df.itertuples()}
    assert set(rows) == {"one", "d2", "h2"}  # the error run has no throughput
    assert rows["one"].throughput_samples_per_s == pytest.approx(100.0)
    assert rows["one"].efficiency == pytest.approx(1.0)
    assert rows["d2"].throughput_samples_per_s == pytest.approx(160.0)
    assert rows["d2"].efficiency == pytest.approx(0.8)  # 160 / (2 x 100)
    assert rows["h2"].efficiency == pytest.approx(0.9)
    assert (rows["h2"].nnodes, rows["h2"].nproc_per_node, rows["h2"].world_size) == (2, 1, 2)


def test_points_skip_hitopk_on_one_node() -> None:
    plan = sc.Plan(sweep_id="x", comms=("dense", "hitopk"), topologies=((1, 1), (1, 2), (2, 2)))
    assert plan.points() == [("dense", 1, 1), ("dense", 1, 2), ("dense", 2, 2), ("hitopk", 2, 2)]
    assert plan.skipped() == ["hitopk on 1x2: needs >= 2 nodes"]
    batches = [next(o for o in job if o.startswith("data.batch_size=")) for _, job in plan.jobs()]
    assert batches == ["data.batch_size=64", "data.batch_size=128", "data.batch_size=256"] + [
        "data.batch_size=256"
    ]


def test_projection_from_the_performance_model() -> None:
    df = sc.projected(["dense", "hitopk"], SWEEP)
    assert set(df["kind"]) == {"projected"} and set(df["comm"]) == {"dense", "hitopk"}
    at16 = df[df["nnodes"] == 16]
    assert set(at16["world_size"]) == {128} and len(at16) == 2
    assert df["efficiency"].between(0, 1.0 + 1e-9).all()
    assert df["throughput_samples_per_s"].isna().all()  # the model gives efficiency only
    eff = dict(zip(at16["comm"], at16["efficiency"]))
    assert eff["hitopk"] > eff["dense"]  # 25 Gbit/s: the paper's point


def test_a_changed_model_interface_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.cluster import perfmodel

    def project(workload, links):  # required arguments this sweep cannot fill
        return []

    monkeypatch.setattr(perfmodel, "project", project, raising=False)
    with pytest.raises(sc.ModelChanged, match="cannot fill"):
        sc.projected(["dense"], SWEEP)

    def old_style(gbps=(25,), nodes=(1,), procs_per_node=8):
        return [
            {"gbps": g, "nodes": n, "procs_per_node": procs_per_node, "comm": c, "efficiency": 0.5}
            for g in gbps
            for n in nodes
            for c in ("dense", "mstopk", "hitopk")
        ]

    monkeypatch.setattr(perfmodel, "project", old_style, raising=False)
    df = sc.projected(["dense", "hitopk"], SWEEP)
    assert len(df) == 2 * 5 and set(df["nproc_per_node"]) == {8}

    def no_efficiency(gbps=(25,), nodes=(1,)):
        return [{"gbps": 25, "nodes": 1}]

    monkeypatch.setattr(perfmodel, "project", no_efficiency, raising=False)
    with pytest.raises(sc.ModelChanged, match="rows lack"):
        sc.projected(["dense"], SWEEP)


def test_dry_run_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import bench.sweeps.common as common

    def no_run(*a, **k):
        raise AssertionError("a dry run started a job")

    monkeypatch.setattr(common, "run_train", no_run)
    cli.main(["--quick", "--dry-run", "--results-dir", str(tmp_path / "res")])
    out = capsys.readouterr().out
    assert "3 runs" in out and "cluster.nnodes=2 cluster.nproc_per_node=1 comm=hitopk" in out
    assert "projected: 10 rows" in out and not (tmp_path / "res").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--comm", "dense,zip"], "unknown comm 'zip'"),
        (["--topologies", "2x2"], "must include 1x1"),
        (["--topologies", "1x1,2by2"], "'2by2' is not NODESxWORKERS"),
        (["--cluster", "moon"], "unknown cluster 'moon'; known: emulated, local, multinode"),
        (["--experiment", "nope"], "unknown experiment 'nope'"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--dry-run", "--results-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_quick_scaling_measures_and_projects(tmp_path: Path) -> None:
    tiny = [o for o in TINY if not o.startswith(("train.", "data.batch_size"))]
    p = run_cli(
        "scaling", "--quick", "--steps", "2", "--batch-per-worker", "16",
        "--results-dir", str(tmp_path), *tiny, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (csv,) = (tmp_path / "scaling").glob("*.csv")
    df = pd.read_csv(csv)
    meas = df[df["kind"] == "measured"]
    assert len(meas) == 3 and (meas["throughput_samples_per_s"] > 0).all()
    one = meas[meas["world_size"] == 1]
    assert math.isclose(one["efficiency"].iloc[0], 1.0)
    assert (df["kind"] == "projected").sum() == 10
