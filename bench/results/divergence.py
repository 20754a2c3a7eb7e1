"""When a run whose loss stays finite has diverged anyway.

A step's NaN/Inf stops a run as ``diverged`` (the training loop's check), but a learning
rate far too high (``optim.lr=1e6``) can drive the loss to 1e22 and keep it finite: such
a run missed no target by bad luck, it diverged.  The rule, on each epoch's training
loss (the mean over every worker's steps, the same on every rank, so every rank stops at
the same epoch):

- above :data:`CEILING`: a cross-entropy loss at chance level is ln(classes), under 11
  even for a 50 000-word vocabulary, so a loss a thousand times that has left training;
- or above :data:`GROWTH` times the lowest training loss of the run's earlier epochs,
  that loss taken as at least 1: grown by three orders of magnitude (the floor keeps a
  loss that had fallen near zero, 0.001, from "diverging" when it comes back to 1.5).
"""

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
