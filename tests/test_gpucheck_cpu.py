"""gpucheck where the GPU machine's packages are missing, on the CPU: it starts, plans and
runs its torch-only steps with Hydra, pandas and the rest blocked; a step killed at its cap
leaves the rows it measured; the Triton kernels compile for sm_90; the hooks' probes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
# what the GPU machine lacks: every import of these fails there, as it does under BLOCKER
MISSING = (
    "hydra", "omegaconf", "pandas", "matplotlib", "scipy", "sklearn", "nvidia.dali",
    "sacrebleu", "sentencepiece",
)  # fmt: skip
BLOCKER = "import sys\nfor _n in {names!r}:\n    sys.modules[_n] = None  # import fails\n"


def _blocked_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python processes (and their children) cannot import MISSING."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(names=MISSING))
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}", "PYTHONUNBUFFERED": "1"}


def _run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120):
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_blocker_blocks(tmp_path):
    r = _run(["-c", "import omegaconf"], _blocked_env(tmp_path), tmp_path)
    assert r.returncode != 0 and "omegaconf" in r.stderr


def test_gpucheck_plans_without_hydra_pandas_or_dali(tmp_path):
    env = _blocked_env(tmp_path)
    r = _run(["-m", "reproduce", "gpucheck", "--cpu", "--dry-run"], env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert '"hydra": null' in r.stdout and '"pandas": null' in r.stdout
    assert '"numpy": "' in r.stdout  # probed
    for step in ("hooks", "select", "update", "profile", "step"):
        assert f"  {step} " in r.stdout
    assert "dry run: nothing was run" in r.stdout


def test_gpu_test_files_load_without_the_missing_packages(tmp_path):
    marked = sorted(
        f"tests/{p.name}" for p in (REPO / "tests").glob("test_*.py") if "mark.gpu" in p.read_text()
    )
    # no plugins of the packages blocked (Hydra brings one): the device machine has none
    env = {**_blocked_env(tmp_path), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    r = _run(
        ["-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *marked],
        env,
        REPO,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:]  # 2 on a collection error
    assert "tests collected" in r.stdout and "mstopk_cuda" in r.stdout


# a real step (perf select on the CPU), stopped after its second row: hangs as a step does
# past its cap, and is killed there by the check
HANG_AFTER_TWO = """
import runpy, sys, time
from bench.gpucheck import rows
add = rows.Rows.add
def add_then_hang(self, row, line=""):
    add(self, row, line)
    if len(self.rows) == 2:
        time.sleep(600)
