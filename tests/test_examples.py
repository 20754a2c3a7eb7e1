"""The examples under ``examples/``, each run as a user would, under torchrun with 2 gloo
processes on CPU: the plain script killed after its checkpoint and restarted continues
bit for bit like the uninterrupted run (hitopk, mstopk, PowerSGD); the PyTorch Lightning
and Accelerate examples train to their target (skipped when those are not installed).

Bit-for-bit here compares two runs of the same computation on this machine, never a
stored number."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def _torchrun(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    return subprocess.run(
        [*cmd, str(EXAMPLES / script), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _history(out: Path) -> list[list[dict]]:
    return [json.loads((out / f"history-rank{r}.json").read_text()) for r in range(2)]


def _resume(tmp_path: Path, hook: str, *extra: str) -> tuple[list, list]:
    """(uninterrupted, killed after step 4 and resumed) histories, both ranks."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    p = _torchrun("torchrun_resume.py", "--hook", hook, "--steps", "8", "--out", str(full))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    run = ("torchrun_resume.py", "--hook", hook, "--steps", "8", "--out", str(cut))
    p = _torchrun(*run, "--save-at", "4", "--kill")
    assert p.returncode != 0 and "SIGKILL" in p.stdout + p.stderr, p.stderr[-3000:]
    assert [h["step"] for h in _history(cut)[0]] == [1, 2, 3, 4]  # it died at once
    p = _torchrun(*run, "--resume", *extra)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return _history(full), _history(cut)


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["mstopk", "hitopk", "powersgd"])
def test_a_killed_torchrun_script_resumes_bit_for_bit(tmp_path: Path, hook: str) -> None:
    """Slow: three launches of 2 workers, about a minute on a loaded 2-core machine (the
    same resume in one process, into another bucket layout: ``test_comm_state.py``)."""
    want, got = _resume(tmp_path, hook)
    for rank in range(2):
        assert [h["step"] for h in got[rank]] == list(range(1, 9))
        assert got[rank] == want[rank]  # every step's loss and weights


@pytest.mark.slow
def test_without_the_hook_state_the_resume_differs(tmp_path: Path) -> None:
    """The control: restoring only the model and optimizer changes the steps after the
    restart, so the test above sees the hook state come back."""
    want, got = _resume(tmp_path, "mstopk", "--without-hook-state")
    assert got[0][:4] == want[0][:4] and got[0][4:] != want[0][4:]


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[test]' installs it)")


@pytest.mark.slow
def test_the_lightning_example_trains_to_its_target() -> None:
    """Slow: importing Lightning in two workers takes about a minute on a loaded machine."""
    _needs("lightning")
    p = _torchrun("lightning_ddp.py", "--hook", "hitopk", "--epochs", "1", "--target", "0.9")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "hitopk: val_acc" in p.stdout and " 0 hook steps" not in p.stdout, p.stdout


def test_the_accelerate_example_trains_to_its_target() -> None:
    _needs("accelerate")
    p = _torchrun("accelerate_ddp.py", "--hook", "powersgd", "--target", "0.9")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "powersgd: accuracy" in p.stdout and " 0 hook steps" not in p.stdout, p.stdout


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("method", ["mstopk", "hitopk"])
def test_the_docs_plain_script_trains_without_a_warning(tmp_path: Path, method: str) -> None:
    """docs/hooks.md's plain script, as a user copies it, with 2 gloo processes by
    torch.multiprocessing: the loss falls, the replicas agree, each rank saves its hook
    state, and nothing is warned about (DDP's rebuilt buckets keep the residuals)."""
    text = (REPO / "docs" / "hooks.md").read_text()
    start = text.index("```python\n# plain_script.py") + len("```python\n")
    script = tmp_path / "plain_script.py"
    script.write_text(text[start : text.index("```", start)])
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env["MASTER_PORT"] = str(_free_port())
    p = subprocess.run(
        [sys.executable, str(script), method],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Warning" not in p.stderr, p.stderr[-3000:]
    losses = [float(ln.rsplit(" ", 1)[1]) for ln in p.stdout.splitlines() if "loss" in ln]
    assert len(losses) == 2 and losses[1] < 0.7 * losses[0], p.stdout
    assert "replicas equal: True" in p.stdout
    assert (tmp_path / "hook-rank0.pt").is_file() and (tmp_path / "hook-rank1.pt").is_file()


def test_make_hook_names_its_options() -> None:
    """A misspelt option is one error naming the closest; a hook's errors name make_hook's
    keywords, not the suite's config keys."""
    from bench.comm import make_hook
    from bench.comm.topology import check_hierarchical
    from bench.registry import ConfigError

    with pytest.raises(TypeError, match="unknown option 'densty'; did you mean density?"):
        make_hook("mstopk", densty=0.01)
    with pytest.raises(ConfigError, match=r"^density must be in \(0, 1\]"):
        make_hook("mstopk", density=2.0)
    with pytest.raises(ConfigError) as e:
        check_hierarchical(1)
    assert "procs_per_node=1" in str(e.value) and "comm." not in str(e.value)
    assert "cluster." not in str(e.value)
    for option in ("density", "procs_per_node", "warmup_steps", "value_dtype"):
        assert f"``{option}=" in make_hook.__doc__
