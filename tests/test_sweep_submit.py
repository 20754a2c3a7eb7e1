"""The sweeps through a Hydra launcher (``bench/launch/submit.py``), resumed and
aggregated from their records (``bench/sweeps/resume.py``): docs/sweeps.md's three Slurm
commands, each job's allocation, what a rerun submits, what an aggregate says is
missing; and (slow) those commands run with submitit's local executor, a killed
job resubmitted, the aggregate beside the local run queue's, a 2-size scaling run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from bench.results.records import append_record
from bench.sweeps import ablation as ab
from bench.sweeps import protocol as pr
from bench.sweeps.resume import RERUN_FAILED, latest, pending, progress
from tests.conftest import REPO, TINY, run_cli

FILL = {"<nodes>": "2", "<gpus_per_node>": "1"}  # one machine: 2 local agents of 1 worker
# what the tests add to the docs' commands: a tiny sweep in a temporary directory
OPTS = ["--quick", "--comm", "dense,hitopk", "--order-seed", "7"]
TINY_RUN = ["train.epochs=1", *TINY]


def slurm_commands() -> list[list[str]]:
    """The three commands of docs/sweeps.md's Slurm block, split into words."""
    text = (REPO / "docs" / "sweeps.md").read_text()
    block = text.split("<!-- slurm-commands", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split() for line in block.strip().splitlines()]


def local(cmd: list[str], results: Path, opts=(), extra=()) -> list[str]:
    """A docs command as the tests run it (after ``python -m reproduce``): the local
    executor for Slurm, no partition, the GPU counts filled in, the results in
    ``results``; ``opts`` after the command's name, ``extra`` overrides at the end."""
    words = []
    for w in cmd[3:]:
        key, _, value = w.partition("=")
        if key == "hydra.launcher.partition":
            continue
        words.append("submitit_local" if w == "slurm" else f"{key}={FILL[value]}"
                     if value in FILL else w)  # fmt: skip
    return [words[0], *opts, "--results-dir", str(results), *words[1:], *extra]


def test_the_docs_show_three_slurm_commands_with_only_partition_and_gpus_to_fill() -> None:
    from reproduce.ablation import _parser

    submit, status, aggregate = slurm_commands()
    assert [c[:4] for c in (submit, status, aggregate)] == [
        ["python", "-m", "reproduce", "ablation"]
    ] * 3
    holes = {w for c in (submit, status, aggregate) for w in re.findall(r"<[^>]+>", " ".join(c))}
    assert holes == {"<partition>", *FILL}  # the partition and the GPU counts, nothing else
    args = _parser().parse_args(submit[4:])
    assert args.launcher == "slurm" and args.sweep_id == "protocol-1"
    assert _parser().parse_args(status[4:]).status == args.sweep_id
    assert _parser().parse_args(aggregate[4:]).aggregate == args.sweep_id
    ran = local(submit, Path("R"))
    assert ran[:5] == ["ablation", "--results-dir", "R", "--launcher", "submitit_local"]
    assert "<" not in " ".join(ran) and not any("partition" in w for w in ran)
    assert "cluster.nproc_per_node=1" in ran and "cluster.nnodes=2" in ran


def test_each_job_gets_the_allocation_of_its_topology(tmp_path: Path, monkeypatch) -> None:
    from bench.launch.submit import _executor, make_launcher, plan_groups
    from bench.sweeps.common import compose_all
    from reproduce.train import task

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexit 0\n")
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    monkeypatch.setenv("BENCH_RDZV_ENDPOINT", "n0:29500")
    topo = [(2, 8), (1, 8), (2, 8)]
    cfgs = compose_all([["cluster=multinode", f"cluster.nnodes={n}",
                         f"cluster.nproc_per_node={g}"] for n, g in topo])  # fmt: skip
    groups = plan_groups("slurm", cfgs)
    assert list(groups.values()) == [[0, 2], [1]]  # one job array per allocation
    alloc = next(iter(groups))
    lau = make_launcher(["hydra/launcher=slurm", "hydra.launcher.partition=gpu",
                         f"hydra.sweep.dir={tmp_path}", *alloc], task)  # fmt: skip
    script = _executor(lau)._executor._make_submission_file_text("python -m x", "u")
    for line in ("--nodes=2", "--gpus-per-node=8", "--ntasks-per-node=1", "--partition=gpu"):
        assert f"#SBATCH {line}\n" in script
    assert "BENCH_RDZV_ENDPOINT" in script  # node 0 becomes every task's rendezvous
    assert plan_groups("submitit_local", cfgs) == {(): [0, 1, 2]}  # this machine


