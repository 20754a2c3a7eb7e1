"""The launchers: every one listed, no import cycle in bench.cluster, each launcher's own
checks, and the typed ``cluster.backend``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from bench.config import Config
from bench.launch.run import LAUNCHERS
from bench.launch.run import check_cluster as validate
from bench.launch.run import launch_workers as launch
from bench.registry import ConfigError
from tests.conftest import REPO

CLUSTER = REPO / "bench" / "cluster"


def _imports(path: Path) -> set[str]:
    """Modules of bench.cluster that ``path`` imports, anywhere in the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n.removeprefix("bench.cluster.") for n in names if n.startswith("bench.cluster.")}
    return found


def test_no_import_cycle_among_the_cluster_modules():
    mods = {p.stem for p in CLUSTER.glob("*.py") if p.stem != "__init__"}
    graph = {m: _imports(CLUSTER / f"{m}.py") & mods for m in mods}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            assert state.get(n) != 1, f"import cycle: {' -> '.join([*path, m, n])}"
            if n not in state:
                visit(n, [*path, m])
        state[m] = 2

    for m in sorted(mods):
        if m not in state:
            visit(m, [])


def test_every_launcher_is_listed():
    assert sorted(LAUNCHERS) == ["emulated", "local", "multinode"]


def _cfg(**cluster) -> Config:
    cfg = Config()
    for k, v in cluster.items():
        setattr(cfg.cluster, k, v)
    return cfg


@pytest.mark.parametrize(
    "cluster,msg",
    [
        ({"name": "slurm"}, "unknown cluster launcher 'slurm'; choose one of: emulated, local"),
        ({"nproc_per_node": 0}, "nproc_per_node must be >= 1"),
        ({"nnodes": 0}, "nnodes must be >= 1"),
        ({"name": "multinode", "nnodes": 2, "node_rank": 2}, r"node_rank=2 is outside 0\.\.1"),
        ({"name": "multinode", "nnodes": 2}, "needs cluster.rdzv_endpoint"),
        ({"name": "emulated", "nnodes": 1}, "nnodes >= 2"),
    ],
)
def test_validate_refuses_with_one_sentence(cluster, msg):
    with pytest.raises(ConfigError, match=msg):
        validate(_cfg(**cluster))


def test_validate_accepts_the_defaults_and_a_multinode_node():
    validate(_cfg())
    validate(_cfg(name="multinode", nnodes=2, node_rank=1, rdzv_endpoint="node0:29500"))


def test_launch_hands_the_cluster_config_to_the_named_spec(monkeypatch, tmp_path):
    seen = []
    spec = (lambda c, p: seen.append((c, p)) or 7, lambda c: None)
    monkeypatch.setitem(LAUNCHERS, "fake", spec)
    cfg = _cfg(name="fake")
    assert launch(cfg, tmp_path / "run.json") == 7
    assert seen == [(cfg.cluster, tmp_path / "run.json")]


def test_backend_is_a_typed_choice():
    cfg = OmegaConf.structured(Config)
    cfg.cluster.backend = "gloo"
    assert cfg.cluster.backend == "gloo" and f"{cfg.cluster.backend}" == "gloo"
    with pytest.raises(ValidationError, match=r"expected one of \[auto, nccl, gloo\]"):
        cfg.cluster.backend = "mpi"
