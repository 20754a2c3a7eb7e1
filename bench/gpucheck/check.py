"""``python -m reproduce gpucheck``: probe the machine, then run :data:`STEPS` in order within
a budget, each in its own process group under its own cap; one row per step in
``<results>/bench/gpucheck.csv`` and a summary table (docs/internals/gpucheck.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.gpucheck.summary import BENCH_OF_STEP, headline, snapshot

PY = sys.executable
LOG_TAIL_BYTES = 256_000  # a step's log keeps its last this many bytes

# what the steps may use beyond torch, probed by import (named by their last part)
OPTIONAL = ("numpy", "nvidia.dali", "triton", "hydra", "pandas", "torchvision", "pytest")


def probe() -> dict[str, Any]:
    """What this machine offers the suite: CUDA and the GPU, NCCL, DALI, Triton."""
    import torch  # deferred: seconds to load, and this module is read without it
    import torch.distributed as dist

    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if info["cuda"]:
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpus=torch.cuda.device_count())
        info["gpu_mem_gib"] = round(props.total_memory / 2**30, 1)
        info.update(capability=f"{props.major}.{props.minor}", cuda_version=torch.version.cuda)
        info.update(cudnn=torch.backends.cudnn.version(), bf16=torch.cuda.is_bf16_supported())
    info["nccl"] = bool(info["cuda"] and dist.is_available() and dist.is_nccl_available())
    if info["nccl"]:
        try:
            info["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - the version is informative only
            info["nccl_version"] = "?"
    for module in OPTIONAL:
        name = module.rsplit(".", 1)[-1]
        try:
            info[name] = getattr(__import__(module, fromlist=["__version__"]), "__version__", "?")
        except Exception:  # noqa: BLE001 - optional
            info[name] = None
    return info


@dataclasses.dataclass(frozen=True)
class Step:
    """One measured part of the check: a command, what it needs and its time cap."""

    name: str
    what: str
    argv: Callable[[str], list[str]]  # results dir -> command line
    cap_s: float
    needs: tuple[str, ...] = ("cuda",)
    min_s: float = 30.0  # not started with less budget left than this
    cpu_args: tuple[str, ...] = ()  # the arguments that run the step on the CPU; () if none
    cpu_cap_s: float = 0.0  # the cap on the CPU (shared, slower cores); 0: cap_s

    def missing(self, info: dict[str, Any]) -> str | None:
        gone = [n for n in self.needs if not info.get(n)]
        return f"no {', '.join(gone).upper()} on this machine" if gone else None

    def cap(self, cpu: bool = False) -> float:
        return (self.cpu_cap_s or self.cap_s) if cpu else self.cap_s

    def command(self, results_dir: str, cpu: bool = False) -> list[str]:
        return self.argv(results_dir) + (list(self.cpu_args) if cpu else [])


def _bench(step: str, what: str, cap_s: float, *needs: str) -> Step:
    """The step's ``reproduce bench`` on CUDA, writing its CSV with pandas (and ``needs``)."""
    name = BENCH_OF_STEP[step]
    argv = lambda res: [PY, "-m", "reproduce", "bench", name, "--results-dir", res]  # noqa: E731
    return Step(step, what, argv, cap_s, needs=("cuda", *sorted(("pandas", *needs))))


TRAIN = "train.device=cuda train.progress=false train.checkpoint_every=0 results.plot=false"


def _train(*overrides: str, multirun: bool = False) -> Callable[[str], list[str]]:
    """``reproduce train`` on CUDA (``multirun``: a run per value of a comma-separated one)."""
    head = [PY, "-m", "reproduce", "train", *(["-m"] if multirun else []), *TRAIN.split()]
    return lambda res: [*head, f"results.dir={res}", *overrides]


