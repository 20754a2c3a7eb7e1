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
    """All configuration-time checks, before any worker process starts.

    Types and choices were checked when the config was composed; what is left are
    ranges and checks across groups, each in the package that owns the group.
    """
    from bench import comm, data, models, optim
    from bench.cluster import launch

    launch.validate(cfg)
    world = cfg.cluster.nnodes * cfg.cluster.nproc_per_node
    models.validate(cfg.model)
    data.validate(cfg.data, cfg.cache, world)
    optim.validate(cfg.optim)
    comm.validate(cfg.comm, world_size=world, nnodes=cfg.cluster.nnodes)
    _validate_train(cfg)
    _check_writable(cfg.results.dir)


def _validate_train(cfg: Config) -> None:
    from bench.workload import WORKLOADS

    t = cfg.train
    metrics = [m for m in WORKLOADS.get(t.workload).metrics if m != "loss"]
    if t.target_metric not in metrics:
        raise ConfigError(
            f"train.target_metric={t.target_metric!r}; workload {t.workload} reports "
            f"{', '.join(metrics)}"
        )
    if t.epochs < 1:
        raise ConfigError(f"train.epochs must be >= 1, got {t.epochs}")
    if not 0 < t.target_value <= 1:
        raise ConfigError(f"train.target_value is a fraction in (0, 1], got {t.target_value}")
    mw = cfg.optim.master_weights
    if mw != "off" and t.amp != mw:
        raise ConfigError(
            f"optim.master_weights={mw} keeps a {mw} model copy: set train.amp={mw} too"
        )
    if t.eval_every < 1:
        raise ConfigError("train.eval_every must be >= 1")


def _check_writable(results_dir: str) -> None:
    res = Path(results_dir)
    try:
        res.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=res):
            pass
    except OSError as e:
        raise ConfigError(f"results.dir={results_dir!r} is not writable ({e.strerror})") from None


def run(
    cfg: DictConfig | Config, *, experiment: str, output_dir: str | Path | None = None
) -> tuple[int, dict[str, Any] | None]:
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
        from bench.comm import is_sparse

        err = records.RunRecord.start(
            cfg, run_meta, config=payload["config"], comm_sparse=is_sparse(cfg.comm.name)
        )
        err.exit_status = rc
        err.append(cfg.results.dir)
        rec = err.to_dict()
        rc = rc or 1
    return rc, rec
