"""gpucheck's plan, budget and step handling, on the CPU (fake steps stand in for the GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.gpucheck.check import STEPS, Step, check, plan

REPO = Path(__file__).resolve().parents[1]


def _py(code: str):
    return lambda res: [sys.executable, "-c", code]


def _alive(pid: int) -> bool:
    """Running (a zombie, killed and not yet reaped by its new parent, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "reproduce", "gpucheck", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path):
    r = _cli("--dry-run", "--results-dir", str(tmp_path / "res"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for s in STEPS:
        assert s.name in r.stdout
    assert "machine: {" in r.stdout and "dry run: nothing was run" in r.stdout
    assert not (tmp_path / "res").exists()  # nothing recorded


def test_bad_arguments_are_refused(tmp_path):
    r = _cli("--only", "topk,bogus", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2 and "unknown step(s) bogus" in r.stderr
    r = _cli("--budget-s", "0", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2 and "--budget-s must be > 0" in r.stderr


def test_budget_caps_skips_and_what_was_left(tmp_path):
    import pandas as pd

    pidfile = tmp_path / "child.pid"
    hang = (
        "import subprocess, time, pathlib\n"
        "c = subprocess.Popen(['sleep', '60'])\n"
        f"pathlib.Path({str(pidfile)!r}).write_text(str(c.pid))\n"
        "time.sleep(60)\n"
    )
    steps = (
        Step("quick", "prints", _py("print('hello from quick')"), cap_s=30, min_s=1),
        Step("fails", "exits 3", _py("raise SystemExit(3)"), cap_s=30, min_s=1),
        Step("hangs", "overruns its cap", _py(hang), cap_s=3, min_s=1),
        Step("no-nccl", "needs nccl", _py("print(1)"), cap_s=5, needs=("cuda", "nccl"), min_s=1),
        Step("big", "needs more than is left", _py("print(1)"), cap_s=30, min_s=1000),
        Step("after", "never reached", _py("print(1)"), cap_s=30, min_s=1),
    )
    res = tmp_path / "res"
    t0 = time.monotonic()
    out = check(str(res), budget_s=60, steps=steps, info={"cuda": True, "nccl": False})
    assert time.monotonic() - t0 < 45  # the hanging step was cut at its cap
    got = {o.step: (o.status, o.returncode) for o in out}
    assert got["quick"] == ("ok", 0)
    assert got["fails"] == ("failed", 3)
    assert got["hangs"][0] == "timeout"
    assert got["no-nccl"][0] == "skipped"
    assert got["big"][0] == "not run" and got["after"][0] == "not run"
    # the hanging step's own child was killed with it (the whole process group)
    child = int(pidfile.read_text())
    time.sleep(0.5)
    assert not _alive(child)
    # one row per step, logs, and the summary table
    df = pd.read_csv(res / "bench" / "gpucheck.csv")
    assert list(df["step"]) == [s.name for s in steps]
    bench_id = df["bench_id"].iloc[0]
    log = (res / "gpucheck" / bench_id / "quick.log").read_text()
    assert "hello from quick" in log
    table = (res / "gpucheck" / f"{bench_id}.md").read_text()
    assert "| hangs | timeout |" in table and "| big | not run |" in table
    assert df.set_index("step").loc["quick", "detail"] == "hello from quick"


def test_every_step_is_planned_with_a_cap_within_the_default_budget():
    # the order the check promises (the torch-only device checks first), caps that each
    # fit the default budget, and the first five together within it
    first = ["hooks", "select", "update", "profile", "step", "calibrate"]
    assert [s.name for s in STEPS][:6] == first
    assert all(0 < s.min_s <= s.cap_s <= 480 for s in STEPS)
    # the device command's budget: twice in a 15-minute window, with the start-ups
    assert sum(s.cap_s for s in STEPS[:6]) <= 330
    assert sum(s.cap(cpu=True) for s in STEPS if s.cpu_args) <= 480  # --cpu's default budget


def test_a_machine_with_torch_and_triton_only_runs_the_torch_steps():
    """The last device machine had torch and Triton but no Hydra, DALI or pandas."""
    info = {"cuda": True, "nccl": True, "triton": "3", "pytest": "8", "torchvision": "0.26"}
    got = dict((s.name, what) for s, what in plan(STEPS, info))
    for name in ("hooks", "select", "update", "profile", "step", "calibrate", "gpu-tests"):
        assert got[name] == "run", (name, got[name])
    assert got["train-resnet50"] == "no HYDRA on this machine"
    assert got["input"] == "no DALI, PANDAS on this machine"
    assert got["throughput"] == "no PANDAS on this machine"
    no_tv = dict((s.name, what) for s, what in plan(STEPS, {**info, "torchvision": None}))
    assert no_tv["step"] == "no TORCHVISION on this machine"  # not "ok" with no rows


@pytest.mark.slow  # 38 s on 2 cores: the default suite stays under 15 minutes
def test_cpu_mode_runs_the_device_steps_end_to_end(tmp_path):
    """``--cpu``: the hooks, select, update and profile steps on CPU tensors, through the
    same check, logs and summary as on the GPU: a typo there fails here, not on the GPU."""
    res = tmp_path / "res"
    steps = tuple(s for s in STEPS if s.cpu_args)
    assert [s.name for s in steps] == ["hooks", "select", "update", "profile", "step"]
    out = check(str(res), budget_s=900, steps=steps, info={"cuda": False}, cpu=True)
    got = {o.step: o for o in out}
    for name in ("hooks", "select", "update", "profile", "step"):
        assert got[name].status == "ok", (name, got[name])
        assert (res / "gpucheck" / f"{name}.json").is_file()
    assert "cases, 0 failed" in got["hooks"].detail
    assert "ms" in got["update"].detail and "img/s" in got["profile"].detail
    assert "x dense" in got["step"].detail


def test_throughput_benchmark_runs_on_cpu_and_feeds_the_summary(tmp_path):
    import pandas as pd

    from bench.benchmarks.throughput import ANCHOR_IMAGES_PER_S, run
    from bench.gpucheck.summary import headline, snapshot

    before = snapshot(str(tmp_path))
    run(results_dir=str(tmp_path), quick=True)
    df = pd.read_csv(tmp_path / "bench" / "throughput.csv")
    assert (df["device"] == "cpu").all()
    images, tokens = df[df["model"] == "resnet50"], df[df["model"] == "transformer_tiny"]
    assert sorted(images["case"]) == ["bf16", "fp32"] == sorted(tokens["case"])
    assert (images["images_per_s"] > 0).all()
    assert (images["anchor_images_per_s"] == ANCHOR_IMAGES_PER_S).all()
    # quick: 2 sentences of 8 source + 8 target tokens per step
    assert (tokens["tokens_per_step"] == 32).all()
    rate = tokens["tokens_per_step"] / tokens["median_step_ms"] * 1e3
    assert (tokens["tokens_per_s"] - rate).abs().max() < 1e-6
    for part in (images, tokens):
        fp32 = part.set_index("case").loc["fp32"]
        assert fp32["speedup_vs_tf32"] == 1.0  # the baseline of its own run
    line = headline("throughput", str(tmp_path), before, tmp_path / "none.log")
    assert "bf16" in line and "fp32" in line and "img/s" in line and "tok/s" in line


def test_the_gpu_test_files_are_the_ones_with_gpu_tests():
    from bench.gpucheck.check import GPU_TEST_FILES

    marked = sorted(
        f"tests/{p.name}"
        for p in (REPO / "tests").glob("test_*.py")
        if any(
            ln.startswith(("@pytest.mark.gpu", "pytestmark = [pytest.mark.gpu"))
            for ln in p.read_text().splitlines()
        )
    )
    assert sorted(GPU_TEST_FILES) == marked


def _wheel(folder: Path, name: str = "gpucheckprobe") -> Path:
    """A minimal pure-Python wheel of one module ``name`` (``VALUE = 42``)."""
    import zipfile

    path = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    files = {
        f"{name}.py": "VALUE = 42\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    return path


def test_the_device_call_plans_its_steps_and_refuses_in_one_line(tmp_path):
    from bench.gpucheck.check import DEVICE_CALL

    wheels = tmp_path / "whl"
    wheels.mkdir()
    r = _cli("--call", "--wheels", str(wheels), "--dry-run", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "no .whl files there" in r.stderr
    _wheel(wheels)
    r = _cli("--call", "--wheels", str(wheels), "--dry-run", "--results-dir", "res", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "would install 1 wheels: gpucheckprobe-1.0-py3-none-any.whl" in r.stdout
    planned = [
        ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith("  ") and "$" not in ln
    ]
    assert planned == list(DEVICE_CALL)
    r = _cli("--call", "--only", "hooks", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2 and "leave out --only" in r.stderr
    import torch

    if not torch.cuda.is_available():  # a real run needs the GPU: one line, before any work
        r = _cli("--call", "--results-dir", "res", cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.startswith("error: no CUDA device")
        assert r.stderr.strip().count("\n") == 0 and not (tmp_path / "res").exists()


def test_wheels_install_for_the_check_and_its_steps_and_results_archive(tmp_path, monkeypatch):
    import tarfile

    from reproduce import gpucheck as cli

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    site = cli.install([_wheel(tmp_path)])
    assert __import__("gpucheckprobe").VALUE == 42
    r = subprocess.run([sys.executable, "-c", "import gpucheckprobe"], env=os.environ.copy())
    assert r.returncode == 0 and os.environ["PYTHONPATH"].startswith(site)
    res = tmp_path / "res"
    (res / "gpucheck").mkdir(parents=True)
    (res / "gpucheck" / "select.jsonl").write_text("{}\n")
    cli.archive(str(res), str(tmp_path / "out" / "gpucheck.tar.gz"))
    with tarfile.open(tmp_path / "out" / "gpucheck.tar.gz") as tar:
        assert "res/gpucheck/select.jsonl" in tar.getnames()
    with pytest.raises(SystemExit):
        cli.install([tmp_path / "missing-1.0-py3-none-any.whl"])


def test_the_device_call_train_runs_pass_their_own_checks(tmp_path):
    """Each ``reproduce train`` of the device call, composed and checked as ``train
    --dry-run`` does (config, data, cluster): a typo fails here, not on the GPU."""
    pytest.importorskip("hydra")
    from reproduce._dryrun import compose, refusal, sweep_jobs

    runs = [s for s in STEPS if s.name.startswith("train")]
    assert len(runs) == 3
    for s in runs:
        argv = s.command(str(tmp_path / "res"))
        overrides = [a for a in argv[4:] if not a.startswith("-")]
        jobs = sweep_jobs(overrides) if "-m" in argv else [overrides]
        for job in jobs:
            assert refusal(compose(job)) is None, (s.name, job)
    assert len(sweep_jobs([a for a in runs[0].command("r")[5:]])) == 3  # three methods
