"""The tuning protocol's trials on fixture records: the same number of knob settings for
every method, each at every rate; trials that send and learn alike refused; labelled
densities reached on the step axis; per-cluster selection from steps x step time; and the
unpaired interval against a direct computation."""

import dataclasses
import json
import math
import re

import numpy as np
import pytest
from scipy import stats

from bench import methods
from bench.methods import Knobs
from bench.methods.kinds import RankKnobs
from bench.registry import ConfigError
from bench.results.records import append_record, load_records, write_curve
from bench.sweeps import intervals as iv
from bench.sweeps import protocol as pr
from bench.sweeps import trials as T


def _plan(**kw) -> pr.Plan:
    kw.setdefault("recipe_lr", 0.4)
    return pr.Plan(sweep_id="s", **kw)


def _fixed(monkeypatch, spaces):
    """Each method's trials are ``spaces``' (label, overrides) (one space: every method's),
    without a rate axis."""

    def trials(self, comm):
        space = spaces[comm] if isinstance(spaces, dict) else spaces
        return [T.Trial(t, tuple(v.items())) for t, v in space]

    monkeypatch.setattr(pr.Plan, "_trials", trials)


TRAINING = [s.name for s in methods.specs() if s.kind != "reference"]


def test_every_method_gets_the_same_knob_settings_each_at_every_rate():
    plan = _plan()
    for comm in plan.comms:
        sp = plan._trials(comm)
        assert len(sp) == T.TRIALS and len({t.label for t in sp}) == T.TRIALS
        cells = {t.cell for t in sp}
        assert len(cells) == T.KNOB_CELLS and all(t.label.startswith(t.cell) for t in sp)
        for cell in cells:  # every knob setting at >= 3 rates: 0.5x, 1x, 2x of the centre
            lrs = sorted(t.values()["optim.lr"] for t in sp if t.cell == cell)
            assert len(lrs) >= 3 and lrs[0] * 4 == pytest.approx(lrs[-1])
    lrs = {v["optim.lr"] for c in plan.comms if c != "demo" for _, v in plan._space(c)}
    assert lrs == {0.2, 0.4, 0.8}  # the rate axis reaches every method
    demo = {v["optim.lr"] for _, v in plan._space("demo")}  # a sign update: its own centre
    lr = methods.get("demo").lr_centre["classification"]
    assert lr != 0.4 and demo == {0.5 * lr, lr, 2 * lr}
    plan.check()  # distinct, and every labelled density reached within dense's steps
    # a rate beyond the grid (the extension's) is the same knob setting at that rate
    grid = plan._trials("diloco")
    far = T.beyond(grid, f"{grid[0].cell}-lr0.25x")
    assert far.values() == {**grid[0].values(), "optim.lr": 0.1} and far.rate == 0.25
    assert T.beyond(grid, "H99-lr1x") is None and T.beyond(grid, grid[4].label) == grid[4]
    with pytest.raises(ConfigError, match="trials 4: whole knob settings of 3 rates"):
        _plan(trials=4).check()


def test_a_methods_space_is_its_specs_and_gets_the_same_trials(monkeypatch):
    def with_space(knobs):
        spec = dataclasses.replace(methods.get("randomk"), spaces=lambda w, ref: knobs)
        monkeypatch.setitem(methods.METHODS._items, "randomk", spec)

    with_space({"x": (("a", {"comm.density": 0.1}),)})
    with pytest.raises(ConfigError, match="1 knob setting.s. cannot give the protocol's 2"):
        pr.space("randomk", 0.4)
    with_space({"x": tuple((f"d{d}", {"comm.density": d}) for d in (0.1, 0.2, 0.3))})
    sp = pr.space("randomk", 0.4)
    assert len(sp) == T.TRIALS and [t.rate for t in sp[:3]] == list(T.LR_FACTORS)
    assert sp == pr.space("randomk", 0.4)  # the same knob settings every time


