"""Time to target across ratios (bench.sweeps.ratios) on fixture records: steps from the
curves, each interval at the density it ran, missed runs at their budget, the bootstrap
against a direct computation, and where a method stops winning."""

import numpy as np
import pandas as pd
import pytest

from bench.launch import profile
from bench.methods import get
from bench.results.records import append_record, write_curve
from bench.sweeps import ratios as R

STEPS = 10  # steps per epoch in every fixture curve


def _record(tmp, run_id, comm, seed, epochs_to_target, epochs_run, **extra):
    rows = [
        {
            "epoch": e,
            "data/steps": STEPS,
            "clock/train_s": e * 1.0,
            "acc/top1": 0.99 if e == epochs_to_target else 0.5,
        }
        for e in range(1, epochs_run + 1)
    ]
    write_curve(tmp, run_id, rows)
    reached = epochs_to_target is not None and epochs_to_target <= epochs_run
    rec = {
        "run_id": run_id,
        "status": "ok" if reached else "target_missed",
        "comm": comm,
        "comm_density": extra.pop("density", 1.0),
        "comm_warmup_epochs": extra.pop("warmup", 0),
        "comm_density_schedule": extra.pop("schedule", []),
        "target_metric": "top1",
        "target_value": 0.98,
        "time_to_target_s": float(epochs_to_target) if reached else None,
        "train_time_s": float(epochs_run),
        "config": {"train": {"seed": seed}, "comm": extra.pop("comm_cfg", {})},
        **extra,
    }
    append_record(tmp, rec)


def test_steps_are_charged_at_the_density_each_epoch_ran(tmp_path):
    _record(tmp_path, "h0", "hitopk", 0, 3, 3, density=0.01, warmup=1, schedule=[0.1, 0.01])
    _record(tmp_path, "p0", "powersgd", 0, 2, 2, comm_cfg={"powersgd_rank": 8})
    _record(tmp_path, "d0", "dense", 0, 2, 2, schedule=[0.1, 0.01])  # schedule ignored
    runs, skipped = R.load_runs(tmp_path)
    assert not skipped
    by = {r.run_id: r for r in runs}
    h = by["h0"]
    assert [(p.method, p.density) for p in h.phases] == [
        ("dense", 1.0),  # the dense warm-up epoch
        ("hitopk", 0.1),
        ("hitopk", 0.01),
    ]
    assert h.steps == 3 * STEPS and h.reached
    # PowerSGD: a plain allreduce before start_powerSGD_iter (the hook's max(2, 0) = 2)
    p = by["p0"]
    assert (p.phases[0].method, p.phases[0].steps) == ("dense", 2)
    assert all(ph.rank == 8 for ph in p.phases[1:]) and p.steps == 2 * STEPS
    assert {ph.method for ph in by["d0"].phases} == {"dense"}
    # the projected time is the steps x the model's time per step, phase by phase
    t = sum(ph.steps * R.step_time_s(ph.method, ph.knobs, 1.0) for ph in p.phases)
    assert R.run_time_s(p, 1.0) == pytest.approx(t)


def test_a_missed_run_counts_its_whole_budget_and_tuning_runs_are_left_out(tmp_path):
    _record(tmp_path, "m", "fp16", 0, None, 6)
    _record(tmp_path, "t", "fp16", 1, 2, 2, protocol={"role": "tune", "trial": "x"})
    _record(tmp_path, "e", "fp16", 2, 2, 2, protocol={"role": "eval", "trial": "b25"})
    runs, _ = R.load_runs(tmp_path)
    by = {r.run_id: r for r in runs}
    assert "t" not in by  # its seed chose the configuration
    assert not by["m"].reached and by["m"].steps == 6 * STEPS
    assert by["e"].group == "fp16 b25"


def _fixture(tmp_path):
    # dense reaches the target in 4-5 epochs, hitopk in 5-6 and once misses (8 run)
    for s, e in enumerate((4, 5, 4, 5, 4)):
        _record(tmp_path, f"d{s}", "dense", s, e, e)
    for s, e in enumerate((5, 6, 5, None, 6)):
        _record(tmp_path, f"h{s}", "hitopk", s, e, e or 8, density=0.001)
    for s, e in enumerate((4, 4, 5, 5, 4)):
        _record(tmp_path, f"f{s}", "fp16", s, e, e)
    return R.load_runs(tmp_path)[0]


def test_the_interval_is_the_bootstrap_a_direct_computation_gives(tmp_path):
    runs = _fixture(tmp_path)
    df = R.compose(runs, [1.0], n_boot=400, seed=3)
    row = df[(df.group == "hitopk") & (df.vs_role == "dense")].iloc[0]
    assert row.n_runs == 5 and row.n_reached == 4
    # direct: the same resampling, written out
    rng = np.random.default_rng(3)
    groups = {}
    for r in runs:
        groups.setdefault(r.group, []).append(r)
    idx = {g: rng.integers(0, len(rs), size=(400, len(rs))) for g, rs in groups.items()}
    t = {g: np.array([R.run_time_s(r, 1.0) for r in rs]) for g, rs in groups.items()}
    s = t["dense"][idx["dense"]].mean(axis=1) / t["hitopk"][idx["hitopk"]].mean(axis=1)
    assert row.speedup == pytest.approx(t["dense"].mean() / t["hitopk"].mean())
    assert row.ci_low == pytest.approx(np.percentile(s, 2.5))
    assert row.ci_high == pytest.approx(np.percentile(s, 97.5))
    assert row.band_low <= row.ci_low <= row.speedup <= row.ci_high <= row.band_high
    assert row.win == (row.ci_low > 1)
    # the best peer is the faster of the peers present: fp16 here
    assert (df[df.group == "hitopk"].vs_role == "best peer").any()
    assert set(df[df.vs_role == "best peer"].vs) <= {"fp16", "hitopk"}


