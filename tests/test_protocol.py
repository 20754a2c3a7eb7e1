"""The tuning protocol on fixture records: equal search spaces, the selection rule with a
censored run, evaluation seeds disjoint from tuning seeds, intervals against a direct
computation, the run order, and a sweep interrupted half way that resumes."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from bench.comm import HOOKS
from bench.registry import ConfigError
from bench.results.records import append_record, load_records
from bench.sweeps import intervals as iv
from bench.sweeps import protocol as pr
from bench.sweeps import protocol_table as pt
from bench.sweeps.common import sweep_records, write_table

SWEEP = "ablation-protocol-test"


def _rec(
    run_id: str,
    comm: str,
    trial: str,
    seed: int,
    tta: float | None,
    *,
    role: str = "tune",
    train_s: float = 20.0,
    status: str | None = None,
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "status": status or ("ok" if tta is not None else "target_missed"),
        "experiment": "dawnbench_digits",
        "comm": comm,
        "target_metric": "top1",
        "target_value": 0.98,
        "time_to_target_s": tta,
        "train_time_s": train_s if tta is None else tta,
        "steps_to_target": None if tta is None else 25,
        "step_time_s": 0.4,
        "protocol": {"name": pr.V1, "role": role, "trial": trial, "selected": role == "eval"},
        "config": {
            "results": {"sweep_id": SWEEP},
            "train": {"seed": seed},
            "cluster": {"name": "local"},
        },
    }


def _plan(tmp_path: Path, **kw: Any) -> pr.Plan:
    kw.setdefault("name", pr.V1)  # the rules of the committed sweeps (v2: test_protocol_v2)
    return pr.Plan(sweep_id=SWEEP, results_dir=str(tmp_path), cluster="local", **kw)


def test_every_tunable_method_declares_the_same_number_of_trials() -> None:
    sizes = {c: len(pr.space(c)) for c in HOOKS}
    assert {sizes[c] for c in ("powersgd", "topk", "mstopk", "hitopk", "randomk")} == {4}
    assert sizes["dense"] == sizes["fp16"] == sizes["bf16"] == 1
    for c in HOOKS:  # labels unique within a space
        labels = [t for t, _ in pr.space(c)]
        assert len(labels) == len(set(labels))
    assert dict(pr.space("powersgd"))["rank8-start1ep"] == {"powersgd_rank": 8, "warmup_epochs": 1}
    warm = dict(pr.space("hitopk"))["d0.001-warmup"]
    assert warm["density"] == 0.001 and warm["density_schedule"][-1] == 0.001
    with pytest.raises(KeyError):  # the registry refuses a second entry of a name
        HOOKS.register("hitopk")(HOOKS.get("hitopk"))


def test_the_rule_picks_the_lowest_median_with_a_miss_counted_at_the_budget(
    tmp_path: Path,
) -> None:
    plan = _plan(tmp_path, comms=("dense", "hitopk"))
    recs = [
        # d0.01: fastest when it reaches, but it missed on one seed: (10 + 30) / 2 = 20
        _rec("a1", "hitopk", "d0.01", 1000, 10.0),
        _rec("a2", "hitopk", "d0.01", 1001, None, train_s=30.0),
        # d0.01-warmup: 12, 13 -> 12.5, the rule's choice
        _rec("b1", "hitopk", "d0.01-warmup", 1000, 12.0),
        _rec("b2", "hitopk", "d0.01-warmup", 1001, 13.0),
        # d0.001: 12, 13 too: a tie, lost to the trial declared first
        _rec("c1", "hitopk", "d0.001", 1000, 13.0),
        _rec("c2", "hitopk", "d0.001", 1001, 12.0),
        _rec("d1", "hitopk", "d0.001-warmup", 1000, 14.0),
        _rec("d2", "hitopk", "d0.001-warmup", 1001, 15.0),
    ]
    df = pr.tuning_table(plan, recs)
    row = df.set_index(["comm", "trial"])
    assert row.loc[("hitopk", "d0.01"), "budget_s"] == 30.0
    assert row.loc[("hitopk", "d0.01"), "median_time_s"] == pytest.approx(20.0)  # miss counted
    assert row.loc[("hitopk", "d0.01"), "n_reached"] == 1
    assert row.loc[("hitopk", "d0.01"), "n_runs"] == 2
    assert pr.select(df) == {"dense": "default", "hitopk": "d0.01-warmup"}
    assert df["selected"].sum() == 2 and bool(row.loc[("hitopk", "d0.01-warmup"), "selected"])
    assert not bool(row.loc[("dense", "default"), "tuned"])  # one trial: no tuning runs


def test_evaluation_seeds_are_disjoint_from_tuning_seeds(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    plan.check()
    tune = {j.seed for j in plan.tune_jobs()}
    chosen = {c: pr.space(c)[0][0] for c in plan.comms}
    ev = plan.eval_jobs(chosen)
    assert tune == set(pr.TUNE_SEEDS) and {j.seed for j in ev} == set(pr.EVAL_SEEDS)
    assert not tune & {j.seed for j in ev} and len(pr.EVAL_SEEDS) >= 5
    assert all(j.role == "eval" and j.trial == chosen[j.comm] for j in ev)
    with pytest.raises(ConfigError, match="overlap"):
        _plan(tmp_path, tune_seeds=(0, 7)).check()
    # a tuning run, however fast, never enters the evaluation table
    recs = [_rec("t1", "dense", "default", 1000, 1.0)] + [
        _rec(f"e{s}", "dense", "default", s, 10.0 + s, role="eval") for s in range(5)
    ]
    df = pt.aggregate(_plan(tmp_path, comms=("dense",)), recs)
    assert df.loc[0, "n_runs"] == 5 and df.loc[0, "time_to_target_mean_s"] == pytest.approx(12.0)
    assert df.loc[0, "seeds"] == "0 1 2 3 4"


def _direct_percentile(stat, samples: list[np.ndarray], paired: bool, n: int = 20000):
    """A percentile bootstrap written out: resample seeds with replacement, take the
    statistic, read the 2.5 and 97.5 percentiles."""
    rng = np.random.default_rng(123)
    size = len(samples[0])
    vals = []
    for _ in range(n):
        if paired:
            idx = rng.integers(0, size, size)
            vals.append(stat(*(s[idx] for s in samples)))
        else:
            vals.append(stat(*(s[rng.integers(0, len(s), len(s))] for s in samples)))
    return np.percentile(vals, [2.5, 97.5])


def test_intervals_match_a_direct_computation() -> None:
    a = np.array([20.0, 24.0, 21.0, 26.0, 23.0])  # dense, seeds 0-4
    b = np.array([10.0, 13.0, 10.5, 12.0, 14.0])  # a method, the same seeds
    m, lo, hi = iv.mean_interval(list(b))
    dlo, dhi = _direct_percentile(np.mean, [b], paired=True)
    assert m == pytest.approx(b.mean()) and lo == pytest.approx(dlo, abs=0.1)
    assert hi == pytest.approx(dhi, abs=0.1)
    for paired in (True, False):
        r, lo, hi = iv.ratio_interval(list(a), list(b), paired=paired)
        dlo, dhi = _direct_percentile(lambda x, y: x.mean() / y.mean(), [a, b], paired)
        assert r == pytest.approx(a.mean() / b.mean())
        assert lo == pytest.approx(dlo, abs=0.02) and hi == pytest.approx(dhi, abs=0.02)
    assert iv.verdict(lo, hi, 5) == "faster"
    assert iv.verdict(0.9, 1.1, 5) == "no difference measurable at n = 5"
    assert iv.verdict(0.7, 0.9, 5) == "slower"
    assert iv.verdict(math.nan, math.nan, 1) == "no difference measurable at n = 1"
    assert math.isnan(iv.mean_interval([3.0])[1])  # one seed: no interval


def test_the_table_counts_a_censored_run_and_compares_with_dense_and_the_best_peer(
    tmp_path: Path,
) -> None:
    plan = _plan(tmp_path, comms=("dense", "fp16", "hitopk"))
    recs = []
    for s in range(5):
        recs.append(_rec(f"d{s}", "dense", "default", s, 20.0 + s, role="eval"))
        recs.append(_rec(f"f{s}", "fp16", "default", s, 15.0 + s, role="eval"))
        tta = None if s == 4 else 10.0 + s  # seed 4 missed: enters at the budget
        recs.append(_rec(f"h{s}", "hitopk", "d0.01-warmup", s, tta, role="eval", train_s=30.0))
    df = pt.aggregate(plan, recs).set_index("comm")
    h = df.loc["hitopk"]
    assert (h.n_runs, h.n_reached) == (5, 4) and h.budget_s == 30.0
    times = np.array([10.0, 11.0, 12.0, 13.0, 30.0])
    assert h.time_to_target_mean_s == pytest.approx(times.mean())
    assert h.speedup_vs_dense == pytest.approx(22.0 / times.mean())
    assert h.best_peer == "fp16" and h.speedup_vs_peer == pytest.approx(17.0 / times.mean())
    # the censored seed makes the hitopk interval wide: no verdict against fp16
    assert h.speedup_vs_peer_ci_low < 1.0 < h.speedup_vs_peer_ci_high
    assert h.verdict_vs_peer == "no difference measurable at n = 5"
    assert df.loc["fp16", "verdict_vs_dense"] == "faster"
    assert df.loc["dense", "speedup_vs_dense"] == 1.0
    assert list(pt.aggregate(plan, recs).columns) == pt.COLUMNS
    assert "hitopk" in pt.format_table(pt.aggregate(plan, recs))


def test_runs_are_seed_major_and_shuffled_by_the_recorded_seed(tmp_path: Path) -> None:
    plan = _plan(tmp_path, order_seed=3)
    jobs = plan.tune_jobs()
    assert [j.seed for j in jobs] == sorted(j.seed for j in jobs)  # seed-major
    first = [(j.comm, j.trial) for j in jobs if j.seed == 1000]
    second = [(j.comm, j.trial) for j in jobs if j.seed == 1001]
    assert sorted(first) == sorted(second) and first != second  # each seed its own order
    assert jobs == _plan(tmp_path, order_seed=3).tune_jobs()  # the seed fixes the order
    assert jobs != _plan(tmp_path, order_seed=4).tune_jobs()
    ev = plan.eval_jobs({c: "default" for c in plan.comms})
    orders = {tuple(j.comm for j in ev if j.seed == s) for s in plan.eval_seeds}
    assert len(orders) > 1  # dense is not first in every seed block
    tags = plan.overrides(jobs[0])
    assert "results.protocol_role=tune" in tags and "results.protocol_selected=false" in tags
    assert f"train.eval_every_steps={pr.EVAL_EVERY_STEPS['classification']}" in tags


class _Stop(Exception):
    pass


def test_an_interrupted_sweep_resumes_without_redoing_recorded_runs(tmp_path: Path) -> None:
    plan = _plan(tmp_path, comms=("dense", "hitopk"), trials=2, eval_seeds=(0, 1, 2))
    plan.save()
    ran: list[str] = []

    def runner(jobs: list[list[str]], sweep_dir: Path, experiment: str, stop_after=None):
        for n, job in enumerate(jobs):
            if stop_after is not None and n == stop_after:
                raise _Stop  # the sweep dies here: the runs before it have their records
            kv = dict(o.split("=", 1) for o in job)
            rid = f"r{len(ran)}"
            keys = ("comm", "results.protocol_role", "results.protocol_trial", "train.seed")
            ran.append(" ".join(kv[k] for k in keys))
            seed = int(kv["train.seed"])
            tta = 5.0 + seed % 3 + (kv["results.protocol_trial"] == "d0.01-warmup")
            rec = _rec(rid, kv["comm"], kv["results.protocol_trial"], seed, tta,
                       role=kv["results.protocol_role"])  # fmt: skip
            append_record(plan.results_dir, rec)
        return [0] * len(jobs)

    with pytest.raises(_Stop):  # half of the tuning runs, then the interruption
        pr.run(plan, lambda j, d, e: runner(j, d, e, stop_after=2), tmp_path, write_table,
               log=lambda s: None)  # fmt: skip
    assert len(ran) == 2 and len(plan.tune_jobs()) == 4
    again = pr.Plan.load(tmp_path, SWEEP)
    assert again.tune_jobs() == plan.tune_jobs()  # the same order, from the saved seed
    pr.run(again, runner, tmp_path, write_table, log=lambda s: None)
    assert len(ran) == len(set(ran)) == 4 + 2 * 3  # every job once, none twice
    recs = sweep_records(tmp_path, SWEEP)
    assert not pr.pending(plan.tune_jobs(), recs)
    assert pd.read_csv(tmp_path / "ablation" / f"{SWEEP}-tuning.csv")["selected"].sum() == 2
    before = len(load_records(tmp_path))
    pr.run(again, runner, tmp_path, write_table, log=lambda s: None)  # nothing left to run
    assert len(load_records(tmp_path)) == before
    df = pt.aggregate(again, recs)
    assert sorted(df["comm"]) == ["dense", "hitopk"] and (df["n_runs"] == 3).all()
    assert (df.set_index("comm").loc["hitopk", "trial"]) == "d0.01"  # 5-7 s beat 6-8 s


def test_tuning_runs_never_enter_the_reports_comparison(tmp_path: Path) -> None:
    from bench.report.tables import config_stats, run_table

    recs = [_rec("t1", "dense", "default", 1000, 1.0)] + [
        _rec(f"e{s}", "dense", "default", s, 10.0 + s, role="eval") for s in range(2)
    ]
    (row,) = config_stats(run_table(recs, tmp_path)).itertuples()
    assert row.n_runs == 2 and row.tt_mean == pytest.approx(10.5) and "t1" not in row.run_ids