def test_every_default_method_learns_apart_in_each_trial_on_both_workloads():
    for experiment, lr in (("dawnbench_digits", 0.4), ("transformer_protocol", 2e-3)):
        plan = _plan(experiment=experiment, recipe_lr=lr, comms=TRAINING)
        plan.check()
        for c in TRAINING:  # and no axis of them changes nothing in the learning
            assert len({T.effect(t.values(), c, 620) for t in plan._trials(c)}) == T.TRIALS
    # dense, fp16, bf16: the optimizer's warm-up, not DDP's bucket size (it learns alike)
    assert {t.cell for t in plan._trials("dense")} == {"wu0.5ep", "wu0.25ep"}


def test_a_bucket_only_axis_is_refused_before_any_run(monkeypatch):
    """DDP's bucket size groups the same elementwise all-reduce: trials apart in it alone
    send alike and learn alike, so the plan is refused in one line; for top-k, whose
    selection is per bucket, it learns apart."""
    buckets = {"bucket": tuple((f"b{b:g}", {"comm.bucket_cap_mb": b}) for b in (6.25, 25.0))}
    for name in ("dense", "hitopk"):
        spec = dataclasses.replace(methods.get(name), spaces=lambda w, ref: buckets)
        monkeypatch.setitem(methods.METHODS._items, name, spec)
    with pytest.raises(ConfigError) as e:
        _plan(comms=("dense",)).check()
    msg = str(e.value)
    assert "dense: trials 'b6.25-lr1x' and 'b25-lr1x' send alike within the budget" in msg
    assert "learn alike" in msg and "\n" not in msg
    _plan(comms=("hitopk",)).check()


def test_two_trials_that_run_alike_within_the_budget_are_refused():
    # a per-epoch warm-up that never reaches its final density inside the budget: the v1
    # translation case (0.1 then 0.05 in 2 epochs, whatever the final density)
    a = T.Trial(
        "d0.05-warmup",
        (
            ("comm.density", 0.05),
            ("comm.density_schedule", [0.1, 0.05]),
            ("comm.schedule_steps", 310),
        ),
    )
    b = T.Trial(
        "d0.01-warmup",
        (
            ("comm.density", 0.01),
            ("comm.density_schedule", [0.1, 0.05, 0.01]),
            ("comm.schedule_steps", 310),
        ),
    )
    with pytest.raises(ConfigError, match="send alike within the budget of 620 steps and learn"):
        T.check_distinct("hitopk", [a, b], 620)
    T.check_distinct("hitopk", [a, b], 700)  # past 620 steps b reaches 0.01
    p4 = T.Trial("rank4-start310", (("comm.powersgd_rank", 4), ("comm.warmup_steps", 310)))
    p4b = T.Trial("rank4-start400", (("comm.powersgd_rank", 4), ("comm.warmup_steps", 400)))
    with pytest.raises(ConfigError, match="powersgd"):
        T.check_distinct("powersgd", [p4, p4b], 300)


def test_labels_say_what_ran():
    phases = [(6, "dense", Knobs()), (40, "powersgd", RankKnobs(rank=8))]
    assert T.ran(phases) == "dense x 6, powersgd rank 8 x 40"


def _tuning(tmp, run_id, comm, trial, seed, phases, steps_to_target):
    rows = [
        {
            "epoch": 1,
            "data/steps": 100,
            "clock/train_s": 1.0,
            "acc/top1": 0.99,
            "comm/phases": phases,
        }
    ]
    write_curve(tmp, run_id, rows)
    append_record(
        tmp,
        {
            "run_id": run_id,
            "status": "ok",
            "comm": comm,
            "target_metric": "top1",
            "target_value": 0.98,
            "time_to_target_s": 1.0,
            "train_time_s": 1.0,
            "steps_to_target": steps_to_target,
            "queue": {"id": "q"},
            "config": {"train": {"seed": seed}},
            "results": {},
            "sweep_id": "s",
            "protocol": {"name": pr.NAME, "role": "tune", "trial": trial, "selected": False},
        },
    )


MEASURED = "measured-1.34"  # the measured cluster of the plans here (measured=("paper",))