# ResNet-50 on ImageNet-shaped synthetic batches (224 px, 1000 classes), one epoch of 30
# steps of 256 images per GPU (NVIDIA's reference batch) and its evaluation; bf16 autocast
# and channels-last are the CUDA defaults; no synchronising phase timers (throughput)
RESNET50_RUN = (
    "model=resnet50 data=synthetic data.batch_size=256 data.synthetic_size=7680 train.epochs=1 "
    "train.max_steps_per_epoch=30 train.time_phases=false"
).split()
TRANSFORMER_RUN = (
    "experiment=transformer_embedded model=transformer_base data.max_tokens=8192 train.epochs=1 "
    "train.max_steps_per_epoch=30 train.time_phases=false"
).split()
NCCL_1 = ("cluster.nproc_per_node=1", "cluster.backend=nccl")


def _module(module: str, *args: str, name: str = "") -> Callable[[str], list[str]]:
    """``python -m module *args --out <results>/gpucheck/<name>.json`` (torch only)."""
    out = f"{name or (args[0] if args else module.rsplit('.', 1)[-1])}.json"
    return lambda res: [PY, "-m", module, *args, "--out", str(Path(res) / "gpucheck" / out)]


# the files holding gpu tests, not the whole suite, and collection errors let through: a
# test module that imports a package this machine lacks must not keep the others from running
GPU_TEST_FILES = tuple(
    "tests/test_mstopk_cuda.py tests/test_optim_ddp.py tests/test_optim_ops.py "
    "tests/test_dali_gpu.py tests/test_gpucheck_device.py".split()
)
GPU_TESTS = [PY, *"-m pytest -m gpu -q -p no:cacheprovider --continue-on-collection-errors".split()]
HOOKS_CAP_S = 70
# the workers stop (their stacks dumped) before the step is killed
HOOKS_ARGS = ("--timeout-s", str(HOOKS_CAP_S - 10), "--layouts", "1,2x2")
# The torch-only steps come first and their caps add up to 330 s: a device window of
# 15 minutes holds the check twice, with each machine's start-up.
STEPS: tuple[Step, ...] = (
    Step(
        "hooks",
        "every hook, NCCL 1 + gloo 2x2 on one GPU: ranks, dense, syncs, race",
        _module("bench.gpucheck.hooks", *HOOKS_ARGS, name="hooks"),
        HOOKS_CAP_S,
        min_s=60,
        # on the CPU, the hooks whose plumbing differs most, the workers' time its cap's
        cpu_args=("--cpu", "--hooks", "dense,hitopk,powersgd", "--timeout-s", "140"),
        cpu_cap_s=150,
    ),
    Step(
        "select",
        "torch.topk vs MSTopK as a hook runs it, eager and graphed, 25.6 M / 100 M, bf16",
        _module("bench.gpucheck.perf", "select"),
        50,
        cpu_args=("--cpu",),
        cpu_cap_s=60,
    ),
    Step(
        "update",
        "fused / flat / flat+bf16, ResNet-50 / Transformer-base, own and DDP bucket grads",
        _module("bench.gpucheck.perf", "update"),
        40,
        cpu_args=("--cpu",),
        cpu_cap_s=90,
    ),
    Step(
        "profile",
        "ResNet-50 compute at 64/256 img x 224 px, DDP bucket readiness",
        _module("bench.gpucheck.perf", "profile"),
        40,
        cpu_args=("--cpu",),
        cpu_cap_s=60,
    ),
    Step(
        "step",
        "one ResNet-50 DDP step per hook, NCCL 1, and one profiled: where the time goes",
        _module("bench.gpucheck.step", name="step"),
        50,
        needs=("cuda", "torchvision"),
        cpu_args=("--cpu", "--hooks", "dense,powersgd,mstopk"),
        cpu_cap_s=120,
    ),
    Step(
        "calibrate",
        "the performance model's rows: ResNet-50 / Transformer-base compute and costs",
        _module("bench.gpucheck.calibrate", name="calibrate"),
        50,
        needs=("cuda", "torchvision"),  # the CPU's rows: python -m bench.gpucheck.calibrate --cpu
    ),
    Step(
        "gpu-tests",
        "pytest -m gpu",
        lambda res: [*GPU_TESTS, *GPU_TEST_FILES],
        60,
        needs=("cuda", "pytest"),
    ),
    Step(
        "train-resnet50",
        "reproduce train: ResNet-50, synthetic 224 px, NCCL 1, comm dense / mstopk / powersgd",
        _train(*RESNET50_RUN, *NCCL_1, "comm=dense,mstopk,powersgd", multirun=True),
        90,
        needs=("cuda", "nccl", "hydra", "torchvision"),
        min_s=45,
    ),
    Step(
        "train-hitopk",
        "the same with comm=hitopk: 2 workers sharing the GPU over gloo, each a node",
        _train(
            *RESNET50_RUN,
            *"cluster.nproc_per_node=2 cluster.backend=gloo".split(),
            "comm=hitopk",
            "comm.procs_per_node=1",
        ),
        50,
        needs=("cuda", "hydra", "torchvision"),
        min_s=30,
    ),
    Step(
        "train-transformer",
        "reproduce train: transformer_base on the embedded corpus, NCCL 1, 30 steps",
        _train(*TRANSFORMER_RUN, *NCCL_1),
        60,
        needs=("cuda", "nccl", "hydra"),
        min_s=30,
    ),
    _bench("topk", "torch.topk vs MSTopK methods, 25.6 M / 100 M, CUDA events", 90),
    _bench("update-bench", "optimizer update modes, ResNet-50 / Transformer-base", 90),
    _bench("input", "DALI mixed vs DALI CPU vs torchvision decode", 75, "dali"),
    _bench("throughput", "ResNet-50 synthetic 224 px, bf16 + channels_last", 75, "torchvision"),
)
# the prepared device call (docs/gpu.md): the torch-only checks of the selection, the
# hooks, the profiled step, the calibration rows, then the suite's own training runs
DEVICE_CALL = tuple(
    "hooks select step calibrate train-resnet50 train-hitopk train-transformer".split()
)


