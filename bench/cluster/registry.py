"""The registry of cluster launchers: one :class:`LauncherSpec` per ``cluster.name``.

A launcher module builds its spec (how to start the workers, and the configuration checks
that only this launcher needs) and registers it here when it is imported;
:mod:`bench.cluster` imports every launcher module, so :mod:`bench.cluster.launch` finds
them all without a list of plugin modules.  This module imports no launcher.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.cluster.config import ClusterConfig
from bench.registry import Registry


def no_checks(c: ClusterConfig) -> None:  # noqa: ARG001
    """The ``validate`` of a launcher without checks of its own."""


@dataclass(frozen=True)
class LauncherSpec:
    """A cluster launcher.

    ``launch(c, run_json)`` starts every worker of this node as
    ``python -m bench.train --config run_json`` and returns an exit status (0 = all
    workers succeeded).  ``validate(c)`` refuses, with one :class:`bench.registry.ConfigError`
    sentence, what this launcher cannot run; it starts nothing.
    """

    name: str
    launch: Callable[[ClusterConfig, Path], int]
    validate: Callable[[ClusterConfig], None] = no_checks


LAUNCHERS: Registry[LauncherSpec] = Registry("cluster launcher")


def register(spec: LauncherSpec) -> LauncherSpec:
    """Add ``spec`` under ``spec.name``; a second launcher of the same name is refused."""
    return LAUNCHERS.register(spec.name)(spec)
