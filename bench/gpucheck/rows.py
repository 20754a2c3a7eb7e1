"""A torch-only gpucheck step's rows: each printed and appended to ``<out>.jsonl`` as measured
(a step killed at its cap keeps them); its end writes ``<out>``.  Standard library only."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def fmt(row: dict[str, Any]) -> str:
    """``key=value ...`` of one row (floats to 4 significant digits)."""
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())


class Rows:
    """``out=""``: in memory only; ``fresh=False``: appended to what another process of the
    step wrote (a worker of the hooks step)."""

    def __init__(self, step: str, out: str = "", fresh: bool = True) -> None:
        self.step, self.out, self.rows = step, out, []
        self.path = Path(out).with_suffix(".jsonl") if out else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if fresh:
                self.path.write_text("")
                Path(out).unlink(missing_ok=True)  # an earlier run's result is not this one's

    def add(self, row: dict[str, Any], line: str = "") -> None:
        self.rows.append(row)
        print(line or f"{self.step}: {fmt(row)}", flush=True)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def finish(self, **extra: Any) -> dict[str, Any]:
        data = {"check": self.step, "rows": self.rows, **extra}
        if self.out:
            Path(self.out).write_text(json.dumps(data, indent=1))
        return data


def read(out: str | Path) -> tuple[dict[str, Any], bool]:
    """(a step's result, complete): its JSON file, else the rows it appended."""
    if Path(out).is_file():
        return json.loads(Path(out).read_text()), True
    p = Path(out).with_suffix(".jsonl")
    rows = []
    for ln in p.read_text().splitlines() if p.is_file() else []:
        try:
            rows.append(json.loads(ln))
        except ValueError:  # blank, or cut short by the kill
            continue
    return {"rows": rows}, False
