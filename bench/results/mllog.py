"""A run's MLPerf open-division training log, ``<dir>/mllog/<run_id>.log``, through
``mlperf-logging`` (its events: docs/internals/train.md)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from bench.results.env import hardware

BENCHMARKS = {"classification": "resnet", "translation": "transformer"}
_REPO = str(Path(__file__).resolve().parents[2])


def log_path(results_dir: str | Path, run_id: str) -> Path:
    return Path(results_dir) / "mllog" / f"{run_id}.log"


class RunLog:
    """One run's log, with a logger of its own so that runs in one process never mix their
    lines; every method is a no-op when ``path`` is None (rank != 0)."""

    def __init__(self, path: Path | None, *, run_id: str = "") -> None:
        self.path = path
        self._mll: Any = None
        self._handler: logging.Handler | None = None
        self.wants_eval_samples = True  # until the first evaluation's are logged
        if path is None:
            return
        from mlperf_logging.mllog import mllog  # rank 0 only: the other ranks never load it

        path.parent.mkdir(parents=True, exist_ok=True)
        logger = logging.Logger(f"bench.mllog.{run_id}")  # not registered: no global state
        logger.propagate = False
        self._handler = logging.FileHandler(path, mode="a")  # a resumed run appends
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(self._handler)
        # each event names the loop's line calling it, relative to the repository
        self._mll = mllog.MLLogger(logger=logger, default_stack_offset=3, root_dir=_REPO)

    @classmethod
    def open(cls, results_dir: str | Path, run_id: str, rank: int) -> RunLog:
        return cls(log_path(results_dir, run_id) if rank == 0 else None, run_id=run_id)

    def event(self, key: str, value: Any = None, time_ms: int | None = None, **meta: Any) -> None:
        if self._mll is not None:
            self._mll.event(key, value, metadata=meta or None, time_ms=time_ms)

    def start(self, key: str, value: Any = None, time_ms: int | None = None, **meta: Any) -> None:
        if self._mll is not None:
            self._mll.start(key, value, metadata=meta or None, time_ms=time_ms)

    def end(self, key: str, value: Any = None, **meta: Any) -> None:
        if self._mll is not None:
            self._mll.end(key, value, metadata=meta or None)

    def close(self) -> None:
        if self._handler is not None:
            self._handler.close()
            self._handler = None
            self._mll = None

    def begin(
        self,
        cfg: Any,
        *,
        world: int,
        nnodes: int,
        steps_per_epoch: int,
        train_samples: int,
        first_epoch: int,
        init_start_s: float,
    ) -> None:
        """Everything up to ``run_start``, initialisation from ``init_start_s`` (epoch s)."""
        if self._mll is None:
            return
        t0 = int(init_start_s * 1e3)
        self.event("cache_clear", True, time_ms=t0)
        self.start("init_start", time_ms=t0)
        for key, value in _submission(cfg, world, nnodes).items():
            self.event(key, value, time_ms=t0)
        for key, value in _hyperparameters(cfg, steps_per_epoch, world).items():
            self.event(key, value)
        self.event("train_samples", train_samples)
        self.end("init_stop")
        self.start("run_start", first_epoch_num=first_epoch)

    def epoch_start(self, epoch: int) -> None:
        self.start("epoch_start", epoch_num=epoch)

    def epoch_stop(self, epoch: int, samples: int) -> None:
        self.end("epoch_stop", epoch_num=epoch, samples_count=int(samples))

    def eval_start(self, epoch: int) -> None:
        self.start("eval_start", epoch_num=epoch)

    def eval_stop(self, epoch: int, metric: str, value: float, samples: int | None) -> None:
        """``samples`` (every rank's) is logged the first time."""
        if samples is not None and self.wants_eval_samples:
            self.wants_eval_samples = False
            self.event("eval_samples", samples)
        self.end("eval_stop", epoch_num=epoch)
        self.event("eval_accuracy", value, epoch_num=epoch, metric=metric)

    def run_stop(self, status: str) -> str | None:
        """Close the log (``ok`` is MLPerf's ``success``); its path, None on ranks != 0."""
        self.end("run_stop", status="success" if status == "ok" else "aborted", run=status)
        self.close()
        return str(self.path) if self.path is not None else None


def _submission(cfg: Any, world: int, nnodes: int) -> dict[str, Any]:
    return {
        "submission_benchmark": BENCHMARKS.get(cfg.train.workload, cfg.train.workload),
        "submission_org": cfg.results.author or "unknown",
        "submission_poc_email": cfg.results.author_email or "unknown",
        "submission_division": "open",
        "submission_status": "research",
        "submission_platform": f"{world} worker(s) on {nnodes} node(s): {hardware()}",
    }


def _hyperparameters(cfg: Any, steps_per_epoch: int, world: int) -> dict[str, Any]:
    """The recipe under MLPerf's names (a token-batched workload's global batch: its tokens)."""
    o, tokens = cfg.optim, cfg.train.workload == "translation"
    out: dict[str, Any] = {
        "global_batch_size": int(cfg.data.max_tokens * world if tokens else cfg.data.batch_size),
        "seed": int(cfg.train.seed),
        "opt_name": str(o.name),
        "opt_base_learning_rate": float(o.lr),
        "opt_learning_rate_warmup_epochs": float(o.warmup_epochs),
        "opt_learning_rate_warmup_factor": float(o.warmup_start_factor),
        "opt_learning_rate_decay_schedule": str(o.schedule),
        "opt_learning_rate_training_steps": int(steps_per_epoch * cfg.train.epochs),
        "opt_weight_decay": float(o.weight_decay),
        "opt_gradient_clip_norm": float(o.clip_norm),
    }
    if o.name in ("sgd", "lars"):
        out[f"{o.name}_opt_base_learning_rate"] = float(o.lr)
        out[f"{o.name}_opt_momentum"] = float(o.momentum)
        out[f"{o.name}_opt_weight_decay"] = float(o.weight_decay)
    if o.name == "lars":
        out["lars_opt_learning_rate_warmup_epochs"] = float(o.warmup_epochs)
        out["lars_epsilon"] = float(o.eps)
    return out


def close_after_failure(results_dir: str | Path, run_id: str, reason: str) -> str | None:
    """``run_stop`` (``aborted``) appended to a log whose workers died before it; its path."""
    path = log_path(results_dir, run_id)
    if not path.exists():
        return None
    keys = [e.get("key") for e in read_events(path)]
    started = len(keys) - keys[::-1].index("run_start") if "run_start" in keys else None
    if started is not None and "run_stop" not in keys[started:]:
        log = RunLog(path, run_id=run_id)
        log.end("run_stop", status="aborted", reason=reason[:500])
        log.close()
    return str(path)


def read_events(path: str | Path) -> list[dict[str, Any]]:
    out = []
    for line in Path(path).read_text().splitlines():
        _, mark, rest = line.partition(":::MLLOG ")
        if mark:
            out.append(json.loads(rest))
    return out