def test_every_node_of_a_slurm_job_names_the_one_run_the_script_chose(
    tmp_path: Path, monkeypatch
) -> None:
    """The job script chooses the run id once, before ``srun`` starts a launcher on each
    node; each launcher takes it (not one id per node, with node 1's events under an id no
    record has), unless a record has it already."""
    import yaml

    from bench.config import to_container, to_object
    from bench.launch.run import prepare, write_run_json
    from bench.results import records
    from bench.sweeps.common import compose

    setup = yaml.safe_load((REPO / "conf/hydra/launcher/slurm.yaml").read_text())["setup"]
    line = next(x for x in setup if records.JOB_RUN_ID_ENV in x)
    out = subprocess.run(["bash", "-c", f"{line}; echo ${records.JOB_RUN_ID_ENV}"],
                         capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert records.RUN_ID_FORM.match(out), out
    monkeypatch.setenv("BENCH_RDZV_ENDPOINT", "n0:29500")
    monkeypatch.setenv(records.JOB_RUN_ID_ENV, out)
    ids, files = [], []
    for rank in (0, 1):  # two nodes' launchers, from the same job script, in one job folder
        cfg = to_object(compose(["cluster=multinode", "cluster.nnodes=2",
                                 "cluster.nproc_per_node=1", f"cluster.node_rank={rank}",
                                 f"results.dir={tmp_path}", *TINY_RUN]))  # fmt: skip
        meta = prepare(cfg, "x", 0.0, quiet=True, checked=True)
        ids.append(meta["run_id"])
        files.append(write_run_json(tmp_path / "job", {"config": to_container(cfg), "run": meta}))
    assert ids == [out, out]
    # each node's workers read their own node's config, never the other's half-written
    assert [f.name for f in files] == [f"run-{out}.json", f"run-{out}.node1.json"]
    assert [json.loads(f.read_text())["config"]["cluster"]["node_rank"] for f in files] == [0, 1]
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == sorted(f.name for f in files)
    local = to_object(compose(["cluster=local", f"results.dir={tmp_path}", *TINY_RUN]))
    assert prepare(local, "x", 0.0, quiet=True, checked=True)["run_id"] != out  # a job's only
    append_record(tmp_path, {"run_id": out, "status": "ok"})
    again = prepare(cfg, "x", 0.0, quiet=True, checked=True)["run_id"]
    assert again != out and records.RUN_ID_FORM.match(again)  # recorded: a new one


def _rec(run_id: str, comm: str, seed: int, status: str, sweep: str = "g1") -> dict:
    return {"run_id": run_id, "status": status, "experiment": "dawnbench_digits",
            "comm": comm, "cache": "none", "update": "naive", "target_metric": "top1",
            "target_value": 0.98, "time_to_target_s": 5.0 if status == "ok" else None,
            "epochs_to_target": 2 if status == "ok" else None,
            "config": {"results": {"sweep_id": sweep}, "train": {"seed": seed},
                       "cluster": {"name": "local", "nnodes": 2, "nproc_per_node": 1}}}  # fmt: skip


def test_a_rerun_submits_only_missing_and_interrupted_jobs(tmp_path: Path) -> None:
    plan = ab.Plan(sweep_id="g1", cluster="local", comms=("dense", "hitopk"), caches=("none",),
                   updates=("naive",), seeds=2, results_dir=str(tmp_path))  # fmt: skip
    keys = plan.keys()  # dense 0, hitopk 0, dense 1, hitopk 1
    for r in (
        _rec("a", "dense", 0, "ok"),
        _rec("b", "hitopk", 0, "interrupted"),
        _rec("c", "dense", 1, "error"),
        _rec("x", "dense", 1, "ok", sweep="other"),
    ):
        append_record(tmp_path, r)  # fmt: skip
    assert plan.pending() == [1, 3]  # interrupted and missing; the error is an outcome
    assert plan.pending(RERUN_FAILED) == [1, 2, 3]
    append_record(tmp_path, _rec("b2", "hitopk", 0, "ok"))  # the rerun of the interrupted one
    assert plan.pending() == [3]
    from bench.sweeps.common import sweep_records

    recs = sweep_records(tmp_path, "g1")
    df = ab.aggregate(recs, "g1").set_index("comm")
    assert df.loc["hitopk", "n_runs"] == 1 and df.loc["hitopk", "run_ids"] == "b2"
    assert df.loc["dense", "n_runs"] == 2 and df.loc["dense", "n_error"] == 1
    assert progress("grid", keys, recs, ab.key_of) == (
        "grid: 3 of 4 recorded (1 error, 2 ok), 1 without a record"
    )
    assert list(latest(recs, ab.key_of)) == keys[:3] and pending(keys, [], ab.key_of) == [
        0,
        1,
        2,
        3,
    ]


def _main(capsys, *args: str) -> tuple[int, str, str]:
    """``python -m reproduce ablation ARGS`` in this process: (exit status, out, err)."""
    from reproduce.ablation import main

    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_aggregate_and_status_of_an_unfinished_protocol_name_what_is_missing(
    tmp_path: Path, capsys
) -> None:
    plan = pr.Plan(sweep_id="p1", cluster="local", comms=("dense", "hitopk"), trials=2,
                   tune_seeds=(1000,), eval_seeds=(0,), results_dir=str(tmp_path),
                   launcher="submitit_local", recipe_lr=0.4)  # fmt: skip
    plan.save()
    job = next(j for j in plan.tune_jobs() if j.comm == "hitopk")
    rec = _rec("t1", "hitopk", 1000, "target_missed", sweep="p1")
    rec["protocol"] = {"name": pr.NAME, "role": "tune", "trial": job.trial, "selected": False}
    rec["train_time_s"] = 3.0
    append_record(tmp_path, rec)
    code, out, err = _main(capsys, "--status", "p1", "--results-dir", str(tmp_path))
    assert code == 0, err
    assert "launcher submitit_local" in out
    assert "tuning: 1 of 4 recorded (1 target_missed), 3 without a record" in out
    n = len(plan.timing_jobs())
    assert f"timing pass: 0 of {n} recorded, {n} without a record" in out
    assert "evaluation: at least 2 runs, submitted once tuning is recorded" in out
    code, out, err = _main(capsys, "--aggregate", "p1", "--results-dir", str(tmp_path))
    assert code == 0, err
    assert "missing: tuning: 1 of 4 recorded" in out and "partial" in out
    assert (tmp_path / "ablation" / "partial" / "p1.csv").exists()
    assert not (tmp_path / "ablation" / "p1.csv").exists()  # the final table: when complete
    # the same sweep id with another command: refused before anything runs
    code, out, err = _main(capsys, "--sweep-id", "p1", "--quick", "--comm", "dense",
                           "--cluster", "local", "--results-dir", str(tmp_path))  # fmt: skip
    assert code == 2 and "differs in " in err and "comms" in err, err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--launcher", "slurmm"], "unknown launcher 'slurmm'; known: slurm, submitit_local"),
        (["--launcher", "submitit_local", "hydra.launcher.partiton=x"], "partiton"),
        (["--launcher", "slurm", "hydra/launcher=submitit_local"], "differ"),
        (["hydra.launcher.partition=x"], "need a launcher"),
        (["--status", "nope"], "no plan of sweep nope"),
    ],
)
def test_bad_launcher_input_is_one_line_and_exit_2(tmp_path: Path, capsys, args, message) -> None:
    code, out, err = _main(capsys, "--quick", "--cluster", "local", "--dry-run",
                           "--results-dir", str(tmp_path), *args)  # fmt: skip
    assert code == 2 and message in err, out + err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "runs.jsonl").exists()


