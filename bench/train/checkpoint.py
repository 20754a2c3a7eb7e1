"""Checkpoints of a training run and its event log (elastic restarts, resumes).

Layout, under ``<results.dir>/checkpoints/<run_id>/``::

    epoch-0003/common.pt   rank 0: model, optimizer (its own state_dict format, whatever the
                           update mode), LR schedule, gradient scaler
    epoch-0003/rank<r>.pt  every rank: its comm hook's state (``state_dict()``: residuals,
                           counters, bucket layout, by parameter name), RNG states
    epoch-0003.json        rank 0, written last (so a checkpoint without it is incomplete):
                           config, epoch, step, training time, the curve so far, status
    events.jsonl           the run's event log (:mod:`bench.results.events`)

Every file is written to a temporary name and renamed.  The sampler position is the
epoch (loaders order their samples by (seed, epoch)); checkpoints are taken at epoch ends.
Loading uses ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bench.config import to_container
from bench.registry import ConfigError
from bench.results.events import RESUME, events_path, log_event, lost_since, read_events, run_dir
from bench.results.reserve import nearly_full
from bench.train import runtime
from bench.train.checkpoint_verify import choose, remove_incomplete, shard_sizes

if TYPE_CHECKING:  # the loop imports this module; the state's type is only named here
    from bench.train.loop import TrainState

#: config keys that may differ between a checkpoint and the run that resumes from it
MAY_DIFFER = (
    "train.epochs",
    "train.progress",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.nan_check",
    "results.plot",
    "results.plot_sweeps",
    "cluster.max_restarts",
    "cluster.rdzv_timeout_s",
    "cluster.rdzv_endpoint",
    "cluster.rdzv_id",
    "cluster.rdzv_port",
    "comm.timeout_s",
    # where the results are, not what runs: a trailing slash, or a results folder moved
    # (the checkpoint is found through it, by run id)
    "results.dir",
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


def _atomic_json(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(obj, indent=1))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def latest(
    results_dir: str | Path, run_id: str, skipped: list[str] | None = None
) -> dict[str, Any] | None:
    """The manifest of the newest complete, intact checkpoint of a run (None when there is
    none); each newer damaged one is skipped with a warning, or added to ``skipped`` for
    the caller to report."""
    m, passed = choose(run_dir(results_dir, run_id))
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


def differing_keys(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Config keys whose values differ (those of :data:`MAY_DIFFER` aside)."""
    a, b = flatten(saved), flatten(current)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and k not in MAY_DIFFER)


