"""The layout of the library: no import cycle, every module importable on its own, short
files and functions, no reference outside the repository, ruff-clean."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(BENCH.rglob("*.py"))}


def _type_checking_only(tree: ast.Module) -> set[ast.AST]:
    """The import statements under ``if TYPE_CHECKING:``: they name types for a checker and
    never run, so they are no dependency (a module may name the type of a higher layer's
    object it is handed, such as the loop's ``TrainState``)."""
    out: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {n for b in node.body for n in ast.walk(b)}
    return out


def _imports(path: Path) -> set[str]:
    """bench modules that ``path`` imports anywhere (module level or inside functions),
    those under ``if TYPE_CHECKING:`` aside."""
    out: set[str] = set()
    tree = ast.parse(path.read_text())
    typing_only = _type_checking_only(tree)
    for node in ast.walk(tree):
        if node in typing_only:
            continue
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


_IMPORT_EACH = """
import importlib, os, sys, traceback
import torch, numpy, pandas, omegaconf, hydra  # third-party, loaded once before forking
failed = []
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:  # a child with no bench module loaded imports just this one
        try:
            importlib.import_module(name)
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    if status:
        failed.append(name)
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


def test_no_library_file_over_500_lines() -> None:
    long = {n: len(p.read_text().splitlines()) for n, p in MODULES.items()}
    assert {n: k for n, k in long.items() if k > 500} == {}


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
