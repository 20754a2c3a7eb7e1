"""The tuning protocol's trials: the same number of knob settings per method, drawn by a
scrambled Halton sequence (as AlgoPerf's external tuning draws quasirandom points), each at
every rate of LR_FACTORS; and the refusal of two trials that would send and learn alike.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench import methods
from bench.methods import Knobs, Space
from bench.registry import ConfigError

# x the method's centre rate, for every method; the centre first, so that a tie (the rule
# takes the trial declared first) never puts a selection at the edge of what was tried
LR_FACTORS = (1.0, 0.5, 2.0)
KNOB_CELLS = 2  # knob settings per method, each tried at every rate of LR_FACTORS
TRIALS = KNOB_CELLS * len(LR_FACTORS)  # trials per method, every method alike
DRAW_SEED = 0  # the Halton sequence's scramble: the same knob settings every time


@dataclass(frozen=True)
class Trial:
    label: str
    overrides: tuple[tuple[str, Any], ...]  # (Hydra key, value), in knob order
    cell: str = ""  # the knob setting: the label's part before the rate
    rate: float = 1.0  # x the method's centre
    round: int = 0  # the extension round that added it (0: the grid)

    def values(self) -> dict[str, Any]:
        return dict(self.overrides)

    def at(self, rate: float, round: int = 0) -> Trial:
        """The same knob setting at ``rate`` x the centre (its label says the rate)."""
        lr = float(self.values()["optim.lr"]) / self.rate * rate
        over = {**self.values(), "optim.lr": float(f"{lr:.6g}")}
        label = "-".join(p for p in (self.cell, f"lr{rate:g}x") if p)
        return Trial(label, tuple(over.items()), self.cell, rate, round)


def draw(knobs: Space, centre: float, n: int = KNOB_CELLS, seed: int = DRAW_SEED) -> list[Trial]:
    """``n`` knob settings of ``knobs`` (the first distinct cells a scrambled Halton
    sequence visits), each at every rate of LR_FACTORS x ``centre``."""
    from scipy.stats import qmc

    points = [
        ("-".join(p for p, _ in combo if p), {k: v for _, o in combo for k, v in o.items()})
        for combo in itertools.product(*knobs.values())
    ]
    if len(points) < n:
        raise ConfigError(
            f"a space of {len(points)} knob setting(s) cannot give the protocol's {n}: "
            f"add options to {', '.join(knobs) or 'its knobs'}"
        )
    chosen: Sequence[int] = range(n)
    if len(points) > n:  # 64 points a cell: every cell visited
        sizes = np.array([len(a) for a in knobs.values()])
        u = qmc.Halton(d=len(sizes), scramble=True, seed=seed).random(64 * len(points))
        cell = np.minimum((u * sizes).astype(int), sizes - 1)
        chosen = list(dict.fromkeys(np.ravel_multi_index(tuple(cell.T), sizes).tolist()))[:n]
    out = []
    for label, over in (points[i] for i in sorted(chosen)):
        centred = Trial(label, tuple({**over, "optim.lr": centre}.items()), label)
        out += [centred.at(f) for f in LR_FACTORS]
    return out


def beyond(grid: Sequence[Trial], label: str) -> Trial | None:
    """The trial ``label`` names: one of ``grid``, or a knob setting of it at another rate
    (added by the rate extension); None if neither."""
    for t in grid:
        if t.label == label:
            return t
    m = re.fullmatch(r"(?:(.*)-)?lr([0-9.e+-]+)x", label)
    if not m:
        return None
    same = [t for t in grid if t.cell == (m.group(1) or "")]
    return same[0].at(float(m.group(2))) if same else None


def sends(comm: str, values: Mapping[str, Any], steps: int) -> list[tuple[str, Knobs]]:
    """(method, timing knobs) of each of a trial's first ``steps`` optimizer steps."""
    spec = methods.get(comm)
    phases = spec.phases(spec.knobs_of(values), range(steps))
    return [(m, methods.get(m).timing_knobs(k)) for m, k in phases]


# the comm keys a trial's step sequence (:func:`sends`) already says
SCHEDULE_KEYS = ("density", "warmup_steps", "density_schedule", "schedule_steps")


def _learns(k: Knobs) -> tuple[tuple[str, Any], ...]:
    fields = dataclasses.fields(k)
    return tuple((f.name, getattr(k, f.name)) for f in fields if f.metadata.get("learns", True))


def effect(values: Mapping[str, Any], comm: str, budget: int) -> tuple[Any, ...]:
    """What a trial sends at each of the first ``budget`` steps, and every other setting
    that changes the learning (a knob declared not to, DDP's bucket size, is left out)."""
    quiet = {
        f.metadata["key"]
        for f in dataclasses.fields(methods.get(comm).knob_type)
        if not f.metadata.get("learns", True)
    }
    rest = {
        k: tuple(v) if isinstance(v, list) else v
        for k, v in values.items()
        if k.removeprefix("comm.") not in SCHEDULE_KEYS and k not in quiet
    }
    steps = tuple((m, _learns(k)) for m, k in sends(comm, values, budget))
    return (steps, tuple(sorted(rest.items())))


def check_distinct(comm: str, trials: Sequence[Trial], budget: int) -> None:
    seen: dict[tuple[Any, ...], str] = {}
    for t in trials:
        key = effect(t.values(), comm, budget)
        if key in seen:
            raise ConfigError(
                f"{comm}: trials {seen[key]!r} and {t.label!r} send alike within the budget "
                f"of {budget} steps and learn alike; make them differ before the sweep"
            )
        seen[key] = t.label


def ran(phases: Sequence[tuple[int, str, Knobs]]) -> str:
    """What a run sent, (steps, method, knobs) per phase: ``dense x 15, hitopk 0.1 x 5``."""
    out = []
    for steps, what, k in phases:
        rank, density = getattr(k, "rank", None), getattr(k, "density", 1.0)
        what += f" rank {rank}" if rank is not None else f" {density:g}" if density < 1 else ""
        out.append(f"{what} x {steps}")
    return ", ".join(out)


def check_reached(comm: str, space: Sequence[tuple[str, Mapping[str, Any]]], ref: int) -> None:
    """ConfigError unless each trial's final knobs are sent within ``ref`` steps."""
    spec = methods.get(comm)
    for label, values in space:
        final = spec.timing_knobs(spec.knobs_of(values))
        if (comm, final) not in sends(comm, values, ref):
            what = spec.timing_label(final).removeprefix(f"time {comm} ")
            raise ConfigError(f"{comm} {label}: {what} is not reached within {ref} steps")


def check_placements(comm: str, space: Sequence[tuple[str, Mapping[str, Any]]], optim: str) -> None:
    """bench.comm.placement's own refusal of a trial's placement, before the sweep."""
    from bench.comm.config import Placement
    from bench.comm.placement import FITS

    for label, values in space:
        p = values.get("comm.placement")
        if p is None or p == Placement.grad.value:
            continue
        fits = FITS.get(Placement(p), ())
        if not methods.get(comm).sparse or optim not in fits:
            raise ConfigError(
                f"{comm} {label}: placement {p} does not fit the workload's optimizer {optim} "
                f"(it needs a sparse method and {' or '.join(fits)})"
            )
        if p == Placement.update.value and not int(values.get("comm.warmup_steps", 0)):
            raise ConfigError(f"{comm} {label}: placement update needs comm.warmup_steps > 0")