def check_compatible(manifest: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    """Refuse to resume a checkpoint under a config it was not saved with."""
    diff = differing_keys(manifest["config"], config)
    if diff:
        a, b = flatten(manifest["config"]), flatten(config)
        shown = ", ".join(f"{k} ({a.get(k)!r} saved, {b.get(k)!r} now)" for k in diff[:8])
        raise ConfigError(
            f"checkpoint {manifest.get('path')} was saved with another config: {shown}"
        )


# ---------------------------------------------------------------------------------------
# state of one worker


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


def rank_state(s: TrainState) -> dict[str, Any]:
    hook = s.comm.state  # one process has no hook: a stand-in without state
    return {
        "rank": s.rank,
        "rng": rng_state(s.device),
        "hook": hook.state_dict() if hasattr(hook, "state_dict") else None,
    }


def common_state(s: TrainState) -> dict[str, Any]:
    return {
        "model": s.model.state_dict(),
        "optimizer": s.optimizer.state_dict(),
        "scheduler": s.scheduler.state_dict(),
        "scaler": s.scaler.state_dict() if s.scaler is not None else None,
    }


def save(s: TrainState, barrier: Callable[[], None]) -> Path:
    """Every rank: write this epoch's checkpoint of ``s`` (a :class:`bench.train.loop.TrainState`);
    rank 0 completes it with the manifest and drops the oldest beyond ``keep_checkpoints``.
    ``barrier()`` waits for every rank's shard."""
    cfg = s.cfg
    root = run_dir(cfg.results.dir, s.run["run_id"])
    d = root / f"epoch-{s.epoch:04d}"
    d.mkdir(parents=True, exist_ok=True)
    if s.rank == 0:
        _atomic_save(common_state(s), d / "common.pt")
    _atomic_save(rank_state(s), d / f"rank{s.rank}.pt")
    barrier()
    if s.rank == 0:
        manifest = {
            "run": s.run,
            "config": to_container(cfg),
            "epoch": s.epoch,
            "step": s.step,
            "world_size": s.world,
            "train_time_s": s.clock.elapsed,
            "status": s.status,
            "saved_at": time.time(),
            "curve": s.curve,
            "files": shard_sizes(d),  # every rank's shard is in place (the barrier)
            "evals": s.evals,  # sub-epoch evaluations so far (train.eval_every_steps)
        }
        _atomic_json(manifest, d.with_suffix(".json"))
        for old in sorted(root.glob("epoch-*.json"))[: -max(1, cfg.train.keep_checkpoints)]:
            old.unlink(missing_ok=True)
            shutil.rmtree(old.with_suffix(""), ignore_errors=True)
        remove_incomplete(root, keep=d)  # every rank is past the barrier: none writes
    return d


def load(s: TrainState, manifest: Mapping[str, Any]) -> None:
    """Every rank: restore ``s`` from a checkpoint (the model, optimizer, schedule and
    scaler rank 0 saved; this rank's residuals and RNG states; clock, curve, position)."""
    check_compatible(manifest, to_container(s.cfg))
    if manifest["world_size"] != s.world:
        raise ConfigError(
            f"checkpoint {manifest['path']} has {manifest['world_size']} workers, "
            f"this run {s.world}"
        )
    d = Path(manifest["path"])
    common = torch.load(d / "common.pt", map_location=s.device, weights_only=True)
    mine = torch.load(d / f"rank{s.rank}.pt", map_location=s.device, weights_only=True)
    s.model.load_state_dict(common["model"])
    s.optimizer.load_state_dict(common["optimizer"])
    s.scheduler.load_state_dict(common["scheduler"])
    if s.scaler is not None and common["scaler"] is not None:
        s.scaler.load_state_dict(common["scaler"])
    if mine["hook"] is not None and hasattr(s.comm.state, "load_state_dict"):
        # the hook regroups DDP's first buckets into the saved ones: no settling step
        s.comm.state.load_state_dict(mine["hook"])
    set_rng_state(mine["rng"], s.device)
    s.clock.load_state_dict({"elapsed": manifest["train_time_s"]})
    s.curve = [dict(r) for r in manifest["curve"]]
    s.evals = [dict(e) for e in manifest.get("evals", [])]  # older checkpoints have none
    s.epoch, s.step, s.status = manifest["epoch"], manifest["step"], manifest["status"]


def resume(s: TrainState) -> None:
    """Continue from the run's last checkpoint after an elastic restart or by hand.

    The training clock counts the work being repeated: the time from the checkpoint to
    the failure (or the stop) that lost it is added back."""
    # a new run's id has no checkpoint yet: one exists after a restart or for a resume;
    # rank 0 decides for all (an agent whose workers did not fail counts no restart)
    manifest = runtime.broadcast_object(latest(s.cfg.results.dir, s.run["run_id"]))
    by = "hand" if s.run.get("resume") else "restart" if manifest is not None else None
    events = events_path(s.cfg.results.dir, s.run["run_id"])
    if manifest is not None:
        load(s, manifest)
        lost = lost_since(read_events(events), manifest["saved_at"])
        s.clock.load_state_dict({"elapsed": s.clock.elapsed + lost})
    if by and s.rank == 0:
        epoch = s.epoch if manifest is not None else 0
        log_event(events, kind=RESUME, by=by, epoch=epoch)
        print(f"resuming run {s.run['run_id']} from epoch {epoch} ({by})", flush=True)
