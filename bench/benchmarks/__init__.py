"""Benchmarks: ``python -m reproduce bench <name>``.

Each module registers one benchmark in :data:`BENCHMARKS`; it measures the subject and
its baseline in the same run and appends one row per case to ``results/bench/<name>.csv``
through :func:`bench.benchmarks.harness.record` (never overwriting earlier rows), then
draws ``results/bench/<name>.png`` from the newest run in that CSV.
"""

from __future__ import annotations

import importlib
import pkgutil

from bench.registry import Registry

BENCHMARKS: Registry = Registry("benchmark")


def load_all() -> Registry:
    """Import every benchmark module so that it registers itself."""
    for mod in pkgutil.iter_modules(__path__):
        if mod.name != "harness":
            importlib.import_module(f"{__name__}.{mod.name}")
    return BENCHMARKS
