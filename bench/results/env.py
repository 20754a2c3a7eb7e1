"""Who ran what where: hardware, versions and git sha, for records and benchmark rows."""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def hardware() -> str:
    """GPU name and count when CUDA is visible, else the CPU."""
    import torch  # deferred: seconds to load, and this module is read without it

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        return f"{n}x {torch.cuda.get_device_name(0)}; host {cpu_model()} ({cores} cores)"
    return f"CPU {cpu_model()} ({cores} cores), no GPU"


@functools.lru_cache(maxsize=1)
def git_sha() -> str | None:
    """The checkout's commit (12 hex digits, ``-dirty`` with changes outside ``results/``);
    ``BENCH_GIT_SHA`` wins, for a checkout copied without its git history."""
    if os.environ.get("BENCH_GIT_SHA"):
        return os.environ["BENCH_GIT_SHA"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            # results/ holds outputs, not code: a sweep's own records must not mark the
            # runs after its first as dirty
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!results"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict[str, str | None]:
    import torch

    v: dict[str, str | None] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
    }
    try:
        import nvidia.dali as dali  # optional

        v["dali"] = dali.__version__
    except Exception:  # noqa: BLE001 - DALI is optional
        v["dali"] = None
    return v
