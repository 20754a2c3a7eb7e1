"""The tuning protocol on fixture records: the selection rule, evaluation seeds disjoint
from tuning seeds, intervals against a direct computation, the run order, a sweep
interrupted half way that resumes, the rate extension that puts each selected rate inside
what was tried, and a plan of retired rules refused."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from bench.cluster.netns import parse_bandwidth
from bench.registry import ConfigError
from bench.results.records import append_record, load_records, write_curve
from bench.sweeps import extension, measured
from bench.sweeps import intervals as iv
from bench.sweeps import protocol as pr
from bench.sweeps import protocol_table as pt
from bench.sweeps.common import sweep_records, write_table

SWEEP = "ablation-protocol-test"


def _rec(run_id: str, comm: str, trial: str, seed: int, tta: float | None,
         role: str = "tune") -> dict[str, Any]:  # fmt: skip
    return {
        "run_id": run_id,
        "status": "ok" if tta is not None else "target_missed",
        "experiment": "dawnbench_digits",
        "comm": comm,
        "target_metric": "top1",
        "target_value": 0.98,
        "time_to_target_s": tta,
        "train_time_s": 20.0 if tta is None else tta,
        "protocol": {"name": pr.NAME, "role": role, "trial": trial, "selected": role == "eval"},
        "config": {
            "results": {"sweep_id": SWEEP},
            "train": {"seed": seed},
            "cluster": {"name": "local"},
        },  # fmt: skip
    }


def _plan(tmp_path: Path, **kw: Any) -> pr.Plan:
    kw.setdefault("recipe_lr", 0.4)  # the digits recipe's rate, not composed here
    return pr.Plan(sweep_id=SWEEP, results_dir=str(tmp_path), cluster="local", **kw)


def test_the_rule_picks_the_lowest_median_and_ties_go_to_the_trial_declared_first() -> None:
    table = pd.DataFrame(
        [("hitopk", "a", 0, 20.0), ("hitopk", "b", 1, 12.5), ("hitopk", "c", 2, 12.5),
         ("dense", "x", 0, math.nan), ("dense", "y", 1, math.nan)],
        columns=["comm", "trial", "order", "median_time_s"],
    )  # fmt: skip
    assert pr.select(table) == {"hitopk": "b", "dense": "x"}  # no time at all: the first
    both = pd.concat([table.assign(cluster="emulated"), table.assign(cluster="paper")])
    assert pr.select_per_cluster(both) == {"emulated": pr.select(table), "paper": pr.select(table)}


def test_evaluation_seeds_are_disjoint_from_tuning_seeds(tmp_path: Path) -> None:
    plan = _plan(tmp_path, comms=("dense", "hitopk"))
    plan.check()
    tune = {j.seed for j in plan.tune_jobs()}
    chosen = {"emulated": {c: plan._space(c)[0][0] for c in plan.comms}}
    ev = plan.eval_jobs(chosen)
    assert tune == set(pr.TUNE_SEEDS) and {j.seed for j in ev} == set(pr.EVAL_SEEDS)
    assert not tune & {j.seed for j in ev} and len(pr.EVAL_SEEDS) >= pr.MIN_EVAL_SEEDS
    assert all(j.role == "eval" and j.trial == chosen["emulated"][j.comm] for j in ev)
    with pytest.raises(ConfigError, match="overlap"):
        _plan(tmp_path, tune_seeds=(0, 7)).check()
    with pytest.raises(ConfigError, match="unknown comm 'nocomm'"):  # it trains nothing
        _plan(tmp_path, comms=("dense", "nocomm")).check()


def test_intervals_match_a_direct_computation() -> None:
    a = np.array([20.0, 24.0, 21.0, 26.0, 23.0])  # dense, seeds 0-4
    b = np.array([10.0, 13.0, 10.5, 12.0, 14.0])  # a method
    m, lo, hi = iv.mean_interval(list(b))
    # a percentile bootstrap written out: resample seeds with replacement, take the mean,
    # read the 2.5 and 97.5 percentiles
    rng = np.random.default_rng(123)
    means = [b[rng.integers(0, len(b), len(b))].mean() for _ in range(20000)]
    dlo, dhi = np.percentile(means, [2.5, 97.5])
    assert m == pytest.approx(b.mean()) and lo == pytest.approx(dlo, abs=0.1)
    assert hi == pytest.approx(dhi, abs=0.1)
    assert iv.verdict(*iv.log_t_interval(list(a), list(b))[1:], 5) == "faster"
    assert iv.verdict(0.9, 1.1, 5) == "no difference measurable at n = 5"
    assert iv.verdict(0.7, 0.9, 5) == "slower"
    assert iv.verdict(math.nan, math.nan, 1) == "no difference measurable at n = 1"
    assert math.isnan(iv.mean_interval([3.0])[1])  # one seed: no interval


def test_runs_are_seed_major_and_shuffled_by_the_recorded_seed(tmp_path: Path) -> None:
    plan = _plan(tmp_path, order_seed=3)
    jobs = plan.tune_jobs()
    assert [j.seed for j in jobs] == sorted(j.seed for j in jobs)  # seed-major
    first = [(j.comm, j.trial) for j in jobs if j.seed == 1000]
    second = [(j.comm, j.trial) for j in jobs if j.seed == 1001]
    assert sorted(first) == sorted(second) and first != second  # each seed its own order
    assert jobs == _plan(tmp_path, order_seed=3).tune_jobs()  # the seed fixes the order
    assert jobs != _plan(tmp_path, order_seed=4).tune_jobs()
    ev = plan.eval_jobs({"emulated": {c: plan._space(c)[0][0] for c in plan.comms}})
    orders = {tuple(j.comm for j in ev if j.seed == s) for s in plan.eval_seeds}
    assert len(orders) > 1  # dense is not first in every seed block
    tags = plan.overrides(jobs[0])
    assert "results.protocol_role=tune" in tags and "results.protocol_selected=false" in tags
    assert f"train.eval_every_steps={pr.EVAL_EVERY_STEPS['classification']}" in tags


class _Stop(Exception):
    pass


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _in_order(plan: pr.Plan, comm: str, trial: str, lr: float) -> int:
    """A trial's steps grow with its place in the grid, so every cluster selects each
    method's first trial (its centre rate) where steps x time per step decides."""
    return 40 + 5 * [t for t, _ in plan._space(comm)].index(trial)


