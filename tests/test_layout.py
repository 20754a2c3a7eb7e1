"""The layout of the library: no import cycle, the folders of ``bench`` on floors that
import only downwards (imports under ``TYPE_CHECKING`` count), few loose files, every
module importable on its own and saying its one job, short loop functions, a run path
through at most ten files, no reference outside the repository, ruff-clean."""

from __future__ import annotations

import ast
import os
import re
import shutil
import socket
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(BENCH.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """bench modules that ``path`` imports anywhere (module level, inside functions, under
    ``if TYPE_CHECKING:``: a type named from a higher floor is a dependency too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from bench.x import y``: the module bench.x.y when it is one, else bench.x
            names = [f"{node.module}.{a.name}" for a in node.names]
            names = [n if n in MODULES else node.module for n in names]
        else:
            continue
        out.update(n for n in names if n in MODULES)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_inside_bench() -> None:
    graph = {}
    for name, path in MODULES.items():
        deps = _imports(path) - {name}
        # a package may import its own modules; a module importing its package is the cycle
        graph[name] = deps
    assert _cycles(graph) == []


def test_cycle_detector_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The floors of bench, lowest first: a folder (or loose module) imports only those on the
# floors below it, never one on its own floor or above.  The one statement of the order:
# docs/architecture.md's and docs/layout.md's trees describe the folders, this list ranks them.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("registry",),  # named factories and ConfigError: everything registers here
    ("models", "data", "comm", "optim"),  # the concerns of one training step, apart
    ("sync",),  # how the replicas meet: every step, or every H steps through torchft
    ("results",),  # records, curves, the event log, run outputs: written by both halves
    ("cluster",),  # launchers and network emulation: start the worker processes
    ("methods",),  # the comparison methods, one spec each: overrides, knobs, price, colour
    ("config",),  # the run's structured config, assembled from every group's schema
    ("train", "benchmarks"),  # the worker side of a run; measurements beside it
    ("launch",),  # the launcher side: validate, launch, record what the workers did not
    ("sweeps",),  # many runs through the launcher
    ("report", "gpucheck"),  # read what the others recorded; run benchmarks and runs
)
MAX_LOOSE = 4  # files directly in bench/, __init__.py included


def _unit(module: str) -> str:
    """The folder (or loose module) of ``bench`` that holds ``module``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _floor(unit: str) -> int:
    return next(i for i, floor in enumerate(LAYERS) if unit in floor)


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a module from a folder on its own floor or above (``a -> b``)."""
    return sorted(
        f"{a} -> {b}"
        for a, deps in graph.items()
        for b in deps
        if _unit(a) and _unit(b) and _unit(a) != _unit(b) and _floor(_unit(b)) >= _floor(_unit(a))
    )


def test_every_folder_of_bench_has_a_floor() -> None:
    units = {_unit(n) for n in MODULES} - {"", "__init__"}
    listed = [u for floor in LAYERS for u in floor]
    assert sorted(units) == sorted(listed) and len(set(listed)) == len(listed)


def test_no_import_from_a_lower_floor_to_a_higher_one() -> None:
    assert _upward({name: _imports(path) for name, path in MODULES.items()}) == []


def test_the_library_imports_nothing_of_a_run() -> None:
    """results, comm and optim never reach up into the run (train, launch, sweeps,
    report): a component is handed plain values or the objects it needs."""
    low, high = ("results", "comm", "optim"), ("train", "launch", "sweeps", "report")
    up = [
        f"{a} -> {b}"
        for a, path in MODULES.items()
        if _unit(a) in low
        for b in _imports(path)
        if _unit(b) in high
    ]
    assert up == []


def test_the_floor_check_finds_an_upward_import() -> None:
    graph = {
        "bench.results.events": {"bench.registry"},  # down: fine
        "bench.train.loop": {"bench.train.checkpoint", "bench.results.records"},  # fine
        "bench.results.mllog": {"bench.train.runtime"},  # up
        "bench.data.cache": {"bench.models.config"},  # sideways, same floor
    }
    assert _upward(graph) == [
        "bench.data.cache -> bench.models.config",
        "bench.results.mllog -> bench.train.runtime",
    ]


def test_few_loose_files_in_bench() -> None:
    loose = sorted(p.name for p in BENCH.glob("*.py"))
    assert len(loose) <= MAX_LOOSE, loose


_IMPORT_EACH = """
import importlib, os, sys, traceback
import torch, numpy, pandas, omegaconf, hydra  # third-party, loaded once before forking
import matplotlib, scipy.stats, torchvision
failed, running = [], {}
def reap():
    pid, status = os.wait()
    name = running.pop(pid)
    if status:
        failed.append(name)
for name in sys.argv[1:]:
    if len(running) >= max(2, len(os.sched_getaffinity(0))):
        reap()
    pid = os.fork()
    if pid == 0:  # a child with no bench module loaded imports just this one
        try:
            importlib.import_module(name)
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
    running[pid] = name
while running:
    reap()
print("FAILED", *failed)
sys.exit(1 if failed else 0)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_every_module_imports_on_its_own() -> None:
    p = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, *MODULES],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]