def _timing(tmp, run_id, method, seed, step_s, **knobs):
    """A timing run of ``method`` at ``knobs`` (its config's full keys: ``comm.density``)
    on the measured cluster; its key is read from its config, its label written as the
    plan writes it."""
    spec = methods.get(method)
    config = {"train": {"seed": seed}, "results": {"protocol_cluster": MEASURED}}
    for o in spec.overrides():  # the groups that select it: comm=, optim=, sync=
        group, name = o.split("=")
        config[group] = {"name": name}
    for key, v in knobs.items():
        group, leaf = key.split(".")
        config.setdefault(group, {})[leaf] = v
    label = spec.timing_label(spec.timing_knobs(spec.knobs_of(config)))
    append_record(
        tmp,
        {
            "run_id": run_id,
            "status": "target_missed",
            "comm": spec.comm,
            "step_time_s": step_s,
            "config": config,
            "protocol": {"name": pr.NAME, "role": "time", "trial": label, "selected": False},
        },
    )


def test_selection_is_per_cluster_from_steps_and_step_times(tmp_path, monkeypatch):
    """hitopk at density 0.1 needs fewer steps, at 0.001 sends far less: the model's paper
    cluster at a high ratio picks the sparse one, the emulated timing pass (where 0.001 is
    not faster per step) picks the one with fewer steps."""
    _fixed(monkeypatch, (("a", {"comm.density": 0.1}), ("b", {"comm.density": 0.001})))
    plan = _plan(comms=("hitopk",), results_dir=str(tmp_path), measured=("paper",))
    for seed in (1000, 1001):
        _tuning(tmp_path, f"a{seed}", "hitopk", "a", seed, "hitopk/0.1/0/100/1", 40)
        _tuning(tmp_path, f"b{seed}", "hitopk", "b", seed, "hitopk/0.001/0/100/1", 60)
    _timing(tmp_path, "t1", "hitopk", 2000, 0.010, **{"comm.density": 0.1})
    _timing(tmp_path, "t2", "hitopk", 2000, 0.010, **{"comm.density": 0.001})
    recs = load_records(tmp_path)
    table = pr.selection_table(plan, recs)
    chosen = pr.select_per_cluster(table)
    assert chosen[MEASURED] == {"hitopk": "a"}  # 40 x 10 ms < 60 x 10 ms
    assert chosen["paper-b64"] == {"hitopk": "b"}  # the model: 0.001 is far cheaper there
    row = table[(table["cluster"] == MEASURED) & (table["trial"] == "a")].iloc[0]
    assert row["median_time_s"] == pytest.approx(0.4) and row["median_steps"] == 40
    assert row["ran"] == "hitopk 0.1 x 40"
    # each selected configuration runs on every evaluation seed, on the measured cluster
    # when it was selected there, else on the plan's
    jobs = plan.eval_jobs(chosen)
    assert {(j.trial, j.where) for j in jobs} == {("a", MEASURED), ("b", "")}
    assert len(jobs) == 2 * len(plan.eval_seeds) and len(plan.eval_seeds) >= 10


def test_the_unpaired_interval_is_welch_on_log_time():
    rng = np.random.default_rng(3)
    a, b = rng.lognormal(1.0, 0.2, 10), rng.lognormal(0.8, 0.3, 12)
    r, lo, hi = iv.log_t_interval(a, b)
    res = stats.ttest_ind(np.log(a), np.log(b), equal_var=False)
    ci = res.confidence_interval(0.95)
    assert r == pytest.approx(math.exp(np.log(a).mean() - np.log(b).mean()))
    assert (lo, hi) == pytest.approx((math.exp(ci.low), math.exp(ci.high)))
    assert iv.verdict(*iv.log_t_interval([1.0, 1.2, 0.9], [1.1, 0.95, 1.05])[1:], 3).startswith(
        "no difference measurable"
    )
    x = {s: float(v) for s, v in enumerate(a)}
    y = {s: float(v) for s, v in enumerate(-np.log(a) + 5)}
    assert iv.seed_correlation(x, {s: math.exp(v) for s, v in y.items()}) == pytest.approx(-1.0)
    assert math.isnan(iv.seed_correlation({0: 1.0}, {0: 2.0}))


