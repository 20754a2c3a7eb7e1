"""``reproduce ablation``: the table from fixture records (means, stds, missed targets,
speedups), the CSV never replaced, dry runs that run nothing, bad input refused."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from bench import methods
from bench.results.records import append_record
from bench.sweeps import ablation as ab
from reproduce import ablation as cli
from tests.conftest import TINY, run_cli

SWEEP = "ablation-test-0001"


def _record(run_id: str, comm: str, tta: float | None, *, sweep: str = SWEEP, **kw) -> dict:
    return {
        "run_id": run_id,
        "status": "ok" if tta is not None else "target_missed",
        "experiment": "dawnbench_digits",
        "comm": comm,
        "cache": kw.get("cache", "none"),
        "update": kw.get("update", "naive"),
        "target_metric": "top1",
        "target_value": 0.98,
        "time_to_target_s": tta,
        "epochs_to_target": None if tta is None else kw.get("epochs", 5),
        "throughput_samples_per_s": kw.get("thr", 100.0),
        "config": {"results": {"sweep_id": sweep}, "cluster": {"name": "local"}},
    }


@pytest.fixture
def results(tmp_path: Path) -> Path:
    recs = [
        _record("b1", "dense", 10.0, thr=100.0),
        _record("b2", "dense", 12.0, thr=200.0),
        _record("b3", "dense", 14.0, thr=300.0, epochs=6),
        _record("h1", "hitopk", 5.0),
        _record("h2", "hitopk", 6.0),
        _record("h3", "hitopk", None),  # missed the target: counted, not dropped
        _record("f1", "dense", 24.0, update="flat"),  # one run: no std
        _record("x1", "dense", 1.0, sweep="another-sweep"),  # not this sweep
    ]
    for r in recs:
        append_record(tmp_path, r)
    return tmp_path


def test_aggregate_means_stds_missed_targets_and_speedups(results: Path) -> None:
    from bench.sweeps.common import sweep_records

    df = ab.aggregate(sweep_records(results, SWEEP), SWEEP)
    assert list(df.columns[:15]) == ab.COLUMNS[:15]
    rows = {(r.comm, r.update): r for r in df.itertuples()}
    assert set(rows) == {("dense", "naive"), ("hitopk", "naive"), ("dense", "flat")}
    base, hi, flat = rows["dense", "naive"], rows["hitopk", "naive"], rows["dense", "flat"]
    assert df.iloc[0]["comm"] == "dense" and df.iloc[0]["update"] == "naive"  # baseline first
    assert (base.n_runs, base.n_reached) == (3, 3)
    assert base.time_to_target_mean_s == pytest.approx(12.0)
    assert base.time_to_target_std_s == pytest.approx(2.0)
    assert base.epochs_to_target_mean == pytest.approx(16 / 3)
    assert base.throughput_mean == pytest.approx(200.0)
    assert (base.speedup_vs_baseline, base.speedup_std) == (1.0, 0.0)
    assert (hi.n_runs, hi.n_reached) == (3, 2)
    assert hi.time_to_target_mean_s == pytest.approx(5.5)
    assert hi.time_to_target_std_s == pytest.approx(math.sqrt(0.5))
    assert hi.speedup_vs_baseline == pytest.approx(12 / 5.5)
    # standard errors 2/sqrt(3) on 12 and 0.5 on 5.5, worked by hand
    assert hi.speedup_std == pytest.approx(0.28882, abs=1e-4)
    assert hi.run_ids == "h1 h2 h3"
    assert flat.n_runs == 1 and math.isnan(flat.time_to_target_std_s)
    assert flat.speedup_vs_baseline == pytest.approx(0.5) and math.isnan(flat.speedup_std)


def test_a_narrowed_sweep_compares_with_dense_of_its_own_cache_and_update() -> None:
    recs = [
        _record("d1", "dense", 20.0, update="flat"),
        _record("d2", "dense", 22.0, update="flat"),
        _record("h1", "hitopk", 10.0, update="flat"),
        _record("h2", "hitopk", 12.0, update="flat"),
        _record("p1", "powersgd", 10.0, cache="multilevel", update="flat"),  # no dense there
    ]
    rows = {r.comm: r for r in ab.aggregate(recs, SWEEP).itertuples()}
    assert rows["hitopk"].speedup_vs_baseline == pytest.approx(21 / 11)
    assert rows["hitopk"].baseline == "dense/none/flat"
    assert rows["dense"].speedup_vs_baseline == 1.0
    assert math.isnan(rows["powersgd"].speedup_vs_baseline) and rows["powersgd"].baseline == ""


def test_no_run_reached_and_no_baseline() -> None:
    recs = [_record("a", "topk", None), _record("b", "topk", None)]
    df = ab.aggregate(recs, SWEEP)
    (row,) = df.itertuples()
    assert (row.n_runs, row.n_reached) == (2, 0)
    assert math.isnan(row.time_to_target_mean_s) and math.isnan(row.speedup_vs_baseline)


def test_aggregate_command_writes_the_csv_once(
    results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli.main(["--aggregate", SWEEP, "--results-dir", str(results)])
    out = capsys.readouterr().out
    path = results / "ablation" / f"{SWEEP}.csv"
    assert f"table: {path}" in out and "2/3" in out
    df = pd.read_csv(path)
    assert len(df) == 3 and set(df["sweep_id"]) == {SWEEP}
    before = path.read_text()
    cli.main(["--aggregate", SWEEP, "--results-dir", str(results)])
    assert "(unchanged)" in capsys.readouterr().out and path.read_text() == before
    # a record added later makes another table: the written one is not replaced
    append_record(results, _record("h4", "hitopk", 7.0))
    with pytest.raises(SystemExit) as e:
        cli.main(["--aggregate", SWEEP, "--results-dir", str(results)])
    assert e.value.code == 2 and "not replaced" in capsys.readouterr().err
    assert path.read_text() == before


def test_aggregate_of_an_unknown_sweep_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--aggregate", "no-such-sweep", "--results-dir", str(tmp_path)])
    assert e.value.code == 2 and "no-such-sweep" in capsys.readouterr().err


def test_dry_run_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import bench.sweeps.common as common

    def no_run(*a, **k):
        raise AssertionError("a dry run started a job")

    monkeypatch.setattr(common, "run_queued", no_run)
    res = tmp_path / "res"
    argv = ["--quick", "--dry-run", "--cluster", "local", "--results-dir", str(res)]
    cli.main([*argv, "--grid", "--verbose"])
    out = capsys.readouterr().out
    assert "2 jobs" in out and "comm=dense" in out and "comm=hitopk" in out
    assert "job 1: python -m reproduce train experiment=dawnbench_digits cluster=local" in out
    assert not res.exists()  # nothing recorded, no directory made
    # the default: the protocol, its stages per method, one command line, nothing run
    cli.main(argv)
    out = capsys.readouterr().out
    assert "protocol equal-budget-v3" in out and "6 tuning runs" in out  # dense tuned too
    assert "tuning: 6 runs (dense 3, hitopk 3)" in out  # one knob setting at 3 rates
    assert "a smoke test, not the protocol: 1 tuning seed" in out
    # a quick try on the local cluster measures nothing: no root, no emulated cluster
    assert "timing pass" not in out and "emulated" not in out
    assert "no measured cluster: each cluster's number is the model's projection" in out
    assert "first: python -m reproduce train " in out and "line: --verbose)" in out
    assert "tune 1:" not in out and len(out.splitlines()) <= 13
    cli.main([*argv, "--verbose", "--measured", "paper"])  # every job's command line
    out = capsys.readouterr().out
    assert "shaping: 4-20 runs on measured-1.34" in out and "timing pass: 4 runs on" in out
    assert "results.protocol_role=shape" in out and "tune 3: python -m reproduce train" in out
    assert "cluster=emulated cluster.nnodes=2 cluster.nproc_per_node=2 cluster.profile=paper" in out
    assert "results.protocol_role=tune" in out and "comm=hitopk" in out
    assert not res.exists()
    grid = ["--grid", "--comm", "dense", "--seeds", "2", "--cluster", "local", "--verbose"]
    cli.main(["--dry-run", *grid, "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    # digits: cache=multilevel is the same input as cache=none, so not run twice, and said
    assert f"{1 * 1 * 2 * 2} jobs" in out and "train.seed=1" in out
    assert "comm=dense cache=none optim.update=flat train.seed=1" in out
    jobs = [ln for ln in out.splitlines() if ln.startswith("job ")]
    assert len(jobs) == 4 and not any("cache=multilevel" in ln for ln in jobs)
    assert "cache=multilevel dropped from the grid" in out
    assert "cache=multilevel trains on the same in-memory input as cache=none" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--comm", "dense,gzip"], "unknown comm 'gzip'; known: dense, fp16, bf16, powersgd"),
        (["--experiment", "nope"], "unknown experiment 'nope'; known: dawnbench_cifar10"),
        (["--grid", "--cache", "ssd"], "unknown cache 'ssd'"),
        (["--grid", "--update", "fast"], "unknown update 'fast'"),
        (["--cache", "none"], "--cache and --update narrow the --grid sweep only"),
        (["--seeds", "0"], "--seeds must be >= 1"),
        (["--grid", "--seeds", "0"], "--seeds must be >= 1"),
        (["--workload", "audio"], "unknown workload 'audio'; known: image, translation"),
        (["--seeds", "two"], "invalid int value"),
        (["optim.learning_rate=1"], "learning_rate"),
        (
            ["--resume", "abl-x", "--comm", "dense"],
            "--resume abl-x runs the sweep's saved plan, so --cluster, --comm would be ignored",
        ),
        (["--resume", "abl-x", "train.seed=3"], "so --cluster, override train.seed=3 would"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--cluster", "local", "--dry-run", "--results-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs.jsonl").exists()


@pytest.mark.slow
def test_quick_ablation_trains_and_tabulates(tmp_path: Path) -> None:
    """The real thing, tiny: the quick protocol's jobs, each a recorded run."""
    tiny = [o for o in TINY if not o.startswith("train.progress")]
    p = run_cli(
        "ablation", "--quick", "--cluster", "local", "--results-dir", str(tmp_path),
        "train.epochs=1", "train.target_metric=top5", "train.target_value=0.01", *tiny,
        timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (plan,) = (tmp_path / "ablation").glob("*.plan.json")
    sweep = plan.name.removesuffix(".plan.json")
    df = pd.read_csv(tmp_path / "ablation" / f"{sweep}.csv")
    assert sorted(df["comm"]) == ["dense", "hitopk"] and (df["n_runs"] == 1).all()
    tuning = pd.read_csv(tmp_path / "ablation" / f"{sweep}-tuning.csv")
    k = tuning["cluster"].nunique()  # a row per trial and cluster
    assert len(tuning[(tuning["comm"] == "hitopk") & (tuning["extension"] == 0)]) == 3 * k
    assert tuning["selected"].sum() == 2 * k
    recs = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert {r["config"]["results"]["sweep_id"] for r in recs} == {sweep}
    assert all(r["nnodes"] == 2 for r in recs)
    roles = [r["protocol"]["role"] for r in recs]
    # 3 trials of each method, their 2 timing runs each, any rate extension, then one
    # evaluation run of each method's configuration (every cluster selects the same)
    assert roles.count("time") == 4 and roles.count("eval") == 2
    assert roles.count("tune") == 6 + 2 * tuning["extension"].max()


def test_emulated_cluster_takes_the_paper_profile_when_it_has_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from omegaconf import OmegaConf

    import bench.sweeps.common as common

    overrides, note = common.cluster_profile("local")
    assert overrides == [] and "nothing shaped" in note
    with_profile = OmegaConf.create({"cluster": {"name": "emulated", "profile": "none"}})
    monkeypatch.setattr(common, "compose", lambda o: with_profile)
    overrides, note = common.cluster_profile("emulated")
    assert overrides == ["cluster.profile=paper"] and "paper-scaled" in note
    plain = OmegaConf.create({"cluster": {"name": "emulated", "inter_node_bandwidth": "1gbit"}})
    monkeypatch.setattr(common, "compose", lambda o: plain)
    overrides, note = common.cluster_profile("emulated")
    assert overrides == [] and "no 'profile' key" in note and "1gbit" in note
    # the sweep's own bandwidth wins, and the note says so
    monkeypatch.setattr(common, "compose", lambda o: OmegaConf.create({"cluster": {
        "name": "emulated", "profile": "none",
        "inter_node_bandwidth": o[-1].split("=")[1]}}))  # fmt: skip
    overrides, note = common.cluster_profile("emulated", ["cluster.inter_node_bandwidth=100mbit"])
    assert overrides == [] and "100mbit" in note and "as overridden" in note


def test_jobs_go_seed_by_seed_through_every_configuration() -> None:
    plan = ab.Plan(sweep_id="s", comms=["dense", "hitopk"], caches=["none"], updates=["flat"])
    plan.seeds = 2
    order = [(j[-4], j[-1]) for j in plan.jobs()]
    assert order == [
        ("comm=dense", "train.seed=0"),
        ("comm=hitopk", "train.seed=0"),
        ("comm=dense", "train.seed=1"),
        ("comm=hitopk", "train.seed=1"),
    ]


@pytest.mark.slow  # 51 s on 2 cores: the default suite stays under 15 minutes
def test_the_default_protocol_runs_each_workload_in_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --workload: one sweep per workload, both planned before either runs; the
    translation sweep with its own experiment (2 x 2 workers, 2 tuning seeds)."""
    import bench.sweeps.common as common

    def no_run(*a, **k):
        raise AssertionError("a dry run started a job")

    monkeypatch.setattr(common, "run_queued", no_run)
    res = tmp_path / "res"
    cli.main(["--dry-run", "--cluster", "local", "--results-dir", str(res)])
    out = capsys.readouterr().out
    sweeps = [line for line in out.splitlines() if line.startswith("sweep ablation-")]
    assert len(sweeps) == 2
    # every default method (dense, fp16, DeMo and the sync strategies too) x 6 trials x
    # 2 tuning seeds on both workloads, and a timing pass; every method is priced by the
    # step-time model
    n = 6 * 2 * len(methods.defaults())
    assert "on dawnbench_digits" in sweeps[0] and f"{n} tuning runs" in sweeps[0]
    assert "on transformer_protocol" in sweeps[1]
    assert f"{n} tuning runs" in sweeps[1] and "then 10 evaluation seeds" in sweeps[1]
    assert "not priced" not in out
    text = out[out.index(sweeps[1]) :]
    assert "cluster.nnodes=2 cluster.nproc_per_node=2" in text and "comm=topk" not in text
    assert "tuning seeds [1000, 1001]" in text and "evaluation every 12 steps" in text
    assert "in all: 2 sweeps, " in out.splitlines()[-1]  # the workloads' totals, summed
    assert not res.exists()
    # a named workload, or a sweep id, is one sweep
    cli.main(["--dry-run", "--cluster", "local", "--workload", "translation",
              "--results-dir", str(res)])  # fmt: skip
    assert capsys.readouterr().out.count("sweep ablation-") == 1
    cli.main(["--dry-run", "--cluster", "local", "--sweep-id", "ablation-x",
              "--results-dir", str(res)])  # fmt: skip
    out = capsys.readouterr().out
    assert out.count("sweep ablation-x") == 1 and "on dawnbench_digits" in out


def test_the_help_names_the_protocols_default_methods_and_seeds() -> None:
    from bench.methods import defaults
    from bench.sweeps.protocol import EVAL_SEEDS

    text = " ".join(cli._parser().format_help().split())
    assert f"{len(EVAL_SEEDS)} fresh" in text
    assert f"(default:{','.join(defaults())})" in text.replace(" ", "")
    # the grid: the default methods that are comm hooks (a sync strategy has no grid)
    assert ab.comms() == [n for n in defaults() if n in ("dense", "fp16", "powersgd", "mstopk",
                                                         "hitopk")]  # fmt: skip
