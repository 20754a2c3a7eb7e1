"""The optimum inside the grid: after tuning and the timing pass the rule selects per
cluster (:func:`bench.sweeps.protocol.select_per_cluster`); where a selected configuration's
rate is the smallest or the largest tried with its knob setting, the next rate beyond it
(x0.5 or x2) is tuned on the tuning seeds and the rule selects again, until every selected
rate has a rate tried on either side of it, for at most MAX_ROUNDS rounds.  A selection
still at an edge when the bound stops the rounds is named in the tuning table
(``rate_at_edge``) and the log.  Each round is derived from the records of the rounds before
it (:func:`bench.sweeps.protocol.extend`), so a resumed sweep computes the same rounds and
runs only what has no record.
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
    """The trials per method (the grid, then each round's), the extension rounds' tuning
    runs, whether the rounds are settled (every run recorded, none in ``error``, and no
    round left to add), and the selections the bound left at an edge."""

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
    """(method, trial) of round ``r``: the next rate beyond each selection of ``table``
    (the tuning table on ``trials``) at an edge; and those selections, ``comm trial at
    cluster``."""
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
    """The labels of ``trials`` whose rate is the smallest or the largest tried with their
    knob setting (a trial that sets no rate has no rate axis)."""
    out = set()
    for t in (t for t in trials if "optim.lr" in t.values()):
        rates = [x.rate for x in trials if x.cell == t.cell]
        if math.isclose(t.rate, min(rates)) or math.isclose(t.rate, max(rates)):
            out.add(t.label)
    return out


def bound_note(ext: Extension) -> str:
    """The line that says the bound stopped the rounds with a selection at an edge."""
    return (
        f"rate extension stopped at its bound of {MAX_ROUNDS} rounds with the selected rate "
        f"still the smallest or largest tried: {', '.join(ext.at_edge)}"
    )


def most_runs(methods: int, clusters: int, cells: int, seeds: int) -> int:
    """The most extension runs a sweep can take: in each round every cluster's selection
    of every method at an edge of another knob setting or direction, on every seed."""
    return methods * min(clusters, 2 * cells) * MAX_ROUNDS * seeds