def test_the_new_methods_are_names_plus_the_overrides_that_select_them(monkeypatch):
    monkeypatch.setattr(pr.Plan, "_link", lambda self, job: [])  # a shaped link
    plan = _plan()
    assert {"demo", "diloco", "streaming_diloco"} <= set(plan.comms)
    assert "localsgd" not in plan.comms  # in the plan with --comm (DiLoCo's special case)
    assert methods.get("localsgd").overrides() == ["sync=localsgd"]
    sizes = {c: len(plan._space(c)) for c in plan.comms}
    assert set(sizes.values()) == {T.TRIALS}, sizes  # every method alike
    demo = plan.overrides(pr.Job(pr.TUNE, "demo", plan._space("demo")[0][0], 1000))
    assert "optim=demo" in demo and "comm=nocomm" in demo
    assert not any(o.startswith("comm=") and o != "comm=nocomm" for o in demo)
    trial = plan._space("diloco")[0][0]
    dil = plan.overrides(pr.Job(pr.TUNE, "diloco", trial, 1000))
    assert "sync=diloco" in dil and not any(o.startswith("comm=") for o in dil)
    assert any(o.startswith("sync.sync_every=") for o in dil)
    assert "comm=hitopk" in plan.overrides(
        pr.Job(pr.TUNE, "hitopk", plan._space("hitopk")[0][0], 0)
    )
    with pytest.raises(ConfigError, match="unknown method 'nosuch'"):
        methods.get("nosuch")
    # every method is priced: each has timing runs on the check cluster, of whole periods
    assert set(plan.comms) <= {j.comm for j in plan.timing_jobs()}
    keys = plan.timing_keys()
    assert "time dense b25" in keys and "time powersgd rank4 b25" in keys
    assert "time demo chunk64 topk32 b25" in keys and "time hitopk d0.001 b25" in keys
    assert "time streaming_diloco H10 frag2 delay1 b25" in keys
    for j in plan.timing_jobs():
        method, knobs = keys[j.trial]
        spec = methods.get(method)
        assert method == j.comm and spec.timing_label(knobs) == j.trial
        epochs, per = pr.timing_steps((method, knobs), "classification")
        assert per <= pr.STEPS_PER_EPOCH["classification"]
        assert (epochs * per) % spec.period(knobs) == 0 and epochs * per >= spec.period(knobs)
        over = plan.overrides(j)
        assert f"train.epochs={epochs}" in over and "train.eval_stride=1" in over
        # what the run records reads back as the same key (its config, not its label)
        config: dict = {}
        for o in over:
            k, v = o.split("=", 1)
            if "." in k and k.split(".")[0] in ("comm", "optim", "sync"):
                group, leaf = k.split(".")
                config.setdefault(group, {})[leaf] = json.loads(v)
        assert spec.timing_knobs(spec.knobs_of(config)) == knobs


def test_a_record_is_grouped_under_the_method_that_selected_it():
    def rec(comm, optim="sgd", sync="ddp"):
        return {"comm": comm, "config": {"optim": {"name": optim}, "sync": {"name": sync}}}

    assert methods.method_of(rec("nocomm", optim="demo")) == "demo"
    assert methods.method_of(rec("dense", sync="diloco")) == "diloco"
    assert methods.method_of(rec("dense", sync="streaming_diloco")) == "streaming_diloco"
    assert methods.method_of(rec("hitopk")) == "hitopk"
    assert methods.method_of({"comm": "fp16"}) == "fp16"  # an older record without the groups
    r = {**rec("nocomm", optim="demo"), "protocol": {"role": "tune", "trial": "c32k4-lr1x"}}
    assert pr.job_of(r).comm == "demo"


