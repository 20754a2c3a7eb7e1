"""Benchmarks: ``python -m reproduce bench <name>``.  Each module registers one in
:data:`BENCHMARKS`; how each one measures: docs/internals/benchmarks.md."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.registry import Registry


@dataclass(frozen=True)
class BenchmarkSpec:
    """A benchmark: how to measure it, and how to draw its figure from recorded rows."""

    run: Callable[..., Path]  # (results_dir="results", quick=False) -> the CSV appended to
    replot: Callable[[Any], None]  # (harness.BenchRun of recorded rows) -> draws its PNG(s)
    headline: Callable[[Any], list[str]] | None = None  # (a run's rows) -> the report's lines


BENCHMARKS: Registry[BenchmarkSpec] = Registry("benchmark")


def load_all() -> Registry[BenchmarkSpec]:
    """Import every module of the package; the benchmark modules register themselves."""
    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")
    return BENCHMARKS
