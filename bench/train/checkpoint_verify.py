"""Which checkpoint of a run to resume from: the newest one that is whole.

A checkpoint is ``epoch-NNNN.json`` (the manifest, written last) and the shards of
``epoch-NNNN/``.  One damaged by a crash, a full disk or a bad copy (a truncated
manifest, a truncated or missing shard) must not end a resume in tracebacks when an
older one is intact: :func:`choose` verifies each, newest first, and returns the first
whole one with what it skipped and why.

Verified: the manifest parses as a JSON object with the fields a resume reads; every
shard is present (``common.pt`` and ``rank<r>.pt`` for each of ``world_size`` ranks),
with the size the manifest recorded (``files``, written since these checks exist) and
readable as the zip archive ``torch.save`` writes (its directory sits at the end, so a
truncated shard fails here without reading the whole file).
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

NEEDED = ("config", "epoch", "step", "world_size", "train_time_s", "curve", "status", "run")


def shard_sizes(d: Path) -> dict[str, int]:
    """The manifest's ``files``: every shard of checkpoint folder ``d`` and its size."""
    return {p.name: p.stat().st_size for p in sorted(d.glob("*.pt"))}


def problem(manifest_path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the manifest, None) for a whole checkpoint, (None, what is wrong) otherwise."""
    try:
        m = json.loads(manifest_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"its manifest does not parse ({e})"
    if not isinstance(m, dict) or any(k not in m for k in NEEDED):
        return None, "its manifest lacks fields"
    d = manifest_path.with_suffix("")
    try:
        world = int(m["world_size"])
    except (TypeError, ValueError):
        return None, "its manifest lacks fields"
    sizes = m.get("files") or {}
    names = set(sizes) | {"common.pt", *(f"rank{r}.pt" for r in range(world))}
    for name in sorted(names):
        p = d / name
        if not p.is_file():
            return None, f"{name} is missing"
        if name in sizes and p.stat().st_size != sizes[name]:
            return None, f"{name} has {p.stat().st_size} bytes, {sizes[name]} were saved"
        try:
            with zipfile.ZipFile(p):
                pass
        except (OSError, zipfile.BadZipFile) as e:
            return None, f"{name} is damaged ({e})"
    return m, None


def choose(run_dir: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """The manifest of the newest whole checkpoint under ``run_dir`` (None if there is
    none) with ``path`` set, and one line for each newer one skipped."""
    manifests = sorted(run_dir.glob("epoch-*.json")) if run_dir.is_dir() else []
    skipped: list[str] = []
    for mp in reversed(manifests):
        m, why = problem(mp)
        if m is not None:
            m["path"] = str(mp.with_suffix(""))
            return m, skipped
        skipped.append(f"{mp.with_suffix('')}: {why}")
    return None, skipped


def remove_incomplete(run_dir: Path, keep: Path | None = None) -> list[Path]:
    """Remove each checkpoint folder without its manifest (a save that failed part way,
    on a full disk: its shards would keep the disk full), except ``keep`` (the one being
    written); the folders removed.  Call it only when no rank is writing another."""
    gone = []
    for d in sorted(run_dir.glob("epoch-*")) if run_dir.is_dir() else []:
        if d.is_dir() and d != keep and not d.with_suffix(".json").exists():
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d)
    return gone
