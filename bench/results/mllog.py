"""The MLPerf training log of a run: ``<dir>/mllog/<run_id>.log``, through ``mlperf-logging``.

:class:`RunLog` wraps one ``mllog.MLLogger`` with a logger and a file of its own (not the
package's shared, globally configured one), so several runs in one process never mix
their lines.  Rank 0 writes; on every other rank each call does nothing, so the training
loop calls it unconditionally, one line per event.

The log is an open-division submission log: ``submission_*`` keys (organisation from
``results.author``, status ``research``), ``cache_clear``, ``init_start``/``init_stop``,
the hyperparameters (``global_batch_size``, ``opt_*`` and the optimizer's own keys),
``train_samples``/``eval_samples``, ``run_start``, ``epoch_start``/``epoch_stop`` and
``eval_start``/``eval_stop``/``eval_accuracy`` (the target metric, a fraction) per epoch
with ``epoch_num`` (1-based, the curve's epoch), and ``run_stop`` with ``status``
``success`` (target reached) or ``aborted``.  Image classification logs as benchmark
``resnet``, translation as ``transformer``.  A resumed run appends its attempt to the
same file (MLPerf has no resume: such a log holds two ``run_start`` and is not a valid
submission).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from bench.data.loaders import SAMPLES
from bench.results.env import hardware

if TYPE_CHECKING:  # the training loop, a layer above, passes its state; only its type is named
    from bench.train.loop import TrainState

BENCHMARKS = {"classification": "resnet", "translation": "transformer"}
_REPO = str(Path(__file__).resolve().parents[2])


def log_path(results_dir: str | Path, run_id: str) -> Path:
    return Path(results_dir) / "mllog" / f"{run_id}.log"


class RunLog:
    """One run's MLPerf log; every method is a no-op when ``path`` is None (rank != 0)."""

    def __init__(self, path: Path | None, *, run_id: str = "") -> None:
        self.path = path
        self._mll: Any = None
        self._handler: logging.Handler | None = None
        self._eval_samples_logged = False
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

    # --- the events of a training run, one call each from the loop ---

    def begin(self, s: TrainState, init_start_s: float) -> None:
        """Everything up to ``run_start``: initialisation began at ``init_start_s`` (the
        worker's start, epoch seconds) and ends now, with ``s`` (the TrainState) built."""
        if self._mll is None:
            return
        cfg, t0 = s.cfg, int(init_start_s * 1e3)
        self.event("cache_clear", True, time_ms=t0)
        self.start("init_start", time_ms=t0)
        for key, value in _submission(cfg, s.world, s.nnodes).items():
            self.event(key, value, time_ms=t0)
        for key, value in _hyperparameters(cfg, s.steps, s.world).items():
            self.event(key, value)
        self.event("train_samples", int(s.workload.data.train_samples))
        self.end("init_stop")
        self.start("run_start", first_epoch_num=s.epoch + 1)

    def epoch_start(self, epoch: int) -> None:
        self.start("epoch_start", epoch_num=epoch)

    def epoch_stop(self, epoch: int, samples: int) -> None:
        self.end("epoch_stop", epoch_num=epoch, samples_count=int(samples))

    def eval_start(self, epoch: int) -> None:
        self.start("eval_start", epoch_num=epoch)

    def eval_stop(self, s: TrainState, metrics: dict[str, float]) -> None:
        """The end of the evaluation after epoch ``s.epoch + 1`` with ``metrics`` (the
        workload's): ``eval_accuracy`` is the target metric's value.  The one call every
        rank must make: the first time, the ranks sum the samples their evaluation loaders
        yielded (``eval_samples``, one collective)."""
        if not self._eval_samples_logged:
            self._eval_samples_logged = True
            self.event("eval_samples", _eval_samples(s))
        metric, epoch = s.cfg.train.target_metric, s.epoch + 1
        self.end("eval_stop", epoch_num=epoch)
        self.event("eval_accuracy", float(metrics[metric]), epoch_num=epoch, metric=metric)

    def run_stop(self, status: str) -> str | None:
        """``status`` is the run's (``ok`` is MLPerf's ``success``); closes the file and
        returns its path (None on ranks != 0)."""
        self.end("run_stop", status="success" if status == "ok" else "aborted", run=status)
        self.close()
        return str(self.path) if self.path is not None else None


def _eval_samples(s: TrainState) -> int:
    """Every rank: the real samples of the evaluation just done, summed over the ranks
    (each loader's ``epoch_stats`` counts what it yielded since it was last asked)."""
    mine = s.workload.data.eval.epoch_stats().get(SAMPLES, 0)
    total = torch.tensor([float(mine)], dtype=torch.float64, device=s.device)
    if dist.is_initialized():
        dist.all_reduce(total)
    return int(total.item())


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
    """The recipe under MLPerf's names; the optimizer's own keys for sgd and lars.  A
    token-batched workload's global batch is its token budget (``data.max_tokens`` per
    worker)."""
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
    """The launcher's end of a log whose workers died before ``run_stop``: it appends
    ``run_stop`` (``aborted``) so the log is closed; the log's path, or None if none."""
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
    """The events of a log, in order (the JSON after each ``:::MLLOG`` marker)."""
    out = []
    for line in Path(path).read_text().splitlines():
        _, mark, rest = line.partition(":::MLLOG ")
        if mark:
            out.append(json.loads(rest))
    return out
