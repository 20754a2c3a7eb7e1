"""The comparison methods, one file each (this folder), each registering one
:class:`~bench.methods.spec.MethodSpec`.  The one place that knows a method: everything
else loops over the specs or asks the spec of a name or of a record.  The public surface::

    get("hitopk")              # a spec (ConfigError naming the known ones)
    of(record)                 # the spec a run record ran
    names(group="paper")       # names, in registration order, filtered
    defaults()                 # the protocol sweep's default methods
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

from bench.methods.spec import GROUPS, METHODS, Knobs, MethodSpec, Option, Space, register

_ORDER: list[str] = []  # every method, in the order the report lists them


def _load() -> None:
    """Import every method file of this folder (each registers itself)."""
    for mod in pkgutil.iter_modules(__path__):
        if mod.name not in ("spec", "kinds"):
            importlib.import_module(f"{__name__}.{mod.name}")


def get(name: str) -> MethodSpec:
    return METHODS.get(name)


def specs(*, group: str | None = None, kind: str | None = None) -> list[MethodSpec]:
    """The registered specs in their ``order``, filtered by ``group`` and ``kind``."""
    out = sorted((METHODS.get(n) for n in METHODS), key=lambda s: (s.order, s.name))
    return [
        s for s in out if (group is None or s.group == group) and (kind is None or s.kind == kind)
    ]


def names(*, group: str | None = None, kind: str | None = None) -> list[str]:
    return [s.name for s in specs(group=group, kind=kind)]


def defaults() -> tuple[str, ...]:
    """The methods a protocol sweep runs unless told otherwise."""
    return tuple(s.name for s in specs() if s.default)


def peers() -> tuple[str, ...]:
    """What a user would pick instead of dense fp32: the 2020 and 2026 peers (every
    table's "best peer" is the fastest of these)."""
    return tuple(s.name for s in specs() if s.group.startswith("peer"))


def paper() -> tuple[str, ...]:
    return tuple(names(group="paper"))


def of(rec: Mapping[str, Any]) -> MethodSpec | None:
    """The spec of the method run record ``rec`` ran: an optimizer's or a sync strategy's
    spec first (their runs also record a comm hook), then the hook's; None if unknown."""
    for kind in ("optimizer", "sync", "hook", "reference"):
        for s in specs(kind=kind):
            if s.matches(rec):
                return s
    return None


def method_of(rec: Mapping[str, Any]) -> str:
    """The name of the method ``rec`` ran (its comm hook's name when no spec knows it)."""
    s = of(rec)
    return s.name if s else str(rec.get("comm"))


def colour(name: str) -> str:
    """The method's colour in every figure (black for a name no spec knows)."""
    return METHODS.get(name).colour if name in METHODS else "#000000"


def width(name: str) -> float:
    """The method's line width in figures (the default for a name no spec knows)."""
    return METHODS.get(name).width if name in METHODS else MethodSpec.width


def baseline() -> str:
    """The method every speedup is measured against (the spec of group "baseline")."""
    return names(group="baseline")[0]


_load()

__all__ = [
    "GROUPS", "METHODS", "Knobs", "MethodSpec", "Option", "Space", "colour", "defaults", "get",
    "method_of", "names", "of", "paper", "peers", "register", "specs",
]  # fmt: skip
