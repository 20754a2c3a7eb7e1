"""The comparison methods, one file each, each registering one
:class:`~bench.methods.spec.MethodSpec`: the one place that knows a method (``get(name)``,
``of(record)``, ``names(group=...)``, ``defaults()``).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

from bench.methods.spec import GROUPS, METHODS, Knobs, MethodSpec, Option, Space, register


def get(name: str) -> MethodSpec:
    return METHODS.get(name)


def specs(*, group: str | None = None, kind: str | None = None) -> list[MethodSpec]:
    out = sorted((METHODS.get(n) for n in METHODS), key=lambda s: (s.order, s.name))
    return [
        s for s in out if (group is None or s.group == group) and (kind is None or s.kind == kind)
    ]


def names(*, group: str | None = None, kind: str | None = None) -> list[str]:
    return [s.name for s in specs(group=group, kind=kind)]


def defaults() -> tuple[str, ...]:
    return tuple(s.name for s in specs() if s.default)


def peers() -> tuple[str, ...]:
    """The 2020 and 2026 peers (every table's "best peer" is the fastest of these)."""
    return tuple(s.name for s in specs() if s.group.startswith("peer"))


def paper() -> tuple[str, ...]:
    return tuple(names(group="paper"))


def of(rec: Mapping[str, Any]) -> MethodSpec | None:
    """The spec of the method ``rec`` ran: an optimizer's or a sync strategy's first (their
    runs also record a comm hook); None if unknown."""
    for kind in ("optimizer", "sync", "hook", "reference"):
        for s in specs(kind=kind):
            if s.matches(rec):
                return s
    return None


def method_of(rec: Mapping[str, Any]) -> str:
    """The name of the method ``rec`` ran (its comm hook's when no spec knows it)."""
    s = of(rec)
    return s.name if s else str(rec.get("comm"))


def colour(name: str) -> str:
    """The method's colour (black for a name no spec knows)."""
    return METHODS.get(name).colour if name in METHODS else "#000000"


def width(name: str) -> float:
    return METHODS.get(name).width if name in METHODS else MethodSpec.width


def baseline() -> str:
    return names(group="baseline")[0]


for _mod in pkgutil.iter_modules(__path__):  # each method file registers itself
    if _mod.name not in ("spec", "kinds"):
        importlib.import_module(f"{__name__}.{_mod.name}")

__all__ = [
    "GROUPS", "METHODS", "Knobs", "MethodSpec", "Option", "Space", "colour", "defaults", "get",
    "method_of", "names", "of", "paper", "peers", "register", "specs",
]  # fmt: skip
