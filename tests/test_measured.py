"""The protocol's measured clusters on fake runs: the shaping rule converges on a cluster
whose ratio is c / bandwidth (and is refused in one line where it cannot), a resumed sweep
redoes nothing, a plan with a recorded CPU kind refuses another, the prediction is written
before the evaluation with one row per method and measured cluster; and (slow, root) a
quick sweep's shaping on the emulated cluster reaches its ratio."""

from __future__ import annotations

import json
import os
import shutil
import zlib
from pathlib import Path
from typing import Any

import pytest

from bench import methods
from bench.cluster import perfmodel as pm
from bench.cluster.netns import parse_bandwidth
from bench.registry import ConfigError
from bench.results.env import cpu_model
from bench.results.records import append_record, load_records, write_curve
from bench.sweeps import measured as ms
from bench.sweeps import protocol as pr
from bench.sweeps.common import write_table

SWEEP = "ablation-measured-test"
GUESS = "50mbit"  # the fake profile's first guess of every link
COMPUTE_S = 0.05  # the fake compute-only step


def _plan(tmp_path: Path, **kw: Any) -> pr.Plan:
    kw = {"recipe_lr": 0.4, "comms": ("dense", "hitopk"), "trials": 2, "tune_seeds": (1000,),
          "eval_seeds": (0, 1, 2), **kw}  # fmt: skip
    return pr.Plan(sweep_id=SWEEP, results_dir=str(tmp_path), cluster="local", **kw)


def _saved(tmp_path: Path, monkeypatch) -> pr.Plan:
    """A saved plan whose measured clusters the model's stand-in (:func:`_model`) prices."""
    monkeypatch.setattr(ms, "_model", _model)
    plan = _plan(tmp_path)
    plan.save()
    return plan


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _ratio(c_bits: float):
    """Dense's comm / compute c / bandwidth: c bits over the link per compute step."""
    return lambda bps: c_bits / bps


def fake(ran: list, ratio=_ratio(4.0e8), stop_after=None, before_eval=None, kind=""):
    """A runner that records each job as a run would: a shaping or timing run's training
    time at its link (dense's communication ``ratio(bps)`` x the compute step, each seed
    a little off), a tuning or evaluation run's steps by its trial (:func:`_steps`), on
    this machine's CPU kind or ``kind``."""

    def run(jobs: list[list[str]], sweep_dir: Path, experiment: str) -> list[int]:
        for job in jobs:
            if stop_after is not None and len(ran) == stop_after:
                raise KeyboardInterrupt  # the sweep dies: the runs before have their records
            kv = dict(o.split("=", 1) for o in job)
            role, trial, seed = kv["results.protocol_role"], kv["results.protocol_trial"], int(
                kv["train.seed"])  # fmt: skip
            if role == "eval" and before_eval:
                before_eval()
            comm = next(s.name for s in methods.specs() if s.overrides() == [f"comm={kv['comm']}"])
            ran.append((role, comm, trial, seed, kv.get("results.protocol_cluster", "")))
            link = kv.get("cluster.inter_node_bandwidth", GUESS)
            config = {
                "results": {"sweep_id": kv["results.sweep_id"], "protocol_cluster": ran[-1][-1]},
                "train": {"seed": seed},
                "cluster": {"name": kv["cluster"], "inter_node_bandwidth": link},
                "comm": {k[5:]: _value(v) for k, v in kv.items() if k[:5] == "comm."},
            }
            rec = {"run_id": f"r{len(ran)}", "status": "target_missed", "comm": kv["comm"],
                   "experiment": experiment, "target_metric": "top1", "target_value": 0.98,
                   "hardware": f"CPU {kind or cpu_model()} (2 cores), no GPU", "config": config,
                   "protocol": {"name": pr.NAME, "role": role, "trial": trial,
                                "selected": role == "eval"}}  # fmt: skip
            if role in ("shape", "time"):
                steps = 20
                comm_s = ratio(parse_bandwidth(link)) * COMPUTE_S if comm != "nocomm" else 0.0
                jitter = 1 + 0.02 * (seed % 3 - 1)
                rec |= {"train_time_s": steps * (COMPUTE_S + comm_s) * jitter,
                        "comm_phases": [{"steps": steps}]}  # fmt: skip
            else:
                steps = _steps(trial, seed)
                d = config["comm"].get("density", 1.0)
                rec |= {"status": "ok", "steps_to_target": steps, "time_to_target_s": steps / 10,
                        "train_time_s": steps / 10}  # fmt: skip
                write_curve(kv["results.dir"], rec["run_id"], [{
                    "epoch": 1, "data/steps": steps, "clock/train_s": steps / 10,
                    "acc/top1": 0.99, "comm/phases": f"{kv['comm']}/{d}/0/{steps}/1"}])  # fmt: skip
            append_record(kv["results.dir"], rec)
        return [0] * len(jobs)

    return run