rows.Rows.add = add_then_hang
sys.argv = ["perf", "select", "--cpu", "--out", sys.argv[1]]
runpy.run_module("bench.gpucheck.perf", run_name="__main__")
"""


def test_a_step_killed_at_its_cap_keeps_its_rows(tmp_path, monkeypatch):
    from bench.gpucheck.check import Step, check

    res = tmp_path / "res"
    out = res / "gpucheck" / "select.json"
    argv = [sys.executable, "-c", HANG_AFTER_TWO, str(out)]
    step = Step("select", "select, stopped", lambda _: argv, cap_s=25, needs=(), min_s=1)
    env = _blocked_env(tmp_path)
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    [o] = check(str(res), budget_s=60, steps=(step,), info={"cuda": False})
    assert o.status == "timeout"
    assert not out.exists()  # the step never finished
    kept = [json.loads(ln) for ln in out.with_suffix(".jsonl").read_text().splitlines()]
    assert len(kept) == 2 and kept[0]["what"] == "bandwidth" and kept[1]["exact"]
    assert o.detail.startswith("stopped: 2 rows kept")  # the summary reads them
    md = next((res / "gpucheck").glob("*.md")).read_text()
    assert "| select | timeout |" in md and "git ?" not in md


@pytest.mark.slow
def test_the_whole_cpu_check_runs_without_the_missing_packages(tmp_path):
    """Done once by hand too: ``gpucheck --cpu`` end to end, within its budget."""
    env = _blocked_env(tmp_path)
    r = _run(["-m", "reproduce", "gpucheck", "--cpu", "--results-dir", "res"], env, tmp_path, 600)
    assert r.returncode == 0, r.stdout[-3000:]
    for step in ("hooks", "select", "update", "profile", "step"):
        assert f"[{step}] ok in" in r.stdout
        assert (tmp_path / "res" / "gpucheck" / f"{step}.jsonl").is_file()


def test_every_triton_kernel_compiles_for_sm90_without_a_gpu():
    """Through Triton's compiler to the binary (Triton brings its own ptxas): a lowering
    error fails here, on the CPU, not in a GPU window."""
    pytest.importorskip("triton")
    from bench.gpucheck.kernels import compile_all, specs

    rows = compile_all(90)
    assert {r["kernel"] for r in rows} == {s.name for s in specs()}
    bad = [f"{r['kernel']} {r['input']}: {r.get('error')}" for r in rows if not r["ok"]]
    assert not bad, bad
    assert all(r["stages"].endswith("cubin") for r in rows)


def test_a_lowering_error_is_reported():
    pytest.importorskip("triton")
    from bench.gpucheck.kernels import Kernel, compile_one

    wrong = Kernel("_group_kernel", {"x_ptr": "*fp32", "add_ptr": "*fp32"}, {}, {})
    row = compile_one(wrong)
    assert row["ok"] is False and row["error"]


def test_the_race_probe_reaches_cpp_futures_and_done_callbacks():
    """A collective's future is torch's C++ one: ``then`` and ``add_done_callback`` on it
    (as hitopk and PowerSGD use them) pass through the probe's delay."""
    import torch.distributed as dist

    from bench.benchmarks.spawn import free_port
    from bench.gpucheck.hooks import race

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        seen, delays = [], [0]
        with race(torch.device("cpu"), True, delays):
            fut = dist.all_reduce(torch.ones(3), async_op=True).get_future()
            assert type(fut) is torch._C.Future  # not the Python subclass
            chained = fut.then(lambda f: f.value()[0] * 2)
            fut.add_done_callback(lambda f: seen.append(1))
            py = torch.futures.Future()
            py.add_done_callback(lambda f: seen.append(2))
            py.set_result(1)
            assert torch.equal(chained.wait(), torch.full((3,), 2.0))
            for _ in range(500):  # the done-callback runs on gloo's thread, maybe later
                if len(seen) == 2:
                    break
                time.sleep(0.01)
        assert sorted(seen) == [1, 2] and delays[0] == 3
        delays[0] = 0  # restored after the block: later futures are not delayed
        dist.all_reduce(torch.ones(1), async_op=True).get_future().then(lambda f: None).wait()
        assert delays[0] == 0
    finally:
        dist.destroy_process_group()


def test_syncs_are_judged_at_this_projects_sites_only():
    import traceback

    from bench.gpucheck.hooks import _BENCH, sync_site

    def frame(path: Path | str, line: int) -> traceback.FrameSummary:
        return traceback.FrameSummary(str(path), line, "f")

    torch_hooks = Path(torch.__file__).parent / "distributed/algorithms/ddp_comm_hooks"
    ours = frame(_BENCH / "comm" / "hooks.py", 10)
    check = frame(_BENCH / "gpucheck" / "hooks.py", 99)
    c10d = frame(Path(torch.__file__).parent / "distributed/distributed_c10d.py", 5)
    # innermost last, as traceback.extract_stack gives them
    assert sync_site([check, ours, frame(torch_hooks / "powerSGD_hook.py", 7)]).startswith(
        "torch powerSGD_hook.py"
    )
    assert sync_site([check, ours, c10d]) == "bench bench/comm/hooks.py:10"
    assert sync_site([check, c10d]).startswith("other ")  # the check's own call: not judged