def test_the_measured_clusters_are_emulated_on_one_machine_only(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Through a launcher onto a real cluster (``cluster=multinode``) nothing is measured
    (the emulated cluster needs root and namespaces on one machine): no shaping, no timing
    pass; on one machine the measured clusters are emulated (root), but for a quick try on
    the local cluster, which needs no root."""
    monkeypatch.setenv("BENCH_RDZV_ENDPOINT", "n0:29500")
    code, out, err = _main(capsys, "--quick", "--launcher", "submitit_local", "--cluster",
                           "multinode", "--dry-run", "--verbose", "--results-dir",
                           str(tmp_path))  # fmt: skip
    assert code == 0, err
    assert not [ln for ln in out.splitlines() if ln.startswith(("time ", "shape "))]
    assert "(paper-224, paper, paper-b64)" in out and "needs root" not in out
    code, out, err = _main(capsys, "--cluster", "local", "--comm", "dense,hitopk",
                           "--dry-run", "--results-dir", str(tmp_path))  # fmt: skip
    assert code == 0, err
    assert "(measured-1.34, measured-5.37, paper-224, paper, paper-b64)" in out
    assert "needs root" in out
    code, out, err = _main(capsys, "--quick", "--cluster", "local", "--dry-run",
                           "--results-dir", str(tmp_path))  # fmt: skip
    assert code == 0, err
    assert "(paper-224, paper, paper-b64)" in out and "needs root" not in out


# -- real runs through submitit's local executor ------------------------------------------


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _job_dirs(root: Path, pattern: str) -> list[Path]:
    """submitit's job folders (named by the job id: a local job's pid); its folder also
    holds pickles with hex names, some of which start with a digit."""
    return sorted(d for d in root.glob(pattern) if d.is_dir() and d.name.isdigit())


def _kill_one_job(results: Path, proc: subprocess.Popen, timeout: float = 300) -> int:
    """SIGKILL the training process of one submitted job (its agents die with it, so it
    leaves no record); the job's id."""
    end = time.time() + timeout
    while time.time() < end and proc.poll() is None:
        for d in _job_dirs(results, "hydra/ablation/*/tune/*/.submitit/*"):
            kids = _children(int(d.name))
            if kids:
                time.sleep(3)  # into its launch
                for k in kids:
                    os.kill(k, signal.SIGKILL)
                return int(d.name)
        time.sleep(0.5)
    raise AssertionError(
        "no submitted job to kill:\n" + (proc.stdout.read() if proc.stdout else "")
    )