def _steps(trial: str, seed: int) -> int:
    """A tuning or evaluation run's steps to target: by its trial, a little off by seed."""
    return 40 + zlib.crc32(trial.encode()) % 13 + seed % 3


def _model(experiment: str, bps: float, compute_s: float, cpu: str = "cpu"):
    """A stand-in for the performance model of an emulated cluster: the link alone."""
    wl = pm.Workload(buckets=pm.buckets_for(100_000), compute_s=compute_s)
    return wl, pm.Cluster(2, 2, inter_bw=bps / 8), pm.Costs()


def test_shaping_converges_on_a_cluster_whose_ratio_is_c_over_bandwidth(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    plan.save()
    ran: list = []
    ms.shape(plan, fake(ran), tmp_path, log=lambda s: None)
    state = ms.shaping(plan, load_records(tmp_path))
    assert list(state) == ["measured-1.34", "measured-5.37"] == ms.names(plan)
    for name, sh in state.items():
        assert sh.shaped is not None and sh.within(sh.shaped) and not sh.todo
        assert abs(sh.shaped.ratio / sh.target - 1) <= ms.TOLERANCE
        # the first round at the guess, the next at bandwidth x measured / target
        assert sh.rounds[0].rate == ms.rate(parse_bandwidth(GUESS))
        for a, b in zip(sh.rounds, sh.rounds[1:]):
            assert parse_bandwidth(b.rate) == pytest.approx(
                parse_bandwidth(a.rate) * a.ratio / sh.target, rel=1e-3)  # fmt: skip
        assert 2 <= len(sh.rounds) <= ms.MAX_ROUNDS
        # every round's runs are kept; timing and evaluation run at the shaped link
        assert sum(r[0] == "shape" and r[-1] == name for r in ran) == 4 * len(sh.rounds)
        over = plan.overrides(next(j for j in plan.timing_jobs() if j.where == name))
        assert f"cluster.inter_node_bandwidth={sh.shaped.rate}" in over
        assert "cluster=emulated" in over and f"results.protocol_cluster={name}" in over
    # the faster target needs the faster link: c / bps = ratio
    assert parse_bandwidth(state["measured-1.34"].shaped.rate) > parse_bandwidth(
        state["measured-5.37"].shaped.rate)  # fmt: skip
    lines = ms.status(plan, load_records(tmp_path))
    assert lines[1].startswith("shaping measured-1.34: target 1.34, shaped: measured 1.")


def test_a_link_that_never_reaches_its_ratio_is_refused_in_one_line(tmp_path: Path) -> None:
    plan = _plan(tmp_path, measured=("paper",))
    ran: list = []
    with pytest.raises(ConfigError) as e:  # 3.0 whatever the link: never 1.34
        ms.shape(plan, fake(ran, ratio=lambda bps: 3.0), tmp_path, log=lambda s: None)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and "never within 15% of 1.34" in msg, msg
    assert len(ran) == 4 * ms.MAX_ROUNDS
    with pytest.raises(ConfigError, match="not shaped"):  # nothing runs on it
        plan.overrides(plan.timing_jobs()[0])


def test_an_interrupted_sweep_resumes_without_redoing_a_run(tmp_path: Path, monkeypatch) -> None:
    _saved(tmp_path, monkeypatch)
    ran: list = []
    for stop in (3, 7, 13, 21):  # in tuning, in shaping rounds, in the timing pass
        again = pr.Plan.load(tmp_path, SWEEP)
        with pytest.raises(KeyboardInterrupt):
            ms.run(again, fake(ran, stop_after=stop), tmp_path, write_table, log=print)
        assert len(ran) == stop
    again = pr.Plan.load(tmp_path, SWEEP)
    ms.run(again, fake(ran), tmp_path, write_table, log=lambda s: None)
    assert len(ran) == len(set(ran))  # every job once, none twice
    recs = load_records(tmp_path)
    assert pr.complete(again, recs)
    n = len(ran)
    ms.run(pr.Plan.load(tmp_path, SWEEP), fake(ran), tmp_path, write_table, log=print)
    assert len(ran) == n and len(load_records(tmp_path)) == n  # nothing left to run


def test_until_tuning_stops_before_the_first_measured_run_and_resume_goes_on(
    tmp_path: Path, monkeypatch
) -> None:
    plan = _saved(tmp_path, monkeypatch)
    ran: list = []
    ms.run(plan, fake(ran), tmp_path, write_table, log=lambda s: None, until="tuning")
    assert ran and {r[0] for r in ran} == {"tune"} and len(ran) == len(plan.tune_jobs())
    ms.run(pr.Plan.load(tmp_path, SWEEP), fake(ran), tmp_path, write_table, log=lambda s: None)
    assert len(ran) == len(set(ran)) and {"shape", "time", "eval"} <= {r[0] for r in ran}
    assert sum(r[0] == "tune" for r in ran) >= len(plan.tune_jobs())  # the rate extension too


def test_the_prediction_comes_before_the_evaluation_one_row_per_method_and_cluster(
    tmp_path: Path, monkeypatch
) -> None:
    plan = _saved(tmp_path, monkeypatch)
    path = ms.table_path(plan, ms.PREDICTION)
    seen: list[bool] = []
    ran: list = []
    ms.run(plan, fake(ran, before_eval=lambda: seen.append(path.exists())), tmp_path,
           write_table, log=lambda s: None)  # fmt: skip
    assert seen and all(seen)  # written before the first evaluation run
    recs = load_records(tmp_path)
    pred = ms.predictions(plan, recs, pr.chosen(plan, recs))
    assert sorted(zip(pred["cluster"], pred["comm"])) == sorted(
        (c, m) for c in ms.names(plan) for m in plan.comms)  # fmt: skip
    assert (pred["predicted_s"] > 0).all() and (pred["cpu_kind"] == cpu_model()).all()
    # dense at 1.34 is predicted at its steps x (compute + the link's allreduce)
    row = pred[(pred["cluster"] == "measured-1.34") & (pred["comm"] == "dense")].iloc[0]
    wl, c, k = _model("", row["bandwidth_bps"], row["compute_s"])
    spec = methods.get("dense")
    steps = _steps(row["trial"], 1000)
    assert row["predicted_s"] == pytest.approx(steps * spec.step_time(wl, c, k, spec.knobs_of({})))
    assert row["measured_ratio"] == pytest.approx(row["target_ratio"], rel=ms.TOLERANCE)
    # after the evaluation: prediction and measurement side by side, the error per method
    df = ms.table(plan, recs)
    assert len(df) == len(pred) and (df["n_runs"] == 3).all()
    first = df.iloc[0]
    assert first["prediction_error"] == pytest.approx(
        first["predicted_s"] / first["measured_median_s"] - 1)  # fmt: skip
    assert first["measured_ci_low_s"] <= first["measured_median_s"] <= first["measured_ci_high_s"]
    text = ms.format_table(df)
    assert f"CPU {cpu_model()}" in text and "measured-5.37" in text
    # evaluation runs of a configuration selected for a measured cluster ran on it
    evals = {(r[1], r[2], r[4]) for r in ran if r[0] == "eval"}
    picked = pr.chosen(plan, recs)
    for name in ms.names(plan):
        assert {(m, t, name) for m, t in picked[name].items()} <= evals


def test_the_prediction_is_made_once_priced_on_the_sweeps_cpu_kind(
    tmp_path: Path, monkeypatch
) -> None:
    priced_on: list[str] = []

    def model(experiment: str, bps: float, compute_s: float, cpu: str = "cpu"):
        priced_on.append(cpu)
        return _model(experiment, bps, compute_s)

    monkeypatch.setattr(ms, "_model", model)
    plan = _plan(tmp_path)
    plan.save()
    ran: list = []

    def stop() -> None:  # the sweep dies at its first evaluation run
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ms.run(plan, fake(ran, before_eval=stop), tmp_path, write_table, log=lambda s: None)
    path = ms.table_path(plan, ms.PREDICTION)
    made = path.read_text()
    assert priced_on and set(priced_on) == {cpu_model()}  # the kind the plan pinned
    # resumed where the model's constants changed since: the prediction stays as made
    monkeypatch.setattr(ms, "_model", lambda *a: pytest.fail("predicted again"))
    ms.run(pr.Plan.load(tmp_path, SWEEP), fake(ran), tmp_path, write_table, log=lambda s: None)
    assert path.read_text() == made and pr.complete(plan, load_records(tmp_path))
    # on another CPU kind, a resume with evaluation runs left is refused in one line before
    # anything is priced or run (no calibration rows for that kind are needed)
    first = next(r for r in load_records(tmp_path) if r["protocol"]["role"] == "eval")
    append_record(tmp_path, {**first, "run_id": "again", "status": "interrupted"})
    monkeypatch.setattr(ms, "cpu_model", lambda: "AMD EPYC 7B13")
    n = len(ran)
    with pytest.raises(ConfigError) as e:
        ms.run(pr.Plan.load(tmp_path, SWEEP), fake(ran), tmp_path, write_table, log=print)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and "AMD EPYC 7B13" in msg and len(ran) == n, msg


def test_an_evaluation_run_kept_out_on_another_kind_counts_in_the_projections_only(
    tmp_path: Path, monkeypatch
) -> None:
    from bench.sweeps import protocol_table as pt

    plan = _saved(tmp_path, monkeypatch)
    ran: list = []
    ms.run(plan, fake(ran), tmp_path, write_table, log=lambda s: None)
    # the sweep's last measured evaluation run was interrupted, and only another kind is left
    last = [r for r in load_records(tmp_path) if r["protocol"]["role"] == "eval"][-1]
    job = pr.job_of(last)
    assert job.where  # a measured cluster's
    append_record(tmp_path, {**last, "run_id": "cut", "status": "interrupted"})
    amd = "AMD EPYC 7B13"
    monkeypatch.setattr(ms, "cpu_model", lambda: amd)
    n, said = len(ran), []
    again = pr.Plan.load(tmp_path, SWEEP)
    ms.run(again, fake(ran, kind=amd), tmp_path, write_table, log=said.append, keep_out=True)
    assert len(ran) == n + 1 and ran[-1][0] == "eval" and ran[-1][4] == job.where
    assert any(f"on {amd}, kept out of the measured columns" in line for line in said), said
    recs = load_records(tmp_path)
    out = ms.kept_out(again, recs)
    assert [pr.job_of(r).key for r in out] == [job.key] and ms.kind_of(out[0]) == amd
    assert pr.complete(again, ms.counted(again, recs))
    assert not pr.complete(again, ms.kept(again, recs))  # the measured runs alone lack it
    # kept out is final: not run again, here or on the sweep's own kind
    ms.run(again, fake(ran, kind=amd), tmp_path, write_table, log=lambda s: None)
    monkeypatch.setattr(ms, "cpu_model", cpu_model)
    ms.run(pr.Plan.load(tmp_path, SWEEP), fake(ran), tmp_path, write_table, log=lambda s: None)
    assert len(ran) == n + 1
    # the measured column leaves it out and names it; a projection counts its steps
    df = pt.aggregate(again, ms.counted(again, recs))
    rid = out[0]["run_id"]
    cell = df[(df["for_cluster"] == job.where) & (df["comm"] == job.comm)].iloc[0]
    assert cell["n_runs"] == len(plan.eval_seeds) - 1 and rid not in cell["run_ids"].split()
    assert cell["kept_out"] == f"seed {job.seed}: {rid} on {amd}"
    projected = df[df["ratio"].notna() & (df["comm"] == job.comm) & (df["trial"] == job.trial)]
    assert not projected.empty and all(rid in ids.split() for ids in projected["run_ids"])
    assert (projected["n_runs"] == len(plan.eval_seeds)).all()
    assert (projected["kept_out"] == "").all() and (df["kept_out"] != "").sum() == 1
    # the measured table counts it apart, and the status says it is not run again
    m = ms.table(again, recs)
    row = m[(m["cluster"] == job.where) & (m["comm"] == job.comm)].iloc[0]
    assert row["n_other_kind"] == 1 and row["n_runs"] == len(plan.eval_seeds) - 1
    lines = ms.status(again, recs)
    assert any("1 evaluation run(s) on another kind kept out of the measured columns)" in x
               for x in lines), lines  # fmt: skip
    # --keep-out on the sweep's own kind has nothing to keep out
    from reproduce.ablation import _keep_out

    with pytest.raises(ConfigError, match="resume it without --keep-out"):
        _keep_out(pr.Plan.load(tmp_path, SWEEP), resumed=True)
    import bench.results.env

    monkeypatch.setattr(bench.results.env, "cpu_model", lambda: amd)
    _keep_out(again, resumed=True)  # another kind: accepted


def test_one_cpu_kind_for_the_measured_runs(tmp_path: Path, monkeypatch) -> None:
    plan = _plan(tmp_path, measured=("paper",))
    plan.save()
    tune = plan.tune_jobs()[:1]
    ms.claim(plan, tune)  # a local run: no kind recorded
    assert plan.cpu_kind == ""
    ran: list = []
    ms.shape(plan, fake(ran), tmp_path, log=lambda s: None)
    assert pr.Plan.load(tmp_path, SWEEP).cpu_kind == cpu_model()  # in the plan's file
    monkeypatch.setattr(ms, "cpu_model", lambda: "AMD EPYC 7B13")
    again = pr.Plan.load(tmp_path, SWEEP)
    with pytest.raises(ConfigError) as e:
        ms.run(again, fake(ran), tmp_path, write_table, log=lambda s: None)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and cpu_model() in msg and "AMD EPYC 7B13" in msg, msg
    # a measured run of another kind is kept out (and run again); a local one is not
    recs = load_records(tmp_path)
    shaped = next(r for r in recs if r["config"]["results"]["protocol_cluster"])
    other = {**shaped, "run_id": "x1", "hardware": "CPU AMD EPYC 7B13 (2 cores), no GPU"}
    local = {**other, "run_id": "x2", "config": {**other["config"], "results": {}}}
    kept = ms.kept(again, [*recs, other, local])
    assert other not in kept and local in kept and len(kept) == len(recs) + 1
    assert ms.kind_of(other) == "AMD EPYC 7B13"
    assert ms.kind_of({"hardware": "1x NVIDIA H100; host Intel Xeon (16 cores)"}) == "Intel Xeon"
    lines = ms.status(again, [*recs, other])
    assert f"measured runs on {cpu_model()} (1 on another kind kept out, run again)" in lines


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.timeout(3600)  # a round at 5.37 is 4 runs of 20 steps of 4-5 s on a busy host
@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("tc"), reason="needs root and iproute2"
)  # fmt: skip
def test_a_quick_sweeps_shaping_reaches_its_ratio_on_the_emulated_cluster(tmp_path: Path) -> None:
    from bench.sweeps.common import run_queued

    plan = pr.Plan(sweep_id=SWEEP, results_dir=str(tmp_path), cluster="local", **pr.quick())
    plan.check()
    print(ms.pin(plan))
    plan.save()
    ms.shape(plan, run_queued, tmp_path / "hydra", log=print)
    for sh in ms.shaping(plan, load_records(tmp_path)).values():
        print(sh.line())
        assert sh.shaped is not None and abs(sh.shaped.ratio / sh.target - 1) <= ms.TOLERANCE


def test_the_command_shapes_predicts_and_writes_the_measured_table(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from bench.sweeps import common
    from reproduce.ablation import main

    monkeypatch.setattr(ms, "_model", _model)
    monkeypatch.setattr(ms, "pin", lambda plan: "")  # no timing of this host
    ran: list = []
    monkeypatch.setattr(common, "run_queued", fake(ran))
    main(["--quick", "--measured", "paper", "--sweep-id", "c1", "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "shaping measured-1.34: target 1.34, shaped: measured 1." in out
    assert f"measured clusters (CPU {cpu_model()})" in out and "measured-1.34" in out
    for suffix in ("prediction", "measured"):
        assert (tmp_path / "ablation" / f"c1-{suffix}.csv").is_file()
    main(["--status", "c1", "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "shaping measured-1.34: target 1.34, shaped" in out
    assert f"measured runs on {cpu_model()}" in out
    with pytest.raises(SystemExit) as e:  # the plan's measured clusters are the plan's
        main(["--resume", "c1", "--measured", "none", "--results-dir", str(tmp_path)])
    assert e.value.code == 2 and "--measured" in capsys.readouterr().err