@dataclasses.dataclass
class Outcome:
    step: str
    status: str  # ok | failed | timeout | skipped | not run
    seconds: float = 0.0
    returncode: int | None = None
    detail: str = ""


def _pump(stream: Any, prefix: str, log: Any) -> None:
    for line in iter(stream.readline, ""):
        sys.stdout.write(f"[{prefix}] {line}")
        sys.stdout.flush()
        log.write(line)
    stream.close()


def run_step(argv: list[str], timeout_s: float, log_path: Path, prefix: str) -> tuple[str, int]:
    """(status, return code) of ``argv`` in its own process group, killed after ``timeout_s``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        out = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
        proc = subprocess.Popen(argv, env=env, start_new_session=True, **out)
        pump = threading.Thread(target=_pump, args=(proc.stdout, prefix, log), daemon=True)
        pump.start()
        try:
            rc = proc.wait(timeout=timeout_s)
            status = "ok" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):  # the whole group, gently first
                with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=5.0)
                if proc.poll() is not None:
                    break
            rc, status = proc.wait(), "timeout"
        pump.join(timeout=10)
    data = log_path.read_bytes()
    if len(data) > LOG_TAIL_BYTES:
        log_path.write_bytes(b"[... earlier output cut ...]\n" + data[-LOG_TAIL_BYTES:])
    return status, rc


def plan(
    steps: tuple[Step, ...], info: dict[str, Any], cpu: bool = False
) -> list[tuple[Step, str]]:
    """Each step and ``run`` or why it is skipped (``cpu``: those with a CPU mode run)."""
    if cpu:
        return [(s, "run" if s.cpu_args else "no CPU mode") for s in steps]
    return [(s, s.missing(info) or "run") for s in steps]


class _PlainRun:
    """The record where pandas is missing (BenchRun needs it): ``bench/gpucheck.jsonl``."""

    def __init__(self, results_dir: str) -> None:
        import platform

        from bench.results.env import git_sha

        self.bench_id = time.strftime("%Y%m%d-%H%M%S")
        sha = git_sha() or "unknown (no .git here: set BENCH_GIT_SHA)"
        self.meta = {"hardware": platform.node(), "git_sha": sha, "date": time.ctime()}
        self.path = Path(results_dir) / "bench" / "gpucheck.jsonl"
        self.rows: list[dict[str, Any]] = []

    def add(self, **row: Any) -> None:
        self.rows.append({"bench_id": self.bench_id, **row})

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in self.rows)


def check(
    results_dir: str = "results",
    budget_s: float = 480.0,
    dry_run: bool = False,
    steps: tuple[Step, ...] = STEPS,
    info: dict[str, Any] | None = None,
    cpu: bool = False,
) -> list[Outcome]:
    """Probe, then run ``steps`` within ``budget_s`` seconds (``cpu``: those with a CPU mode)."""
    info = probe() if info is None else info
    print("machine: " + json.dumps(info))
    planned = plan(steps, info, cpu)
    caps = sum(s.cap(cpu) for s, what in planned if what == "run")
    over = " (more than the budget: the last steps may be left)" if caps > budget_s else ""
    print(f"plan (budget {budget_s:.0f} s; caps of the steps to run: {caps:.0f} s{over}):")
    for s, what in planned:
        mark = f"cap {s.cap(cpu):4.0f} s" if what == "run" else f"skip: {what}"
        print(f"  {s.name:<13} {mark:<36} {s.what}")
        print(f"  {'':<13} $ {' '.join(s.command(results_dir, cpu))}")
    if dry_run:
        print("dry run: nothing was run")
        return [Outcome(s.name, "not run", detail="dry run") for s, _ in planned]
    try:
        from bench.benchmarks.harness import BenchRun

        bench: Any = BenchRun("gpucheck", results_dir)
    except ImportError as e:  # pandas or filelock missing on the device machine
        print(f"recording without pandas ({e}): {results_dir}/bench/gpucheck.jsonl")
        bench = _PlainRun(results_dir)
    log_dir = Path(results_dir) / "gpucheck" / bench.bench_id

    t0 = time.monotonic()
    outcomes: list[Outcome] = []
    for i, (s, what) in enumerate(planned):
        if what != "run":
            print(f"[{s.name}] skipped: {what}")
            outcomes.append(Outcome(s.name, "skipped", detail=what))
            continue
        left = budget_s - (time.monotonic() - t0)
        if left < s.min_s:
            rest = [p.name for p, w in planned[i:] if w == "run"]
            print(f"budget spent ({left:.0f} s left): not run: {', '.join(rest)}")
            outcomes += [Outcome(n, "not run", detail="budget spent") for n in rest]
            outcomes += [Outcome(p.name, "skipped", detail=w) for p, w in planned[i:] if w != "run"]
            break
        before, start, log = snapshot(results_dir), time.monotonic(), log_dir / f"{s.name}.log"
        status, rc = run_step(s.command(results_dir, cpu), min(s.cap(cpu), left), log, s.name)
        took = time.monotonic() - start
        detail = headline(s.name, results_dir, before, log)
        print(f"[{s.name}] {status} in {took:.0f} s: {detail}")
        outcomes.append(Outcome(s.name, status, took, rc, detail))
    keys = ("gpu", "gpu_mem_gib", "capability", "nccl_version", "triton", "dali")
    for o in outcomes:
        bench.add(**dataclasses.asdict(o), budget_s=budget_s, **{k: info.get(k) for k in keys})
    bench.save()
    m = bench.meta
    table = (
        f"# gpucheck {bench.bench_id}\n\n{m['hardware']}; git {m['git_sha']}; {m['date']}\n\n"
        f"machine: `{json.dumps(info)}`\n\n| step | status | seconds | result |\n"
        "| --- | --- | ---: | --- |\n"
        + "".join(f"| {o.step} | {o.status} | {o.seconds:.0f} | {o.detail} |\n" for o in outcomes)
    )
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir.parent / f"{bench.bench_id}.md").write_text(table)
    print("\n" + table)
    return outcomes
