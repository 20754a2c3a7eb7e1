"""Checkpoints of a training run and its event log (elastic restarts, resumes).

Layout, under ``<results.dir>/checkpoints/<run_id>/``::

    epoch-0003/common.pt   rank 0: model, optimizer (its own state_dict format, whatever the
                           update mode), LR schedule, gradient scaler
    epoch-0003/rank<r>.pt  every rank: its error-feedback residuals, RNG states, the comm
                           hook's step counter
    epoch-0003.json        rank 0, written last (so a checkpoint without it is incomplete):
                           config, epoch, step, training time, the curve so far, status
    events.jsonl           one line per worker failure seen by an elastic agent, per resume

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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.registry import ConfigError

#: config keys that may differ between a checkpoint and the run that resumes from it
MAY_DIFFER = (
    "train.epochs",
    "train.progress",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.nan_check",
    "results.plot",
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

EVENTS_ENV = "BENCH_EVENTS"  # where an elastic agent notes worker failures


def run_dir(results_dir: str | Path, run_id: str) -> Path:
    return Path(results_dir) / "checkpoints" / run_id


def events_path(results_dir: str | Path, run_id: str) -> Path:
    return run_dir(results_dir, run_id) / "events.jsonl"


def log_event(path: str | Path, **fields: Any) -> None:
    """Append one event line (one ``write`` of a short line with O_APPEND: never torn)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"time": time.time(), **fields}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_events(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def restarts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The record's ``restarts``: each elastic restart (the first worker failure that
    caused it, as any node's agent saw it) and the epoch its group resumed from."""
    out: list[dict[str, Any]] = []
    pending: dict[str, Any] | None = None
    for e in events:
        kind = e.get("kind")
        if kind == "failure" and e.get("restarts_left", 0) > 0 and pending is None:
            keep = ("time", "failed_rank", "exit_code")
            pending = {**{k: e.get(k) for k in keep}, "epoch_resumed_from": None}
        elif kind == "resume" and pending is not None:
            if e.get("by") == "restart":
                pending["epoch_resumed_from"] = e.get("epoch")
            out.append(pending)
            pending = None
    return out + ([pending] if pending is not None else [])


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    full = False
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except RuntimeError:  # torch's writer says neither ENOSPC nor the file
        from bench.results.reserve import nearly_full

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
    from bench.checkpoint_verify import choose

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


def _param_names(model: torch.nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def _stable(key: Any, names: Mapping[int, str]) -> Any:
    """A bucket key with parameter ids replaced by names (ids differ between processes)."""
    if isinstance(key, tuple):
        return tuple(_stable(k, names) for k in key)
    if isinstance(key, int) and key in names:
        return f"param:{names[key]}"
    return key


def _local(key: Any, ids: Mapping[str, int]) -> Any:
    if isinstance(key, tuple):
        return tuple(_local(k, ids) for k in key)
    if isinstance(key, str) and key.startswith("param:"):
        return ids.get(key[6:], -1)
    return key


def _memory(comm: Any) -> Any:
    return getattr(getattr(getattr(comm, "state", None), "comm", None), "memory", None)


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


def rank_state(s: Any) -> dict[str, Any]:
    mem = _memory(s.comm)
    names = _param_names(s.model)
    return {
        "rank": s.rank,
        "rng": rng_state(s.device),
        "residuals": mem.state_dict(lambda k: _stable(k, names)) if mem is not None else [],
        "comm_step": int(getattr(s.comm.state, "step", 0)),
    }


def common_state(s: Any) -> dict[str, Any]:
    return {
        "model": s.model.state_dict(),
        "optimizer": s.optimizer.state_dict(),
        "scheduler": s.scheduler.state_dict(),
        "scaler": s.scaler.state_dict() if s.scaler is not None else None,
    }


def save(s: Any, barrier: Any) -> Path:
    """Every rank: write this epoch's checkpoint of ``s`` (a :class:`bench.train.TrainState`);
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
        from bench.checkpoint_verify import remove_incomplete, shard_sizes
        from bench.config import to_container

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
        }
        _atomic_json(manifest, d.with_suffix(".json"))
        for old in sorted(root.glob("epoch-*.json"))[: -max(1, cfg.train.keep_checkpoints)]:
            old.unlink(missing_ok=True)
            shutil.rmtree(old.with_suffix(""), ignore_errors=True)
        remove_incomplete(root, keep=d)  # every rank is past the barrier: none writes
    return d


def load(s: Any, manifest: Mapping[str, Any]) -> None:
    """Every rank: restore ``s`` from a checkpoint (the model, optimizer, schedule and
    scaler rank 0 saved; this rank's residuals and RNG states; clock, curve, position)."""
    from bench.config import to_container

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
    mem = _memory(s.comm)
    if mem is not None:
        ids = {n: i for i, n in _param_names(s.model).items()}
        mem.load_state_dict(mine["residuals"], lambda k: _local(k, ids))
    if hasattr(s.comm.state, "step"):
        s.comm.state.step = mine["comm_step"]
    set_rng_state(mine["rng"], s.device)
    s.clock.load_state_dict({"elapsed": manifest["train_time_s"]})
    s.curve = [dict(r) for r in manifest["curve"]]
    s.epoch, s.step, s.status = manifest["epoch"], manifest["step"], manifest["status"]


def resume(s: Any) -> None:
    """Continue from the run's last checkpoint after an elastic restart or by hand.

    The training clock counts the work being repeated: the time from the checkpoint to
    the failure (or the stop) that lost it is added back."""
    from bench import runtime

    # a new run's id has no checkpoint yet: one exists after a restart or for a resume;
    # rank 0 decides for all (an agent whose workers did not fail counts no restart)
    manifest = runtime.broadcast_object(latest(s.cfg.results.dir, s.run["run_id"]))
    by = "hand" if s.run.get("resume") else "restart" if manifest is not None else None
    events = events_path(s.cfg.results.dir, s.run["run_id"])
    if manifest is not None:
        _settle_buckets(s)
        load(s, manifest)
        lost = [
            e["time"] - manifest["saved_at"]
            for e in read_events(events)
            if e.get("kind") in ("failure", "stop") and e["time"] > manifest["saved_at"]
        ]
        s.clock.load_state_dict({"elapsed": s.clock.elapsed + max(lost, default=0.0)})
    if by and s.rank == 0:
        epoch = s.epoch if manifest is not None else 0
        log_event(events, kind="resume", by=by, epoch=epoch)
        print(f"resuming run {s.run['run_id']} from epoch {epoch} ({by})", flush=True)


def _settle_buckets(s: Any) -> None:
    """One forward/backward on an evaluation batch, its gradient dropped, before a resume.

    DDP re-lays its buckets (in the order gradients became ready) after the first backward;
    the run being continued reduced in that layout, and the error-feedback residuals are
    positional in its buckets.  Everything this step touches (BN statistics, RNG, the comm
    hook's counters and residuals) is overwritten by the checkpoint right after."""
    if s.ddp is s.model:
        return
    x, y = next(iter(s.workload.data.eval))[:2]
    n = max(1, s.cfg.data.batch_size // s.world)  # no larger than a training batch (memory)
    batch = (x[:n].to(s.device), y[:n].to(s.device))
    with s.autocast():
        loss, _ = s.workload.loss(s.ddp, batch)
    loss.backward()
    s.optimizer.zero_grad(set_to_none=False)
    s.comm.pop_stats()
    if hasattr(s.comm.state, "finite"):
        s.comm.state.finite = []
