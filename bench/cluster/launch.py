"""Launching the workers of a run: the checks every launcher shares, then the named launcher.

The launcher process (the Hydra app, :mod:`bench.launch.run`) validates the whole configuration,
writes a run JSON (config + run id + launch time) and hands it to :func:`launch`, which
looks ``cluster.name`` up in :data:`bench.cluster.registry.LAUNCHERS`: ``local`` and
``multinode`` (:mod:`bench.cluster.torchrun`), ``emulated`` (:mod:`bench.cluster.emulated`).
Importing this module imports the :mod:`bench.cluster` package first, and the package
imports every launcher module, so the registry is complete here.

Every worker runs ``python -m bench.train --config <run.json>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bench.cluster.registry import LAUNCHERS
from bench.registry import ConfigError

if TYPE_CHECKING:  # the run's config assembles every group's schema; only its type is used
    from bench.config import Config

__all__ = ["LAUNCHERS", "launch", "validate"]


def validate(cfg: Config) -> None:
    """Refuse a cluster config that cannot run, before anything starts (one sentence)."""
    c = cfg.cluster
    spec = LAUNCHERS.get(c.name)
    if c.nproc_per_node < 1:
        raise ConfigError(f"cluster.nproc_per_node must be >= 1, got {c.nproc_per_node}")
    if c.nnodes < 1:
        raise ConfigError(f"cluster.nnodes must be >= 1, got {c.nnodes}")
    spec.validate(c)


def launch(cfg: Config, run_json: Path) -> int:
    """Start the workers of this node; their exit status (0 = every worker succeeded)."""
    return LAUNCHERS.get(cfg.cluster.name).launch(cfg.cluster, Path(run_json))
