"""Where top-k on the outer step of a local-update method stands: each such method's
speedup over every other method of a sweep, per column of its answer."""

from __future__ import annotations

import dataclasses

from bench import methods
from bench.report import versus

VERDICT = {"faster": "sooner", "slower": "later", "tie": "no difference measurable"}


def outer_topk() -> list[str]:
    """The sync strategies whose outer exchange is a top-k (a ``density`` knob)."""
    return [
        s.name
        for s in methods.specs(kind="sync")
        if "density" in {f.name for f in dataclasses.fields(s.knob_type)}
    ]


def outer_topk_lines(cols: list[versus.Column], heads: list[str]) -> list[str]:
    """Per outer top-k method a row against each other method (the baseline's row is the
    answer table's), a cell per column: its speedup [95 % interval] and the verdict.
    ``heads``: each column's title, in order."""
    mine = [m for m in outer_topk() if any(m in c.times for c in cols)]
    if not mine:
        return []
    base = methods.baseline()
    order = [s.name for s in methods.specs() if s.kind == "sync"]
    order += [s.name for s in methods.specs() if s.kind != "sync"]
    out = [
        f"Top-k on the outer step ({', '.join(mine)}) against every other method: its speedup "
        "in time to target (> 1: sooner) [95 % interval; projected: and its band], and what "
        "the interval says:",
        "",
        "| | " + " | ".join(heads) + " |",
        "| --- |" + " --- |" * len(heads),
    ]
    for m in mine:
        done = mine[: mine.index(m)]  # a pair of them is said once
        for o in (x for x in order if x not in (m, base, *done)):
            cells = []
            for c in cols:
                if not {m, o} <= set(c.times):
                    cells.append("-")
                    continue
                v = c.versus(o, m)
                cells.append(f"{v.text()}, {VERDICT[v.verdict]}")
            if any(x != "-" for x in cells):
                out.append(f"| {m} vs {o} | " + " | ".join(cells) + " |")
    return [*out, ""]