def _runner(plan: pr.Plan, ran: list[tuple], stop_after: int | None = None, steps_of=_in_order):
    """Each job recorded as a run would record it (a curve with its phases, a timing run's
    time per step); a tuning or evaluation run's steps to target are ``steps_of(plan, comm,
    trial, its rate)`` (+ 0-2 by seed); the sweep dies after ``stop_after`` runs in all."""

    def run(jobs: list[list[str]], sweep_dir: Path, experiment: str) -> list[int]:
        for job in jobs:
            if stop_after is not None and len(ran) == stop_after:
                raise _Stop  # the sweep dies here: the runs before it have their records
            kv = dict(o.split("=", 1) for o in job)
            role, trial = kv["results.protocol_role"], kv["results.protocol_trial"]
            comm, seed = kv["comm"], int(kv["train.seed"])
            ran.append((comm, role, trial, seed, kv.get("results.protocol_cluster", "")))
            rec = _rec(f"r{len(ran)}", comm, trial, seed, None, role)
            rec["config"]["cluster"]["name"] = kv["cluster"]
            rec["config"]["comm"] = {k[5:]: _value(v) for k, v in kv.items() if k[:5] == "comm."}
            rec["config"]["results"]["protocol_cluster"] = kv.get("results.protocol_cluster", "")
            if role in ("time", "shape"):  # dense's comm / compute at 100 Mbit/s: 3
                link = kv.get("cluster.inter_node_bandwidth", "100mbit")
                rec["config"]["cluster"]["inter_node_bandwidth"] = link
                comm_s = 0.0 if comm == "nocomm" else 0.03 * parse_bandwidth("100mbit")
                rec["step_time_s"] = 0.01 + comm_s / parse_bandwidth(link)
            else:
                steps = steps_of(plan, comm, trial, float(kv["optim.lr"])) + seed % 3
                d = rec["config"]["comm"].get("density", 1.0) if comm != "dense" else 1.0
                rec |= {"status": "ok", "steps_to_target": steps, "time_to_target_s": steps / 10}
                write_curve(plan.results_dir, rec["run_id"], [{
                    "epoch": 1, "data/steps": steps, "clock/train_s": steps / 10,
                    "acc/top1": 0.99, "comm/phases": f"{comm}/{d}/0/{steps}/1"}])  # fmt: skip
            append_record(plan.results_dir, rec)
        return [0] * len(jobs)

    return run