@pytest.mark.slow  # one ResNet-50 DDP step per hook on the CPU: keeps the default suite < 15 min
def test_the_step_check_runs_one_ddp_step_per_hook_on_the_cpu(tmp_path):
    pytest.importorskip("torchvision")
    import torch.distributed as dist

    from bench.benchmarks.spawn import free_port
    from bench.gpucheck import step
    from bench.gpucheck.rows import Rows

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        row, _ = step.measure("mstopk", torch.device("cpu"), cpu=True)
    finally:
        dist.destroy_process_group()
    assert row["buckets"] >= 1 and row["step_ms"] > 0 and row["tail_ms"] >= 0
    assert row["tail_ms"] < row["step_ms"] and row["peak_mib"] is None
    sink = Rows("step", str(tmp_path / "step.json"))
    sink.add(row)
    assert json.loads((tmp_path / "step.jsonl").read_text())["hook"] == "mstopk"


def test_the_cpu_scatter_is_the_plain_sum_and_used_here_is_a_cpu_no_op():
    from bench.comm.communicators import _scatter_mean, used_here

    flat = torch.empty(6)
    idx = torch.tensor([[0, 2, 2], [2, 5, 0]])
    vals = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    _scatter_mean(flat, idx, vals, 2, 6)
    assert torch.equal(flat, torch.tensor([3.5, 0, 4.5, 0, 0, 2.5]))
    used_here(flat)  # nothing to record on the CPU


def test_calibration_rows_are_measured_and_read_back(tmp_path, monkeypatch):
    """The calibrate step's measurement on the CPU (a tiny batch), its CSV, and the reader
    the performance model calls."""
    from bench.cluster import calibration
    from bench.gpucheck import calibrate

    monkeypatch.setitem(calibrate.SHAPES["cpu"], "transformer_tiny", (2, 8))
    monkeypatch.setattr(calibrate, "DENSITIES", (0.01,))
    rows = calibrate.measure("transformer_tiny", torch.device("cpu"), reps=1)
    got = {r["quantity"] for r in rows}
    assert {"fwd_bwd_s", "update_s", "lowrank_s", "dct_s", "reduce_s", "dense_s"} <= got
    assert {"select_s[topk]", "select_s[mstopk]", "scatter_s"} <= got
    assert {"matmul_s", "matmul_call_s", "qr_s", "qr_call_s"} <= got  # PowerSGD's compute
    assert all(r["value"] > 0 for r in rows if not r["quantity"].endswith("call_s"))
    path = tmp_path / "calibration" / f"{calibration.device_slug('Intel(R) Xeon(R) X')}.csv"
    assert path.name == "intel-xeon-x.csv"
    calibrate.write_csv([{"device": "x", **r} for r in rows], path)
    c = calibration.constants("transformer_tiny", path)
    assert c["batch"] == 2 and c["compute_s"] > 0 and c["density"] == 0.01
    k = calibration.costs("Intel(R) Xeon(R) X", "transformer_tiny", root=path.parent)
    mstopk = k.using("mstopk").select_s
    assert mstopk == pytest.approx(c["select_s"]["mstopk"] + c["reduce_s"])
    assert k.matmul_s == c["matmul_s"] > 0 and k.qr_call_s == c["qr_call_s"]
    with pytest.raises(FileNotFoundError, match="intel-xeon-x"):
        calibration.load("no such device", root=path.parent)
    with pytest.raises(KeyError, match="no calibration rows for model"):
        calibration.costs(path, "nothing")


def test_the_committed_cpu_calibration_names_its_cpu():
    from bench.cluster import calibration

    assert calibration.devices(), "no results/calibration/*.csv committed"
    for dev in calibration.devices():
        rows = calibration.load(dev)
        assert rows and all(r["device"] and r["hardware"] for r in rows)
        for model in {r["model"] for r in rows} - {calibration.LOOPBACK}:
            c = calibration.constants(model, dev)
            assert c["compute_s"] > 0 and c["select_s"] and c["scatter_s"] > 0