def test_a_method_loses_where_compute_dominates_and_wins_where_the_link_does(tmp_path):
    runs = _fixture(tmp_path)
    df = R.compose(runs, [0.1, 0.3, 1.0, 3.0, 10.0], n_boot=200)
    s = df[(df.group == "hitopk") & (df.vs_role == "dense")].sort_values("ratio")
    # more steps than dense: below 1 at the smallest ratio, above it at the largest
    assert s.speedup.iloc[0] < 1 < s.speedup.iloc[-1]
    assert s.speedup.is_monotonic_increasing


def test_the_named_settings_sit_on_the_axis():
    pts = R.named_ratios()
    assert pts["paper"] == pytest.approx(profile.derive("paper")["ratio"])
    assert pts["paper-b64"] == pytest.approx(4 * pts["paper"])
    assert pts["paper-fp16"] == pytest.approx(pts["paper"])  # the same cluster
    with pytest.raises(ValueError):
        R.compute_for_ratio(0.0)


def test_runs_of_one_seed_are_one_sample(tmp_path):
    # four replicates of seed 0 and one run of seed 1: two samples, not five
    for i in range(4):
        _record(tmp_path, f"d0{i}", "dense", 0, 4, 4)
    _record(tmp_path, "d1", "dense", 1, 6, 6)
    for s in (0, 1):
        _record(tmp_path, f"h{s}", "hitopk", s, 5, 5, density=0.001)
    runs, _ = R.load_runs(tmp_path)
    row = R.compose(runs, [1.0], n_boot=100).query("group == 'hitopk' and vs_role == 'dense'")
    assert int(row.n_runs.iloc[0]) == 2 and int(row.n_seeds.iloc[0]) == 2
    dense = [r for r in runs if r.group == "dense"]
    assert len(dense) == 5 and len(R._by_seed(dense)) == 2
    # the point estimate is the mean over seeds: (4 + 6) / 2 epochs of dense
    t = np.mean([R.run_time_s(dense[0], 1.0), R.run_time_s(dense[-1], 1.0)])
    h = R.run_time_s([r for r in runs if r.group == "hitopk"][0], 1.0)
    assert float(row.speedup.iloc[0]) == pytest.approx(t / h)


def test_the_figure_is_written_at_a_readable_size(tmp_path):
    from PIL import Image

    runs = _fixture(tmp_path)
    df = R.compose(runs, [0.3, 1.0, 3.0], n_boot=50)
    png = R.plot(df, tmp_path / "ratios.png", "fixture")
    w, h = Image.open(png).size
    assert 800 < w <= 2400 and h < 1200


def test_a_dense_phase_past_the_target_is_charged_as_dense(tmp_path):
    """The PowerSGD start-after-one-epoch case: the target is reached inside the dense
    epoch, so every step to it is charged as dense, from the config (an older record) or
    from the phase log the hook recorded."""
    cfg = {"powersgd_rank": 4, "warmup_epochs": 1}
    _record(tmp_path, "old", "powersgd", 0, 1, 1, comm_cfg=cfg, warmup=1, steps_to_target=7)
    log = "dense/1/0/10/5671680;powersgd/1/4/10/90000"
    _record(tmp_path, "new", "powersgd", 1, 2, 2, comm_cfg=cfg, steps_to_target=8)
    write_curve(
        tmp_path,
        "new",
        [
            {
                "epoch": 1,
                "data/steps": 10,
                "clock/train_s": 1.0,
                "acc/top1": 0.5,
                "comm/phases": "dense/1/0/10/5671680",
            },
            {
                "epoch": 2,
                "data/steps": 10,
                "clock/train_s": 2.0,
                "acc/top1": 0.99,
                "comm/phases": "powersgd/1/4/10/90000",
            },
        ],
        extend=True,
    )
    runs, _ = R.load_runs(tmp_path)
    by = {r.run_id: r for r in runs}
    assert [(p.method, p.steps) for p in by["old"].phases] == [("dense", 7)]
    assert by["old"].accounting == "config" and by["new"].accounting == "recorded"
    assert [(p.method, p.steps) for p in by["new"].phases] == [("dense", 8)]
    dense = R.step_time_s("dense", get("dense").knobs_of({}), 5.0)
    assert R.run_time_s(by["new"], 5.0) == pytest.approx(8 * dense)
    # past the dense epoch the log charges each step by its phase
    log_run = R.run_from_record(
        {
            "run_id": "x",
            "comm": "powersgd",
            "target_metric": "top1",
            "target_value": 0.98,
            "steps_to_target": 14,
        },
        pd.DataFrame([{"epoch": 1, "data/steps": 20, "comm/phases": log}]),
    )
    assert [(p.method, p.steps, p.rank) for p in log_run.phases] == [
        ("dense", 10, 4),
        ("powersgd", 4, 4),
    ]