def test_an_interrupted_sweep_resumes_without_redoing_recorded_runs(
    tmp_path: Path, monkeypatch
) -> None:
    from bench.report.tables import is_protocol, protocol_section
    from bench.sweeps import measured
    from tests.test_measured import _model

    monkeypatch.setattr(measured, "_model", _model)  # the model's prediction, a stand-in
    plan = _plan(tmp_path, comms=("dense", "hitopk"), trials=3, eval_seeds=(0, 1, 2))
    plan.save()
    ran: list[tuple] = []
    with pytest.raises(_Stop):  # two of the tuning runs, then the interruption
        measured.run(
            plan, _runner(plan, ran, stop_after=2), tmp_path, write_table, log=lambda s: None
        )
    assert len(ran) == 2 and len(plan.tune_jobs()) == 12
    again = pr.Plan.load(tmp_path, SWEEP)
    assert again.tune_jobs() == plan.tune_jobs()  # the same order, from the saved seed
    measured.run(again, _runner(again, ran), tmp_path, write_table, log=lambda s: None)
    recs = sweep_records(tmp_path, SWEEP)
    picked = pr.chosen(again, recs)
    assert picked["measured-1.34"] == {c: again._space(c)[0][0] for c in again.comms}
    n = len(again.tune_jobs()) + len(again.timing_jobs()) + len(again.eval_jobs(picked))
    shaped = sum(r[1] == "shape" for r in ran)
    assert len(ran) == len(set(ran)) == n + shaped  # every job once, none twice
    assert pr.complete(again, recs) and not pr.pending(plan.tune_jobs(), recs)
    tuning = pd.read_csv(tmp_path / "ablation" / f"{SWEEP}-tuning.csv")
    assert tuning["selected"].sum() == 2 * len(pr.clusters(again))
    assert not tuning["extension"].any()  # the centre rate selected: inside what was tried
    before = len(load_records(tmp_path))
    quiet = {"log": lambda s: None}
    measured.run(again, _runner(again, ran), tmp_path, write_table, **quiet)  # nothing left
    assert len(load_records(tmp_path)) == before
    df = pt.aggregate(again, recs)
    emu = df[df["for_cluster"] == "measured-1.34"].set_index("comm")
    assert sorted(emu.index) == ["dense", "hitopk"] and (emu["n_runs"] == 3).all()
    assert (emu["measured_on"] == "clock").all() and list(df.columns) == pt.COLUMNS
    # the report shows the table, its intervals and its tuning trials
    write_table(df, tmp_path / "ablation" / f"{SWEEP}.csv")
    paths = sorted((tmp_path / "ablation").glob("*.csv"))
    assert [p.name for p in paths if is_protocol(p)] == [f"{SWEEP}-tuning.csv", f"{SWEEP}.csv"]
    assert (tmp_path / "ablation" / f"{SWEEP}-prediction.csv").exists()
    text = "\n".join(protocol_section(paths, tmp_path))
    assert f"From `ablation/{SWEEP}.csv` ({len(df)} configurations)" in text
    trial = emu.loc["hitopk", "trial"]
    assert f"| measured-1.34 | dawnbench_digits | hitopk | {trial} | 3/3 |" in text
    assert f"`{SWEEP}-tuning.csv`" in text


