"""The tuning protocol on fixture records: the selection rule, evaluation seeds disjoint
from tuning seeds, intervals against a direct computation, the run order, a sweep
interrupted half way that resumes, and a plan of retired rules refused."""

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


def _runner(plan: pr.Plan, ran: list[tuple], stop_after: int | None = None):
    """Each job recorded as a run would record it (a curve with its phases, a timing run's
    time per step); a trial's steps grow with its place in the space, so every cluster
    selects each method's first trial where steps x time per step decides."""

    def run(jobs: list[list[str]], sweep_dir: Path, experiment: str) -> list[int]:
        for n, job in enumerate(jobs):
            if stop_after is not None and n == stop_after:
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
                steps = 40 + 5 * [t for t, _ in plan._space(comm)].index(trial) + seed % 3
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
    plan = _plan(tmp_path, comms=("dense", "hitopk"), trials=2, eval_seeds=(0, 1, 2))
    plan.save()
    ran: list[tuple] = []
    with pytest.raises(_Stop):  # two of the tuning runs, then the interruption
        measured.run(
            plan, _runner(plan, ran, stop_after=2), tmp_path, write_table, log=lambda s: None
        )
    assert len(ran) == 2 and len(plan.tune_jobs()) == 8
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
    plan.path().write_text(json.dumps({**saved, "name": "equal-budget-v1"}))
    for flag in ("--aggregate", "--resume", "--status"):
        with pytest.raises(SystemExit) as e:
            main([flag, SWEEP, "--results-dir", str(tmp_path)])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1, err
        assert "protocol equal-budget-v1, whose rules are retired" in err


def test_tuning_runs_never_enter_the_reports_comparison(tmp_path: Path) -> None:
    from bench.report.tables import config_stats, run_table

    recs = [_rec("t1", "dense", "default", 1000, 1.0)] + [
        _rec(f"e{s}", "dense", "default", s, 10.0 + s, role="eval") for s in range(2)
    ]
    (row,) = config_stats(run_table(recs, tmp_path)).itertuples()
    assert row.n_runs == 2 and row.tt_mean == pytest.approx(10.5) and "t1" not in row.run_ids