def test_placement_trials_are_distinct_and_fit_the_workloads_optimizer():
    image, translation = _plan(), _plan(experiment="transformer_protocol", recipe_lr=5e-4)
    for plan, other, fits, optim in ((image, "update", "grad+dgc", "sgd"),
                                     (translation, "grad+dgc", "update", "adamw")):  # fmt: skip
        for c in ("topk", "hitopk"):
            seen = {v["comm.placement"] for _, v in plan._space(c)}
            assert seen == {"grad", fits}, (c, seen)
        T.check_placements("hitopk", plan._space("hitopk"), optim)
        bad = (("x", {"comm.placement": other, "comm.density": 0.01, "comm.warmup_steps": 40}),)
        with pytest.raises(ConfigError, match=re.escape(f"placement {other} does not fit")):
            T.check_placements("hitopk", bad, optim)
    cold = (("x", {"comm.placement": "update", "comm.density": 0.01}),)
    with pytest.raises(ConfigError, match="needs comm.warmup_steps > 0"):
        T.check_placements("hitopk", cold, "adamw")
    labels = [t for t, _ in translation._space("mstopk")]
    assert len(set(labels)) == len(labels) == T.TRIALS
    translation.check()  # distinct trials, placements fit AdamW


def test_demo_and_diloco_are_priced_on_the_paper_cluster(tmp_path, monkeypatch):
    """DiLoCo's outer all-reduce every H steps and DeMo's all-gather every step are priced
    by the model at each ratio: a longer period is cheaper per step, more so at a higher
    ratio, and the selection there trades it against the steps it costs."""
    from bench.methods import get
    from bench.sweeps import ratios

    def step(m, ratio, **knobs):
        return ratios.step_time_s(m, get(m).knobs_of(knobs), ratio)

    h10 = step("diloco", 5.37, **{"sync.sync_every": 10})
    h40 = step("diloco", 5.37, **{"sync.sync_every": 40})
    dense = step("dense", 5.37)
    assert h40 < h10 < dense
    low = step("diloco", 1.34, **{"sync.sync_every": 10})
    assert h10 / dense < low / step("dense", 1.34)  # saves more at 5.37
    small = step("demo", 5.37, **{"optim.demo_chunk": 32, "optim.demo_topk": 4})
    assert 0 < small < step("demo", 5.37, **{"optim.demo_chunk": 64, "optim.demo_topk": 32})
    space = (
        ("h10", {"sync.sync_every": 10, "sync.outer_lr": 0.7}),
        ("h40", {"sync.sync_every": 40, "sync.outer_lr": 0.7}),
    )
    _fixed(monkeypatch, space)
    plan = _plan(comms=("diloco",), results_dir=str(tmp_path), measured=("paper",))

    def tuned(run_id, trial, seed, h, steps):
        _tuning(tmp_path, run_id, "dense", trial, seed, f"dense/1/0/{steps}/1", steps)
        recs = (tmp_path / "runs.jsonl").read_text().splitlines()
        last = json.loads(recs[-1])
        last["config"] = {"train": {"seed": seed}, "sync": {"name": "diloco", "sync_every": h}}
        (tmp_path / "runs.jsonl").write_text("\n".join([*recs[:-1], json.dumps(last)]) + "\n")

    for seed in (1000, 1001):
        tuned(f"a{seed}", "h10", seed, 10, 60)
        tuned(f"b{seed}", "h40", seed, 40, 66)
    _timing(tmp_path, "t1", "diloco", 2000, 0.010, **{"sync.sync_every": 10})
    _timing(tmp_path, "t2", "diloco", 2000, 0.010, **{"sync.sync_every": 40})
    table = pr.selection_table(plan, load_records(tmp_path))
    chosen = pr.select_per_cluster(table)
    assert chosen[MEASURED] == {"diloco": "h10"}  # as fast per step there: fewer steps
    assert chosen["paper-b64"] == {"diloco": "h40"}  # 10 % more steps, far fewer syncs
    row = table[(table["cluster"] == "paper-b64") & (table["trial"] == "h40")].iloc[0]
    assert row["median_time_s"] == pytest.approx(
        66 * step("diloco", row["ratio"], **{"sync.sync_every": 40}))  # fmt: skip