def test_a_plan_of_retired_rules_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    from reproduce.ablation import main

    plan = _plan(tmp_path)
    plan.save()
    saved = json.loads(plan.path().read_text())
    for old in ("equal-budget-v1", "equal-budget-v2"):
        plan.path().write_text(json.dumps({**saved, "name": old}))
        for flag in ("--aggregate", "--resume", "--status"):
            with pytest.raises(SystemExit) as e:
                main([flag, SWEEP, "--results-dir", str(tmp_path)])
            err = capsys.readouterr().err.strip()
            assert e.value.code == 2 and len(err.splitlines()) == 1, err
            assert f"protocol {old}, whose rules are retired" in err


def test_tuning_runs_never_enter_the_reports_comparison(tmp_path: Path) -> None:
    from bench.report.tables import config_stats, run_table

    recs = [_rec("t1", "dense", "default", 1000, 1.0)] + [
        _rec(f"e{s}", "dense", "default", s, 10.0 + s, role="eval") for s in range(2)
    ]
    (row,) = config_stats(run_table(recs, tmp_path)).itertuples()
    assert row.n_runs == 2 and row.tt_mean == pytest.approx(10.5) and "t1" not in row.run_ids


def test_a_run_made_again_counts_once_in_the_reports_comparison(tmp_path: Path) -> None:
    from bench.report.tables import config_stats, run_table

    # seed 1 ran on a busy machine and was made again (--rerun), seed 2 was interrupted then
    # run again; a grid run without a protocol role is never folded into another
    again = [_rec("e1", "dense", "default", 1, 30.0, role="eval"),
             _rec("e1b", "dense", "default", 1, 12.0, role="eval")]  # fmt: skip
    cut = {**_rec("e2", "dense", "default", 2, None, role="eval"), "status": "interrupted"}
    recs = [_rec("e0", "dense", "default", 0, 10.0, role="eval"), *again, cut,
            _rec("e2b", "dense", "default", 2, 14.0, role="eval")]  # fmt: skip
    (row,) = config_stats(run_table(recs, tmp_path)).itertuples()
    assert row.n_runs == 3 and row.n_reached == 3 and row.tt_mean == pytest.approx(12.0)
    assert "e1" not in row.run_ids and {"e0", "e1b", "e2b"} == set(row.run_ids)
    grid = [{**_rec(f"g{i}", "dense", "default", 0, 10.0 + i), "protocol": {}} for i in (0, 2)]
    (row,) = config_stats(run_table(grid, tmp_path)).itertuples()
    assert row.n_runs == 2 and row.tt_mean == pytest.approx(11.0)


def _lowest_at(quarter: bool):
    """Steps to target by rate (x the centre 0.4): falling as the rate drops, down to a
    minimum at 0.25x (``quarter``), else all the way down."""

    def steps(plan: pr.Plan, comm: str, trial: str, lr: float) -> int:
        x = math.log2(lr / 0.4)
        return round(50 + 10 * abs(x + 2)) if quarter else round(60 + 5 * x)

    return steps


