"""Checkpoints of a run under ``<results.dir>/checkpoints/<run_id>/``: ``epoch-NNNN/common.pt``
(rank 0), ``epoch-NNNN/rank<r>.pt`` (every rank) and the manifest ``epoch-NNNN.json``, written
last; a resume takes the newest whole one (docs/internals/train.md)."""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import time
import warnings
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bench.config import Config, to_container
from bench.registry import ConfigError
from bench.results import whole
from bench.results.events import RESUME, events_path, log_event, lost_since, read_events, run_dir
from bench.results.reserve import nearly_full
from bench.train import runtime

if TYPE_CHECKING:
    from bench.comm.state import Stateful

#: config keys that may differ between a checkpoint and the run that resumes from it: the
#: budget and outputs, which node holds which ranks (a requeued Slurm job may get its nodes
#: in another order: every rank reads its shard by its global rank), where the results are
MAY_DIFFER = tuple(
    """train.epochs train.progress train.checkpoint_every train.keep_checkpoints
    train.nan_check results.plot results.plot_sweeps cluster.max_restarts
    cluster.rdzv_timeout_s cluster.node_rank cluster.rdzv_endpoint cluster.rdzv_id
    cluster.rdzv_port cluster.local_addr comm.timeout_s results.dir""".split()
)


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    full = False
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except RuntimeError:  # torch's writer says neither ENOSPC nor the file
        if not nearly_full(tmp.parent):
            raise
        # not chained: the error's frames hold torch's open file, whose blocks would stay
        # allocated (the disk full) for as long as the error lives
        full = True
    finally:  # a full disk must not keep the partial file (and the disk full)
        tmp.unlink(missing_ok=True)
    if full:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))


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
    if not isinstance(m["world_size"], int):
        return None, "its manifest lacks fields"
    d, sizes = manifest_path.with_suffix(""), m.get("files") or {}
    names = set(sizes) | {"common.pt", *(f"rank{r}.pt" for r in range(m["world_size"]))}
    for name in sorted(names):
        p = d / name
        if not p.is_file():
            return None, f"{name} is missing"
        if name in sizes and p.stat().st_size != sizes[name]:
            return None, f"{name} has {p.stat().st_size} bytes, {sizes[name]} were saved"
        try:
            zipfile.ZipFile(p).close()  # torch.save's zip: its directory is at the end
        except (OSError, zipfile.BadZipFile) as e:
            return None, f"{name} is damaged ({e})"
    return m, None


EPOCH_NAME = re.compile(r"epoch-([0-9]+)")  # a checkpoint's folder; + ".json": its manifest


def by_epoch(paths: Iterable[Path]) -> list[Path]:
    """``epoch-N.json`` manifests by N; another name (a copy, a sync conflict) is warned of,
    never resumed from nor pruned."""
    numbered = []
    for p in paths:
        m = EPOCH_NAME.fullmatch(p.name.removesuffix(".json"))
        if m:
            numbered.append((int(m.group(1)), p))
        else:
            warnings.warn(f"{p} is not a checkpoint's name (epoch-N.json): ignored", stacklevel=2)
    return [p for _, p in sorted(numbered)]


def remove_incomplete(run_dir: Path, keep: Path | None = None) -> None:
    """Remove each checkpoint folder without its manifest but ``keep`` (no rank may write)."""
    for d in sorted(run_dir.glob("epoch-*")) if run_dir.is_dir() else []:
        named = EPOCH_NAME.fullmatch(d.name)  # a folder of another name is not ours to remove
        if named and d.is_dir() and d != keep and not d.with_suffix(".json").exists():
            shutil.rmtree(d, ignore_errors=True)


def latest(
    results_dir: str | Path, run_id: str, skipped: list[str] | None = None
) -> dict[str, Any] | None:
    """A run's newest whole checkpoint's manifest (``path`` set) or None; each newer damaged
    one is warned of, or added to ``skipped``."""
    d, m, passed = run_dir(results_dir, run_id), None, []
    for mp in reversed(by_epoch(d.glob("epoch-*.json")) if d.is_dir() else []):
        m, why = problem(mp)
        if m is not None:
            m["path"] = str(mp.with_suffix(""))
            break
        passed.append(f"{mp.with_suffix('')}: {why}")
    if skipped is not None:
        skipped.extend(passed)
    else:
        for line in passed:
            warnings.warn(f"damaged checkpoint skipped: {line}", stacklevel=2)
    return m


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_compatible(manifest: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    """Refuse to resume a checkpoint under another config (:data:`MAY_DIFFER` aside)."""
    a, b = flatten(manifest["config"]), flatten(config)
    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and k not in MAY_DIFFER)
    if diff:
        shown = ", ".join(f"{k} ({a.get(k)!r} saved, {b.get(k)!r} now)" for k in diff[:8])
        raise ConfigError(
            f"checkpoint {manifest.get('path')} was saved with another config: {shown}"
        )


