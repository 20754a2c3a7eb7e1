"""A first run leaves the repository as it was: every default output path of a run (and
of the commands that write) is git-ignored, and the committed reference results are
written only when named."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs a git checkout"
)


def _ignored(path: str) -> bool:
    p = subprocess.run(
        ["git", "check-ignore", "-q", "--no-index", path], cwd=REPO, capture_output=True
    )
    return p.returncode == 0


def _compose(*overrides: str):
    from hydra import compose, initialize_config_dir

    from reproduce.train import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def test_default_outputs_are_ignored() -> None:
    cfg = _compose("experiment=dawnbench_digits")
    res = str(cfg.results.dir)
    assert not Path(res).is_absolute() and res != "results"
    for sub in ("runs.jsonl", "curves/x.csv", "figures/x_tta.png", "dawnbench/x.json",
                "mllog/x.log", "checkpoints/x/epoch-0001.json", "translations/x.txt",
                "bench/topk.csv", "ablation/a.csv", "scaling/s.csv"):  # fmt: skip
        assert _ignored(f"{res}/{sub}"), sub
    for d in (str(cfg.hydra.run.dir), str(cfg.hydra.sweep.dir)):
        assert d.startswith(f"{res}/"), d  # Hydra's output under the results directory
        assert _ignored(f"{d}/.hydra/config.yaml"), d


def test_naming_the_reference_results_keeps_hydra_output_ignored() -> None:
    cfg = _compose("results.dir=results")
    run_dir = str(cfg.hydra.run.dir)
    assert run_dir.startswith("results/hydra/") and _ignored(f"{run_dir}/train.log")
    assert not _ignored("results/runs.jsonl")  # the reference record itself is tracked


def test_every_writing_command_defaults_to_the_ignored_directory() -> None:
    from reproduce import _cli, ablation, scaling

    assert _cli.RESULTS == str(_compose().results.dir)
    for parser in (ablation._parser(), scaling._parser()):
        assert parser.get_default("results_dir") == _cli.RESULTS
    for cmd in ("bench", "gpucheck", "figures"):
        text = (REPO / "reproduce" / f"{cmd}.py").read_text()
        assert "default=RESULTS" in text or "ap.results_dir(" in text, cmd


@pytest.mark.slow
def test_dawnbench_in_a_fresh_clone_leaves_git_status_clean(tmp_path: Path) -> None:
    """The committed tree, cloned, one short ``dawnbench`` run: ``git status`` stays
    empty (the uncommitted changes of this checkout are not in the clone)."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    env = dict(os.environ, PYTHONPATH=str(clone), PYTHONUNBUFFERED="1")
    p = subprocess.run(
        [sys.executable, "-m", "reproduce", "dawnbench", "train.epochs=1"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert (clone / "runs" / "runs.jsonl").is_file()
    # it ends with the reference record of its recipe and one next command
    tail = p.stdout.splitlines()[-3:]
    assert tail[0].startswith("best ") and "held-out images" in tail[0], tail
    assert tail[1].startswith("reference: ") and tail[2].startswith("next: python -m reproduce ")
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=clone,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert status == "", status
