"""The steps carry-over stage: which configurations it runs, how a 2-node run becomes an
8-node one, and the table's ratios and the factor a projection takes where steps do not
carry over."""

import math

import pytest

from bench import methods
from bench.sweeps import carryover as co

BASE = methods.baseline()
OTHER = next(s.name for s in methods.specs() if s.default and s.name != BASE)
THIRD = next(s.name for s in methods.specs() if s.default and s.name not in (BASE, OTHER))


def _runs(comm, trial, base_steps, ratios, reached=True):
    out = []
    for seed, (s2, r) in enumerate(zip(base_steps, ratios, strict=True)):
        out.append(dict(comm=comm, trial=trial, seed=seed, nodes=2, steps=s2, reached=True))
        out.append(dict(comm=comm, trial=trial, seed=seed, nodes=8, steps=s2 * r, reached=reached))
    return out


def test_covered_image_takes_every_selection_translation_the_leaders():
    picked = {"a": {BASE: "t1", OTHER: "t2"}, "b": {BASE: "t1", THIRD: "t3"}}
    assert co.covered("classification", picked, {}) == sorted(
        [(BASE, "t1"), (OTHER, "t2"), (THIRD, "t3")]
    )
    assert co.covered("translation", picked, {"b": [THIRD]}) == [(BASE, "t1"), (THIRD, "t3")]


def test_scale_holds_the_per_worker_batch_and_the_step_budget():
    over = ["cluster=local", "cluster.nnodes=2", "cluster.nproc_per_node=2", "data.batch_size=128"]
    got = co.scale(over, "classification", batch=128, budget=132, per_epoch=11)
    assert "cluster.nnodes=8" in got and "cluster.nnodes=2" not in got
    assert "data.batch_size=512" in got and "data.batch_size=128" not in got
    assert "train.epochs=66" in got  # 2 steps an epoch at 8 x 2, 132 steps
    # the warm-up is in epochs: 1 epoch at 2 x 2 is 11 steps, so 5.5 epochs of 2 at 8 x 2
    assert "optim.warmup_epochs=5.5" in co.scale(over, "classification", 128, 132, 11, 1.0)
    own = co.scale([*over, "optim.warmup_epochs=0.5"], "classification", 128, 132, 11, 1.0)
    assert "optim.warmup_epochs=2.75" in own  # a trial's own warm-up, stretched alike
    tr = co.scale(["cluster.nnodes=2"], "translation", batch=0, budget=620, per_epoch=310,
                  warmup=0.5)  # fmt: skip
    assert tr == ["cluster.nnodes=8", f"train.epochs={math.ceil(620 / 77)}",
                  f"optim.warmup_epochs={0.5 * 310 / 77:.6g}"]  # fmt: skip


def test_table_ratio_against_dense_and_the_switch():
    runs = [
        *_runs(BASE, "d", [60, 62, 58], [0.5, 0.52, 0.48]),
        *_runs(OTHER, "o", [80, 84, 76], [0.51, 0.5, 0.49]),  # carries over like dense
        *_runs(THIRD, "t", [100, 90, 95], [0.8, 0.85, 0.75]),  # needs relatively more steps
    ]
    tab = co.table(runs).set_index("comm")
    assert tab.loc[BASE, "vs_dense"] == pytest.approx(1.0)
    assert tab.loc[OTHER, "ratio"] == pytest.approx(0.5, rel=0.05)
    assert tab.loc[OTHER, "ratio_ci_low"] < 0.5 < tab.loc[OTHER, "ratio_ci_high"]
    assert tab.loc[THIRD, "vs_dense"] == pytest.approx(1.6, rel=0.05)
    assert not tab.loc[OTHER, "use_8_node_steps"] and tab.loc[THIRD, "use_8_node_steps"]
    # only the configuration whose steps do not carry over is scaled, dense never
    factors = co.step_factors(tab.reset_index())
    assert set(factors) == {(THIRD, "t")}
    f, lo, hi = factors[(THIRD, "t")]
    assert f == pytest.approx(1.6, rel=0.05) and lo < f < hi


def test_unpaired_seeds_are_left_out_and_one_seed_has_no_interval():
    runs = _runs(BASE, "d", [60], [0.5]) + [
        dict(comm=BASE, trial="d", seed=7, nodes=8, steps=30, reached=True)
    ]
    row = co.table(runs).iloc[0]
    assert row["seeds"] == "0" and row["ratio"] == pytest.approx(0.5)
    assert math.isnan(row["ratio_ci_low"])
    assert co.step_factors(co.table(runs)) == {}


def test_the_stage_runs_each_covered_configuration_at_8_nodes_as_its_evaluation_run():
    from bench.sweeps import protocol as pr
    from bench.sweeps.common import compose

    plan = pr.Plan("carry-test", cluster="local", measured=(), results_dir="unused")
    trial = plan._space(BASE)[0][0]
    jobs = co.jobs(plan, {"c": {BASE: trial}}, {})
    assert [j.seed for j in jobs] == list(plan.eval_seeds)[: plan.carry_seeds]
    over = co.overrides(plan, jobs[0])
    cfg = compose(over)
    assert cfg.cluster.nnodes == 8 and cfg.cluster.nproc_per_node == 2
    assert cfg.data.batch_size == 4 * compose([f"experiment={plan.experiment}"]).data.batch_size
    assert cfg.results.protocol_role == co.CARRY and cfg.train.seed == jobs[0].seed
    ev = plan.overrides(pr.Job(pr.EVAL, BASE, trial, jobs[0].seed))
    lr = [o for o in ev if o.startswith("optim.lr=")]
    assert lr and lr == [o for o in over if o.startswith("optim.lr=")]  # the same trial
    assert cfg.optim.warmup_epochs == pytest.approx(
        compose(ev).optim.warmup_epochs * 11 / 2
    )  # the same warm-up steps: 11 steps an epoch at 2 x 2, 2 at 8 x 2
    assert pr.quick()["carry_seeds"] == 0  # a smoke test runs no 16-worker cluster


def test_the_leaders_it_covers_are_told_apart_as_the_answer_tells_them():
    """A projection's tie takes the band: a method told from the first on the seeds but
    not at one corner of the model's assumptions is tied first, and covered."""
    import pandas as pd

    from bench.sweeps import protocol_table as pt

    fast = {s: 10.0 + 0.1 * s for s in range(10)}
    slow = {s: 11.0 + 0.1 * s for s in range(10)}  # told apart on the seeds
    df = pd.DataFrame()
    df.attrs["times"] = {"measured": {BASE: fast, OTHER: slow}, "paper": {BASE: fast, OTHER: slow}}
    alike = [list(fast.values())]  # at the second corner the two are alike
    df.attrs["corners"] = {"paper": {BASE: alike * 2, OTHER: [list(slow.values()), *alike]}}
    lead = pt.leading(df)
    assert lead == {"measured": (BASE,), "paper": (BASE, OTHER)}
    picked = {"paper": {BASE: "t1", OTHER: "t2"}}
    assert co.covered("translation", picked, lead) == sorted([(BASE, "t1"), (OTHER, "t2")])