def rng_state(device: torch.device) -> dict[str, Any]:
    st = np.random.get_state()
    out = {
        "torch": torch.get_rng_state(),
        "numpy": [st[0], torch.from_numpy(st[1].astype(np.int64)), *st[2:]],
        "python": random.getstate(),
    }
    if device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def set_rng_state(d: Mapping[str, Any], device: torch.device) -> None:
    torch.set_rng_state(d["torch"])
    name, keys, *rest = d["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    random.setstate(d["python"])
    if "cuda" in d and device.type == "cuda":
        torch.cuda.set_rng_state(d["cuda"], device)


def first_mismatch(now: Mapping[str, Any], saved: Mapping[str, Any]) -> str | None:
    """The first key the saved state dict lacks, holds in another shape or holds besides."""
    for k, v in now.items():
        if k not in saved:
            return f"{k} is not in the checkpoint"
        a, b = getattr(saved[k], "shape", None), getattr(v, "shape", None)
        if a != b:
            return f"{k} has shape {tuple(a or ())} in the checkpoint, {tuple(b or ())} now"
    extra = [k for k in saved if k not in now]
    return f"{extra[0]} is in the checkpoint only" if extra else None


@dataclass
class CheckpointManager:
    """One worker's checkpoints: rank 0 saves ``states`` (``common.pt``), every rank its RNG
    and ``local`` states (``rank<r>.pt``: its hook's, an outer sync's replica), the manifest
    ``progress`` last; each ``Stateful`` by its own ``state_dict``."""

    cfg: Config
    run: dict[str, Any]
    _: KW_ONLY
    rank: int
    world: int
    device: torch.device
    states: Mapping[str, Stateful | None]
    progress: Stateful
    local: Mapping[str, Stateful | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.local = {k: v for k, v in self.local.items() if v is not None}
        self.root = run_dir(self.cfg.results.dir, self.run["run_id"])

    def save(self, barrier: Callable[[], None]) -> Path:
        """Every rank: this epoch's checkpoint; after ``barrier()`` (every shard written) rank 0
        writes the manifest and drops the oldest beyond ``keep_checkpoints``."""
        p = self.progress.state_dict()
        d = self.root / f"epoch-{p['epoch']:04d}"
        d.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            common = {k: v.state_dict() if v is not None else None for k, v in self.states.items()}
            _atomic_save(common, d / "common.pt")
        mine = {"rank": self.rank, "rng": rng_state(self.device)}
        mine.update({k: v.state_dict() for k, v in self.local.items()})
        _atomic_save(mine, d / f"rank{self.rank}.pt")
        barrier()
        if self.rank == 0:
            # p: epoch, step, train_time_s, status, curve, evals; every shard is in place
            manifest = {"run": self.run, "config": to_container(self.cfg), **p}
            manifest.update(world_size=self.world, saved_at=time.time(), files=shard_sizes(d))
            whole.write(d.with_suffix(".json"), json.dumps(manifest, indent=1))
            keep = max(1, self.cfg.train.keep_checkpoints)
            for old in by_epoch(self.root.glob("epoch-*.json"))[:-keep]:
                old.unlink(missing_ok=True)
                shutil.rmtree(old.with_suffix(""), ignore_errors=True)
            remove_incomplete(self.root, keep=d)  # every rank is past the barrier: none writes
        return d

    def load(self, manifest: Mapping[str, Any], lost_s: float = 0.0) -> None:
        """Every rank: restore a checkpoint, ``lost_s`` added to its training time."""
        check_compatible(manifest, to_container(self.cfg))
        if manifest["world_size"] != self.world:
            raise ConfigError(
                f"checkpoint {manifest['path']} has {manifest['world_size']} workers, "
                f"this run {self.world}"
            )
        d = Path(manifest["path"])
        common = torch.load(d / "common.pt", map_location=self.device, weights_only=True)
        mine = torch.load(d / f"rank{self.rank}.pt", map_location=self.device, weights_only=True)
        for key, obj in self.states.items():
            if obj is not None and common[key] is not None:
                try:
                    obj.load_state_dict(common[key])
                except (RuntimeError, KeyError, ValueError) as e:  # one line, the key first
                    why = first_mismatch(obj.state_dict(), common[key]) or str(e).splitlines()[0]
                    raise ConfigError(f"checkpoint {d} does not fit this run's {key}: {why}") from e
        for key, obj in self.local.items():  # after common.pt: this rank's own state wins
            if mine.get(key) is not None:  # (the hook regroups DDP's first buckets itself)
                obj.load_state_dict(mine[key])
        set_rng_state(mine["rng"], self.device)
        self.progress.load_state_dict(
            {**manifest, "train_time_s": manifest["train_time_s"] + lost_s}
        )

    def resume(self) -> None:
        """Continue from the run's last checkpoint (an elastic restart or by hand); the time from
        it to the failure that lost it counts as training time."""
        run_id = self.run["run_id"]
        # rank 0 decides for all (an agent whose workers did not fail counts no restart)
        manifest = runtime.broadcast_object(latest(self.cfg.results.dir, run_id))
        by = "hand" if self.run.get("resume") else "restart" if manifest is not None else None
        events = events_path(self.cfg.results.dir, run_id)
        if manifest is not None:
            self.load(manifest, lost_s=lost_since(read_events(events), manifest["saved_at"]))
        if by and self.rank == 0:
            epoch = manifest["epoch"] if manifest is not None else 0
            log_event(events, kind=RESUME, by=by, epoch=epoch)
            print(f"resuming run {run_id} from epoch {epoch} ({by})", flush=True)
