"""One run from a composed config: validate everything, launch the workers, make sure a
record exists afterwards (a failed launch still leaves an ``error`` record)."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from bench.config import Config, to_container, to_object
from bench.registry import ConfigError
from bench.results import records


def validate(cfg: Config) -> None:
    """All configuration-time checks, before any worker process starts."""
    from bench import comm, data, models, optim
    from bench.cluster import launch

    launch.validate(cfg)
    world = cfg.cluster.nnodes * cfg.cluster.nproc_per_node
    models.validate(cfg.model)
    data.validate(cfg.data, cfg.cache, world)
    optim.validate(cfg.optim)
    if hasattr(comm, "validate"):
        comm.validate(cfg.comm, world_size=world, nnodes=cfg.cluster.nnodes)
    t = cfg.train
    if t.epochs < 1:
        raise ConfigError(f"train.epochs must be >= 1, got {t.epochs}")
    if t.target_metric not in ("top1", "top5"):
        raise ConfigError(f"train.target_metric={t.target_metric!r}; choose top1 or top5")
    if not 0 < t.target_value <= 1:
        raise ConfigError(f"train.target_value is a fraction in (0, 1], got {t.target_value}")
    if t.amp not in ("auto", "off", "bf16", "fp16"):
        raise ConfigError(f"train.amp={t.amp!r}; choose auto, off, bf16 or fp16")
    mw = getattr(cfg.optim, "master_weights", "off")
    if mw != "off" and t.amp != mw:
        raise ConfigError(f"optim.master_weights={mw} keeps a {mw} model copy: set train.amp={mw} too")
    if t.device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"train.device={t.device!r}; choose auto, cpu or cuda")
    if t.eval_every < 1:
        raise ConfigError("train.eval_every must be >= 1")
    res = Path(cfg.results.dir)
    try:
        res.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=res):
            pass
    except OSError as e:
        raise ConfigError(f"results.dir={cfg.results.dir!r} is not writable ({e.strerror})") from None


def run(cfg: DictConfig | Config, *, experiment: str, output_dir: str | Path | None = None) -> tuple[int, dict[str, Any] | None]:
    """Validate, launch, and return (exit status, the run's record)."""
    launch_time = time.time()
    cfg = to_object(cfg)
    validate(cfg)
    from bench.cluster.launch import launch

    run_meta = {
        "run_id": records.new_run_id(),
        "started_at": records.now_iso(),
        "launch_time": launch_time,
        "experiment": experiment,
    }
    payload = {"config": to_container(cfg), "run": run_meta}
    out = Path(output_dir) if output_dir else Path(tempfile.mkdtemp(prefix="bench-run-"))
    out.mkdir(parents=True, exist_ok=True)
    run_json = out / f"run-{run_meta['run_id']}.json"
    run_json.write_text(json.dumps(payload, indent=1))
    rc = launch(cfg, run_json)
    rec = records.find_record(cfg.results.dir, run_meta["run_id"])
    if rec is None and (cfg.cluster.name != "multinode" or cfg.cluster.node_rank == 0):
        # the workers died before rank 0 could write: keep the attempt on record
        rec = {
            "run_id": run_meta["run_id"], "started_at": run_meta["started_at"], "status": "error",
            "experiment": experiment, "model": cfg.model.name, "data": cfg.data.name, "comm": cfg.comm.name,
            "world_size": cfg.cluster.nnodes * cfg.cluster.nproc_per_node, "nnodes": cfg.cluster.nnodes,
            "target_metric": cfg.train.target_metric, "target_value": cfg.train.target_value,
            "time_to_target_s": None, "wall_time_s": time.time() - launch_time, "exit_status": rc,
            "config": payload["config"],
        }
        records.append_record(cfg.results.dir, rec)
        rc = rc or 1
    return rc, rec
