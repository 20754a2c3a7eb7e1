"""A run's closing lines: every file it wrote, and how it compares with its recipe's
reference record."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from shlex import quote
from typing import Any

from bench.results.events import events_path, run_dir
from bench.results.paths import RUNS_DIR
from bench.results.records import load_records, runs_path

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


# what makes two runs the same recipe, for the comparison with the reference record
RECIPE = ("experiment", "model", "data", "comm", "comm_density", "cache", "update", "optimizer",
          "world_size", "nnodes", "target_metric", "target_value")  # fmt: skip
REFERENCE_DIR = "results"  # the committed reference results


def reference_record(
    record: Mapping[str, Any], reference_dir: str | Path = REFERENCE_DIR
) -> dict[str, Any] | None:
    """The newest committed run of the same recipe that reached its target, on the same
    hardware where there is one."""
    same = [
        r
        for r in load_records(reference_dir, attempts=True)
        if r.get("run_id") != record.get("run_id")
        and r.get("status") == "ok"
        and r.get("time_to_target_s") is not None
        and all(r.get(k) == record.get(k) for k in RECIPE)
    ]
    if not same:
        return None
    here = [r for r in same if r.get("hardware") == record.get("hardware")]
    return max(here or same, key=lambda r: str(r.get("started_at", "")))


def target_margin(record: Mapping[str, Any]) -> str | None:
    """For the digits data, the best accuracy as held-out images and by how many it cleared
    the target (98.06 % is 353 of 360 images, the least that reaches 98 %)."""
    import math

    from bench.data import heldout_size

    best, target = record.get("best_value"), record.get("target_value")
    if record.get("data") != "digits" or best is None or target is None:
        return None
    frac = ((record.get("config") or {}).get("data") or {}).get("test_fraction", 0.2)
    n = heldout_size(frac)
    right, need = round(best * n), math.ceil(target * n - 1e-9)
    verdict = (
        f"the target ({100 * target:g} % = {need} images) met with {right - need} to spare"
        if right >= need
        else f"{need - right} image(s) short of the target ({100 * target:g} % = {need} images)"
    )
    return f"best {100 * best:.2f} % is {right} of {n} held-out images: {verdict}"


def comparison_lines(
    record: Mapping[str, Any],
    reference_dir: str | Path = REFERENCE_DIR,
    results_dir: str | Path = RUNS_DIR,
) -> list[str]:
    """The run against its recipe's reference record, and a suggested next command."""
    out = [m] if (m := target_margin(record)) else []
    ref = reference_record(record, reference_dir)
    yours = record.get("time_to_target_s")
    if ref is not None:
        rt = float(ref["time_to_target_s"])
        mine = (
            f"yours: {yours:.1f} s ({yours / rt:.2f} x)" if yours is not None else
            "yours: target not reached"
        )  # fmt: skip
        out.append(f"reference: {rt:.1f} s ({ref['run_id']}, {ref.get('hardware')}); {mine}")
        # compare looks in runs/ then results/ by default; elsewhere, both named
        both = "".join(f" --results-dir {quote(str(d))}" for d in (results_dir, reference_dir))
        dirs = "" if Path(results_dir) == Path(RUNS_DIR) else both
        png = Path(results_dir) / "figures" / f"compare-{record['run_id']}.png"
        ids = f"{record['run_id']} {ref['run_id']}"
        out.append(f"next: python -m reproduce compare {ids}{dirs} --out {quote(str(png))}")
    else:
        out.append(f"reference: no committed run of this recipe in {reference_dir}/runs.jsonl")
        here = Path(results_dir) == Path(RUNS_DIR)
        where = "" if here else f" --results-dir {quote(str(results_dir))}"
        out.append(f"next: python -m reproduce figures{where}   (this run beside the others)")
    return out


def closing_lines(record: Mapping[str, Any], results_dir: str | Path) -> str:
    return "wrote:\n" + "\n".join(f"  {w:<{WIDTH}}  {p}" for w, p in written(record, results_dir))