def test_the_table_is_per_cluster_with_welch_intervals_on_the_evaluation_seeds(
    tmp_path, monkeypatch
):
    """Each cluster's block holds the configuration selected for it, its evaluation runs'
    time there (the check cluster's clock, else steps x the model's step), and the speedup
    over dense as Welch's t on log times, computed here directly with scipy."""
    from bench.methods import get
    from bench.report import answer
    from bench.sweeps import protocol_table as pt
    from bench.sweeps import ratios

    spaces = {"dense": (("b25", {"comm.bucket_cap_mb": 25.0}),),
              "hitopk": (("d01", {"comm.density": 0.01}),)}  # fmt: skip
    _fixed(monkeypatch, spaces)
    plan = _plan(comms=("dense", "hitopk"), results_dir=str(tmp_path), measured=("paper",))
    for seed in (1000, 1001):
        _tuning(tmp_path, f"td{seed}", "dense", "b25", seed, "dense/1/0/100/1", 60)
        _tuning(tmp_path, f"th{seed}", "hitopk", "d01", seed, "hitopk/0.01/0/100/1", 66)
    _timing(tmp_path, "t1", "dense", 2000, 0.30)
    _timing(tmp_path, "t2", "hitopk", 2000, 0.20, **{"comm.density": 0.01})
    rng = np.random.default_rng(0)
    steps = {"dense": 60 + rng.integers(-4, 5, 10), "hitopk": 66 + rng.integers(-6, 7, 10)}
    clock = {c: {} for c in steps}
    for comm, trial, ph in (("dense", "b25", "dense/1/0"), ("hitopk", "d01", "hitopk/0.01/0")):
        for seed in range(10):
            n = int(steps[comm][seed])
            run_id = f"e{comm}{seed}"
            _tuning(tmp_path, run_id, comm, trial, seed, f"{ph}/100/1", n)
            recs = (tmp_path / "runs.jsonl").read_text().splitlines()
            last = json.loads(recs[-1])
            t = n * (0.30 if comm == "dense" else 0.20) * float(rng.uniform(0.95, 1.05))
            clock[comm][seed] = t
            last["time_to_target_s"] = t
            last["protocol"] = {**last["protocol"], "role": "eval", "selected": True}
            last["config"] = {"train": {"seed": seed}, "results": {"protocol_cluster": MEASURED}}
            (tmp_path / "runs.jsonl").write_text("\n".join([*recs[:-1], json.dumps(last)]) + "\n")
    df = pt.aggregate(plan, load_records(tmp_path))
    assert list(dict.fromkeys(df["for_cluster"])) == list(pr.clusters(plan))
    emu = df[(df["for_cluster"] == MEASURED) & (df["comm"] == "hitopk")].iloc[0]
    res = stats.ttest_ind(np.log(list(clock["dense"].values())),
                          np.log(list(clock["hitopk"].values())), equal_var=False)  # fmt: skip
    ci = res.confidence_interval(0.95)
    assert (emu["speedup_vs_dense_ci_low"], emu["speedup_vs_dense_ci_high"]) == pytest.approx(
        (math.exp(ci.low), math.exp(ci.high))
    )
    assert emu["measured_on"] == "clock" and emu["n_runs"] == 10
    b64 = df[(df["for_cluster"] == "paper-b64") & (df["comm"] == "hitopk")].iloc[0]
    model = {
        c: [
            int(steps[c][s])
            * ratios.step_time_s(c, get(c).knobs_of({"comm.density": d}), b64["ratio"])
            for s in range(10)
        ]  # fmt: skip
        for c, d in (("dense", 1.0), ("hitopk", 0.01))
    }
    r, lo, hi = iv.log_t_interval(model["dense"], model["hitopk"])
    assert (b64["speedup_vs_dense"], b64["speedup_vs_dense_ci_low"]) == pytest.approx((r, lo))
    assert b64["measured_on"] == "model" and b64["speedup_vs_dense"] > 1.0
    # the report's long form: one table of clusters
    table = answer.answer_table_v2(df)
    assert "measured at 1.34 (emulated 2 x 2)" in table[0]
    assert table[-1].startswith("| **hitopk** (paper) |")
