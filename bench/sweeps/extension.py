"""The optimum inside the grid: where a selected rate is the smallest or largest tried with
its knob setting, the next rate beyond it (x0.5 or x2) is tuned and the rule selects again,
for at most MAX_ROUNDS rounds, each derived from the records of the rounds before it (a
resumed sweep computes the same rounds).  A selection still at an edge is named
(``rate_at_edge``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from bench.sweeps.trials import Trial

MAX_ROUNDS = 4  # rounds of extension; a selection still at an edge after them is reported


@dataclass
class Extension:
    """The trials per method, the extension rounds' tuning runs, whether the rounds are
    settled (every run recorded, none in error, none left to add), the selections at an edge."""

    trials: dict[str, list[Trial]]
    jobs: list[Any]  # protocol.Job
    settled: bool = False
    at_edge: tuple[str, ...] = ()

    @property
    def rounds(self) -> int:
        return max((t.round for ts in self.trials.values() for t in ts), default=0)


def next_round(
    table: pd.DataFrame, trials: Mapping[str, Sequence[Trial]], r: int
) -> tuple[list[tuple[str, Trial]], tuple[str, ...]]:
    """(method, trial) of round ``r``: the next rate beyond each selection at an edge; and
    those selections, ``comm trial at cluster``."""
    edge = table[table["selected"] & table["rate_at_edge"] & table["median_time_s"].notna()]
    new: dict[tuple[str, str, float], Trial] = {}
    for comm, label in zip(edge["comm"], edge["trial"], strict=True):
        t = next(x for x in trials[comm] if x.label == label)
        tried = [x.rate for x in trials[comm] if x.cell == t.cell]
        rate = t.rate / 2 if t.rate == min(tried) else t.rate * 2
        new.setdefault((comm, t.cell, rate), t.at(rate, r))
    cols = zip(edge["comm"], edge["trial"], edge["cluster"], strict=True)
    where = tuple(sorted({f"{c} {t} at {cl}" for c, t, cl in cols}))
    return [(c, t) for (c, _, _), t in new.items()], where


def at_edge(trials: Sequence[Trial]) -> set[str]:
    """The labels of ``trials`` whose rate is the smallest or largest of their setting's."""
    out = set()
    for t in (t for t in trials if "optim.lr" in t.values()):
        rates = [x.rate for x in trials if x.cell == t.cell]
        if math.isclose(t.rate, min(rates)) or math.isclose(t.rate, max(rates)):
            out.add(t.label)
    return out


def bound_note(ext: Extension) -> str:
    return (
        f"rate extension stopped at its bound of {MAX_ROUNDS} rounds with the selected rate "
        f"still the smallest or largest tried: {', '.join(ext.at_edge)}"
    )


def most_runs(methods: int, clusters: int, cells: int, seeds: int) -> int:
    """The most extension runs a sweep can take (every selection at an edge, every round)."""
    return methods * min(clusters, 2 * cells) * MAX_ROUNDS * seeds
