"""A run diverged though its loss stays finite: the epoch's training loss above
:data:`CEILING`, or :data:`GROWTH` x the lowest before it (at least 1); docs/internals/results.md
says why."""

from __future__ import annotations

import math
from collections.abc import Sequence

CEILING = 1e4
GROWTH = 1e3


def exploded(losses: Sequence[float]) -> str | None:
    """Why the last of the per-epoch training ``losses`` is divergence (None if not)."""
    if not losses or not math.isfinite(last := float(losses[-1])):
        return None  # no loss, or NaN/Inf: the NaN check's case
    if last > CEILING:
        return f"training loss {last:.3g} above {CEILING:g}"
    earlier = [float(v) for v in losses[:-1] if math.isfinite(float(v)) and float(v) > 0]
    if earlier and last > GROWTH * max(1.0, min(earlier)):
        low = min(earlier)
        return f"training loss {last:.3g}, over {GROWTH:g} x the lowest before ({low:.3g})"
    return None