def test_every_module_says_its_one_job() -> None:
    """Modules are cut by cohesion, not by size: each opens with what it is for."""
    silent = [n for n, p in MODULES.items() if not ast.get_docstring(ast.parse(p.read_text()))]
    assert silent == []


def test_training_loop_functions_are_short() -> None:
    tree = ast.parse((BENCH / "train" / "loop.py").read_text())
    sizes = {
        f.name: f.end_lineno - f.lineno + 1
        for f in ast.walk(tree)
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    assert {n: k for n, k in sizes.items() if k > 60} == {}


_OUTSIDE = re.compile(r"\.\./shared|PAPER\.md|ROADMAP\.md|\bissues? #?\d+\b", re.IGNORECASE)


def test_no_reference_outside_the_repository() -> None:
    files = [*BENCH.rglob("*.py"), *(REPO / "reproduce").rglob("*.py"), *(REPO / "conf").rglob("*")]
    hits = [
        f"{p.relative_to(REPO)}:{i}: {line.strip()}"
        for p in files
        if p.is_file()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if _OUTSIDE.search(line)
    ]
    assert hits == []


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is in the test extra")
@pytest.mark.parametrize("args", [["check"], ["format", "--check"]])
def test_ruff(args: list[str]) -> None:
    p = subprocess.run(["ruff", *args, "."], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]


# ---------------------------------------------------------------------------------------
# the run path: from ``python -m reproduce train`` to the first training step


RUN_PATH_MAX = 10


def _project_files(frames: list[traceback.FrameSummary]) -> set[str]:
    """The files of bench/ and reproduce/ among ``frames``, relative to the repository."""
    out = set()
    for f in frames:
        p = Path(f.filename).resolve()
        if p.is_relative_to(REPO) and p.relative_to(REPO).parts[0] in ("bench", "reproduce"):
            out.add(p.relative_to(REPO).as_posix())
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_run_path_touches_at_most_ten_files(tmp_path: Path, monkeypatch) -> None:
    """The project files on the call stack of the launcher when it starts the workers,
    and of the worker when ``train_step`` first runs: one tiny run, launcher and worker
    in this process (a world of one, gloo).  docs/layout.md lists them."""
    import torch
    import torch.distributed.launcher.api as api

    import bench.train.__main__ as worker
    import reproduce.train
    from bench.train import loop
    from reproduce.__main__ import main

    stacks: dict[str, list[traceback.FrameSummary]] = {}

    def elastic_launch(config, entrypoint):  # the elastic agent, as the worker it starts
        def start(*args: str) -> None:
            stacks["launcher"] = traceback.extract_stack()
            env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
            for k, v in {
                **env,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(_free_port()),
            }.items():
                monkeypatch.setenv(k, v)
            assert worker.main(list(args[args.index("--config") :])) == 0

        return start

    first_step = loop.train_step

    def train_step(s, batch):
        stacks.setdefault("worker", traceback.extract_stack())
        return first_step(s, batch)

    monkeypatch.setattr(api, "elastic_launch", elastic_launch)
    monkeypatch.setattr(loop, "train_step", train_step)
    monkeypatch.setattr(reproduce.train, "PRECHECKED", False)
    monkeypatch.setattr(sys, "argv", ["reproduce"])
    for k in ("OMP_NUM_THREADS", "BENCH_EVENTS"):
        monkeypatch.setenv(k, "1")
    threads = torch.get_num_threads()
    try:
        main(
            ["train", f"results.dir={tmp_path}", "model.width=4", "train.max_steps_per_epoch=1"]
            + ["train.epochs=1", "train.progress=false", "train.checkpoint_every=0"]
            + ["data.batch_size=32", "data.eval_batch_size=512", "results.plot=false"]
            + ["cluster.nproc_per_node=1", "cluster.backend=gloo", "cluster.threads_per_worker=1"]
        )
    finally:
        torch.set_num_threads(threads)
    frames = stacks["worker"]
    entry = next(i for i, f in enumerate(frames) if f.filename == worker.__file__)
    on_path = _project_files(stacks["launcher"]) | _project_files(frames[entry:])
    assert len(on_path) <= RUN_PATH_MAX, sorted(on_path)
    listed = (REPO / "docs" / "layout.md").read_text()
    assert [f for f in sorted(on_path) if f"`{f}`" not in listed] == []