def test_the_rate_extension_puts_the_minimum_inside_and_resumes_without_redoing(
    tmp_path: Path,
) -> None:
    """Steps fall as the rate drops to 0.25x: the grid's 0.5x is selected at its edge, so
    0.25x is tuned (round 1), selected at the edge again, so 0.125x (round 2); then 0.25x
    has a rate tried on either side and evaluation starts.  Interrupted inside round 1,
    the sweep resumes and runs every job once."""
    plan = _plan(tmp_path, comms=("dense",), trials=3, eval_seeds=(0, 1), measured=())
    plan.save()
    ran: list[tuple] = []
    steps, logs = _lowest_at(quarter=True), []
    with pytest.raises(_Stop):  # the grid (6), one of round 1's runs (nothing measured)
        measured.run(plan, _runner(plan, ran, 7, steps), tmp_path, write_table, log=lambda s: None)
    again = pr.Plan.load(tmp_path, SWEEP)
    recs = sweep_records(tmp_path, SWEEP)
    ext = pr.extend(again, recs)
    assert ext.rounds == 1 and not ext.settled and len(ext.jobs) == 2
    assert (
        "rate extension: 1 of 2 recorded (1 ok), 1 without a record in 1 round(s), more to decide"
        in pr.status(again, recs)
    )
    (gap,) = pt.tuning_gaps(again, recs)  # its tuning table is partial
    assert gap == "1 of 8 tuning, timing and rate-extension runs lack a record or failed"
    measured.run(again, _runner(again, ran, None, steps), tmp_path, write_table, log=logs.append)
    recs = sweep_records(tmp_path, SWEEP)
    ext = pr.extend(again, recs)
    assert ext.settled and ext.rounds == 2 and not ext.at_edge
    n = len(again.tune_jobs()) + len(again.timing_jobs()) + len(ext.jobs) + 2  # 2 eval seeds
    assert len(ran) == len(set(ran)) == n == 12  # every job once
    tuning = pd.read_csv(tmp_path / "ablation" / f"{SWEEP}-tuning.csv")
    picked = tuning[tuning["selected"]]
    assert set(picked["trial"]) == {"wu1ep-lr0.25x"} and not picked["rate_at_edge"].any()
    rounds = dict(zip(tuning["trial"], tuning["extension"], strict=False))
    assert rounds["wu1ep-lr0.25x"] == 1 and rounds["wu1ep-lr0.125x"] == 2
    assert rounds["wu1ep-lr0.5x"] == 0
    assert any(line.startswith("rate extension, round 2: 2 of 4") for line in logs)
    ev = [r for r in recs if r["protocol"]["role"] == "eval"]
    assert {r["protocol"]["trial"] for r in ev} == {"wu1ep-lr0.25x"}
    over = again.overrides(pr.Job(pr.EVAL, "dense", "wu1ep-lr0.25x", 0))
    assert "optim.lr=0.1" in over and "optim.warmup_epochs=1.0" in over
    before = len(load_records(tmp_path))  # a rerun of --resume recomputes, redoes nothing
    measured.run(again, _runner(again, ran, None, steps), tmp_path, write_table, log=lambda s: None)
    assert len(load_records(tmp_path)) == before


def test_the_rate_extension_stops_at_its_bound_and_says_so(tmp_path: Path) -> None:
    """Steps that fall all the way down: MAX_ROUNDS rounds (0.25x to 0.03125x), then the
    selection, still at the smallest rate tried, is named in the log and the table."""
    plan = _plan(tmp_path, comms=("dense",), trials=3, eval_seeds=(0,), measured=())
    logs: list[str] = []
    ran: list[tuple] = []
    measured.run(plan, _runner(plan, ran, None, _lowest_at(quarter=False)), tmp_path, write_table,
           log=logs.append)  # fmt: skip
    recs = sweep_records(tmp_path, SWEEP)
    ext = pr.extend(plan, recs)
    assert ext.settled and ext.rounds == extension.MAX_ROUNDS == 4
    assert len(ext.jobs) == 4 * len(plan.tune_seeds) and ext.at_edge
    assert any(f"bound of {extension.MAX_ROUNDS} rounds" in s and "wu1ep-lr0.03125x" in s
               for s in logs)  # fmt: skip
    tuning = pd.read_csv(tmp_path / "ablation" / f"{SWEEP}-tuning.csv")
    picked = tuning[tuning["selected"]]
    assert set(picked["trial"]) == {"wu1ep-lr0.03125x"} and picked["rate_at_edge"].all()
    assert any("bound of 4 rounds" in line for line in pr.status(plan, recs))
