"""The report's rows for top-k on the outer step: each such method against every other one,
per column, with its interval and what the interval says."""

from __future__ import annotations

import math

from bench.report.outer import outer_topk, outer_topk_lines
from bench.report.versus import Column


def test_the_outer_topk_methods_are_the_sync_strategies_with_a_density() -> None:
    assert set(outer_topk()) == {"hitopk_diloco", "sparseloco"}


def test_each_pair_is_said_once_with_its_interval_and_verdict() -> None:
    fast = [[10.0, 10.5, 9.5, 10.2, 9.8]]
    slow = [[20.0, 21.0, 19.0, 20.5, 19.5]]
    col = Column("measured-1.34", math.nan, {
        "dense": slow, "diloco": slow, "hitopk_diloco": fast, "sparseloco": fast,
    })  # fmt: skip
    lines = outer_topk_lines([col], ["**measured** at 1.34"])
    rows = [ln for ln in lines if ln.startswith("| hitopk_diloco vs") or ln.startswith("| sparse")]
    names = [ln.split(" | ")[0].removeprefix("| ") for ln in rows]
    assert "hitopk_diloco vs diloco" in names and "hitopk_diloco vs sparseloco" in names
    assert "sparseloco vs hitopk_diloco" not in names  # said once
    assert not any(n.endswith("vs dense") for n in names)  # the answer table's row
    row = next(ln for ln in rows if ln.startswith("| hitopk_diloco vs diloco"))
    assert "2.0" in row and row.endswith(", sooner |")
    tie = next(ln for ln in rows if ln.startswith("| hitopk_diloco vs sparseloco"))
    assert tie.endswith("no difference measurable |")
    assert outer_topk_lines([Column("c", math.nan, {"dense": slow})], ["h"]) == []