def _sweep_recs(results: Path, sweep: str) -> list[dict]:
    from bench.sweeps.common import sweep_records

    return sweep_records(results, sweep)


@pytest.mark.slow
def test_the_docs_protocol_through_submitit_local_resumes_a_killed_job(tmp_path: Path) -> None:
    submit, status, aggregate = slurm_commands()
    submit = local(submit, tmp_path, OPTS, TINY_RUN)
    status, aggregate = local(status, tmp_path), local(aggregate, tmp_path)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "reproduce", *submit]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    killed = _kill_one_job(tmp_path, proc)
    out = proc.communicate(timeout=900)[0]
    assert proc.returncode == 1, out  # a tuning run left no record: no evaluation yet
    assert f"job {killed} failed" in out and "1 tuning run(s) left no record" in out
    assert len(_sweep_recs(tmp_path, "protocol-1")) == 1
    p = run_cli(*status)
    assert "tuning: 1 of 2 recorded" in p.stdout and "1 without a record" in p.stdout

    p = run_cli(*submit, timeout=900)  # the same command again
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "tuning: 1 of 2 runs to go" in p.stdout and "evaluation: 2 of 2 runs to go" in p.stdout
    recs = _sweep_recs(tmp_path, "protocol-1")
    assert len(recs) == 4 and all(r["config"]["results"]["sweep_id"] == "protocol-1" for r in recs)
    assert {r["protocol"]["role"] for r in recs} == {"tune", "eval"}
    assert _job_dirs(tmp_path, "hydra/ablation/protocol-1/eval/*/.submitit/*")
    p = run_cli(*aggregate)
    assert p.returncode == 0 and "missing" not in p.stdout, p.stdout + p.stderr
    assert_same_as_the_local_run_queue(tmp_path, "protocol-1", nnodes=2, nproc_per_node=1)


