"""Strict JSON for run records, which cannot fail over a value: one JSON cannot express is
written as a string (``"inf"``, a ``repr``), its field named in :data:`NOTE_FIELD`."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

NOTE_FIELD = "unencodable"  # the dotted paths of fields written as strings


def non_finite(obj: Any, prefix: str = "") -> list[tuple[str, float]]:
    """(dotted path, value) of every non-finite float below ``obj`` (dicts and lists)."""
    if isinstance(obj, float):
        return [] if math.isfinite(obj) else [(prefix, obj)]
    if isinstance(obj, Mapping):
        items = ((f"{prefix}.{k}" if prefix else str(k), v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        items = ((f"{prefix}[{i}]", v) for i, v in enumerate(obj))
    else:
        return []
    return [p for key, v in items for p in non_finite(v, key)]


def _plain(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _clean(obj: Any, path: str, notes: list[str]) -> Any:
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        notes.append(path)
        return repr(obj)  # "inf", "-inf", "nan"
    if isinstance(obj, Mapping):
        return {str(k): _clean(v, f"{path}.{k}" if path else str(k), notes) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v, f"{path}[{i}]", notes) for i, v in enumerate(obj)]
    try:
        plain = _plain(obj)
    except Exception:  # noqa: BLE001  (any object at all: recorded by its repr)
        notes.append(path)
        return repr(obj)
    return _clean(plain, path, notes)


def encode(record: Mapping[str, Any]) -> tuple[str, list[str]]:
    """One strict-JSON line (no newline), and the fields written as strings."""
    try:
        return json.dumps(record, default=_plain, allow_nan=False), []
    except (ValueError, TypeError):
        pass
    notes: list[str] = []
    clean = _clean(record, "", notes)
    clean[NOTE_FIELD] = notes
    return json.dumps(clean, allow_nan=False), notes
