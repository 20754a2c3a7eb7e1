"""The tuning protocol's trials: each method's joint space (its own knobs x the learning
rate), an equal number of trials per method drawn from it by a scrambled Halton sequence
(AlgoPerf's external tuning draws a fixed number of quasirandom points per submission),
schedules on the step axis, and the refusal of two trials that would run alike.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench import methods
from bench.methods import Knobs, Option, Space
from bench.registry import ConfigError

LR_FACTORS = (0.5, 1.0, 2.0)  # x the recipe's learning rate, for every method
TRIALS = 6  # trials per method, every method alike
DRAW_SEED = 0  # the Halton sequence's scramble: the same trials every time


@dataclass(frozen=True)
class Trial:
    """One point of a method's joint space: its label (what it runs) and its overrides."""

    label: str
    overrides: tuple[tuple[str, Any], ...]  # (Hydra key, value), in knob order

    def values(self) -> dict[str, Any]:
        return dict(self.overrides)


def joint(knobs: Space, recipe_lr: float) -> list[Trial]:
    """Every combination of ``knobs`` and the learning-rate axis, in declared order."""
    axes: list[tuple[Option, ...]] = [*knobs.values(), _lr_axis(recipe_lr)]
    out = []
    for combo in itertools.product(*axes):
        label = "-".join(p for p, _ in combo if p)
        over: dict[str, Any] = {}
        for _, o in combo:
            over.update(o)
        out.append(Trial(label, tuple(over.items())))
    return out


def _lr_axis(recipe_lr: float) -> tuple[Option, ...]:
    return tuple((f"lr{f:g}x", {"optim.lr": float(f"{recipe_lr * f:.6g}")}) for f in LR_FACTORS)


def draw(knobs: Space, recipe_lr: float, n: int = TRIALS, seed: int = DRAW_SEED) -> list[Trial]:
    """``n`` distinct points of the joint space: all of it when it has ``n``, else the
    first ``n`` distinct cells a scrambled Halton sequence visits (ConfigError: fewer)."""
    from scipy.stats import qmc

    points = joint(knobs, recipe_lr)
    if len(points) < n:
        raise ConfigError(
            f"a joint space of {len(points)} trials cannot give the protocol's {n}: "
            f"add options to {', '.join(knobs) or 'its knobs'}"
        )
    if len(points) == n:
        return points
    sizes = [len(a) for a in (*knobs.values(), LR_FACTORS)]
    halton = qmc.Halton(d=len(sizes), scramble=True, seed=seed)
    chosen: list[int] = []
    while len(chosen) < n:
        for u in halton.random(64):
            cell = [min(int(x * k), k - 1) for x, k in zip(u, sizes, strict=True)]
            i = 0
            for c, k in zip(cell, sizes, strict=True):
                i = i * k + c
            if i not in chosen:
                chosen.append(i)
            if len(chosen) == n:
                break
    return [points[i] for i in sorted(chosen)]


def sends(comm: str, values: Mapping[str, Any], steps: int) -> list[tuple[str, Knobs]]:
    """What each of a trial's first ``steps`` optimizer steps sends, as its spec prices it:
    (method, the knobs of the timing run of that step), dense in a warm-up."""
    spec = methods.get(comm)
    phases = spec.phases(spec.knobs_of(values), range(steps))
    return [(m, methods.get(m).timing_knobs(k)) for m, k in phases]


# the comm keys a trial's step sequence (:func:`sends`) already says
SCHEDULE_KEYS = ("density", "warmup_steps", "density_schedule", "schedule_steps")


def schedule(values: Mapping[str, Any], comm: str, budget: int) -> tuple[Any, ...]:
    """What a trial sends at each of the first ``budget`` optimizer steps, and its other
    settings: two trials with the same are the same trial within the budget."""
    rest = {
        k: tuple(v) if isinstance(v, list) else v
        for k, v in values.items()
        if k.removeprefix("comm.") not in SCHEDULE_KEYS
    }
    return (tuple(sends(comm, values, budget)), tuple(sorted(rest.items())))


def check_distinct(comm: str, trials: Sequence[Trial], budget: int) -> None:
    """ConfigError when two trials of ``comm`` run alike within ``budget`` steps."""
    seen: dict[tuple[Any, ...], str] = {}
    for t in trials:
        key = schedule(t.values(), comm, budget)
        if key in seen:
            raise ConfigError(
                f"{comm}: trials {seen[key]!r} and {t.label!r} run the same schedule within "
                f"the budget of {budget} steps; make them differ before the sweep"
            )
        seen[key] = t.label


def ran(phases: Sequence[tuple[int, str, Knobs]]) -> str:
    """What a run sent, (steps, method, knobs) per phase: ``dense x 15, hitopk 0.1 x 5,
    powersgd rank 8 x 40`` (printed beside a trial's label: the schedule that ran)."""
    out = []
    for steps, what, k in phases:
        rank, density = getattr(k, "rank", None), getattr(k, "density", 1.0)
        what += f" rank {rank}" if rank is not None else f" {density:g}" if density < 1 else ""
        out.append(f"{what} x {steps}")
    return ", ".join(out)