def assert_same_as_the_local_run_queue(
    results: Path, sweep: str, nnodes: int, nproc_per_node: int
) -> None:
    """The same sweep (``OPTS``, the same seeds) through the local run queue on as many
    workers gives the same table and tuning table as ``sweep`` under ``results``, but for
    the columns that depend on the clock."""
    here = results / "queue"
    p = run_cli("ablation", *OPTS, "--cluster", "local", "--sweep-id", "q1", "--results-dir",
                str(here), f"cluster.nnodes={nnodes}", f"cluster.nproc_per_node={nproc_per_node}",
                *TINY_RUN, timeout=1800)  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    sub = pd.read_csv(results / "ablation" / f"{sweep}.csv")
    que = pd.read_csv(here / "ablation" / "q1.csv")
    same = ["comm", "trial", "n_runs", "n_reached", "n_error", "seeds", "best_peer"]
    assert list(sub.columns) == list(que.columns)
    assert sub[same].equals(que[same]), (sub[same], que[same])
    t_sub = pd.read_csv(results / "ablation" / f"{sweep}-tuning.csv")
    t_que = pd.read_csv(here / "ablation" / "q1-tuning.csv")
    cols = ["comm", "trial", "n_runs", "n_reached", "selected"]
    assert t_sub[cols].equals(t_que[cols]), (t_sub[cols], t_que[cols])


@pytest.mark.slow
def test_a_two_size_scaling_run_through_submitit_local(tmp_path: Path) -> None:
    args = ["scaling", "--launcher", "submitit_local", "--sweep-id", "s1", "--comm", "dense",
            "--topologies", "1x1,1x2", "--steps", "2", "--epochs", "2", "--repeats", "1",
            "--batch-per-worker", "16", "--results-dir", str(tmp_path), "model.width=4",
            "data.eval_batch_size=128"]  # fmt: skip
    p = run_cli(*args, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    df = pd.read_csv(tmp_path / "scaling" / "s1.csv")
    m = df[df["kind"] == "measured"].sort_values(["world_size", "comm"])
    assert list(m["world_size"]) == [1, 1, 2, 2] and list(m["comm"]) == ["dense", "nocomm"] * 2
    assert (m["throughput"] > 0).all() and m["predicted_step_s"].notna().all()
    assert list(m[m["comm"] == "nocomm"]["efficiency"]) == pytest.approx([1.0, 1.0])
    # one job per run: per size a dense warm-up, a compute-only calibration, then one
    # round of dense and the compute-only reference
    assert len(_job_dirs(tmp_path, "hydra/scaling/s1/*/.submitit/*")) == 8
    p = run_cli(*args, timeout=300)  # the same command again: nothing left to submit
    assert p.returncode == 0 and "submitted" not in p.stdout, p.stdout + p.stderr
    plan = json.loads((tmp_path / "scaling" / "s1.plan.json").read_text())
    assert plan["launcher"] == "submitit_local" and len(plan["predictions"]) == 4
