"""The closing lines of a run: every file it wrote, from its record (printed by rank 0, or
by the launcher when the workers died first).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.results.events import events_path, run_dir
from bench.results.records import runs_path

# record field -> what the file is, in the order they are listed
FIELDS = (
    ("curve", "curve"),
    ("figure", "time-to-accuracy plot"),
    ("dawnbench_json", "DAWNBench JSON"),
    ("dawnbench_tsv", "DAWNBench TSV"),
    ("mllog", "MLPerf log"),
    ("translations", "translations"),
)
WIDTH = max(len(what) for _, what in FIELDS)  # one column of names, whichever files exist


def written(record: Mapping[str, Any], results_dir: str | Path) -> list[tuple[str, str]]:
    """(what, path) for each file of the run that exists: its record, the files the
    record names, its checkpoints and its event log."""
    run_id = str(record["run_id"])
    out = [("record", f"{runs_path(results_dir)} (run {run_id})")]
    for key, what in FIELDS:
        path = record.get(key)
        if isinstance(path, str) and Path(path).is_file():
            out.append((what, path))
    ckpts = run_dir(results_dir, run_id)
    kept = sorted(p.name for p in ckpts.glob("epoch-*.json")) if ckpts.is_dir() else []
    if kept:
        out.append(("checkpoints", f"{ckpts}/ ({len(kept)} kept, the newest {kept[-1][:-5]})"))
    events = events_path(results_dir, run_id)
    if events.is_file():
        out.append(("event log", str(events)))
    return out


def closing_lines(record: Mapping[str, Any], results_dir: str | Path) -> str:
    """``wrote:`` and one indented line per file of :func:`written`."""
    files = written(record, results_dir)
    return "wrote:\n" + "\n".join(f"  {w:<{WIDTH}}  {p}" for w, p in files)
