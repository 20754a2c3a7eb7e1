"""A sweep's saved plan, the jobs still to run, and where a complete or a partial table
goes (docs/internals/sweeps.md)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from bench.registry import ConfigError
from bench.results import whole
from bench.sweeps.common import write_table

RERUN = ("interrupted",)  # statuses whose job is run again
RERUN_FAILED = ("interrupted", "error")  # with --rerun-failed
KeyOf = Callable[[Mapping[str, Any]], Hashable | None]


def plan_dict(plan: Any, skip: Sequence[str] = ("notes",)) -> dict[str, Any]:
    d = dataclasses.asdict(plan)
    for k in skip:
        d.pop(k, None)
    return json.loads(json.dumps(d))


def save_plan(plan: Any, path: Path, compare_skip: Sequence[str] = ()) -> Path:
    """Write ``plan`` at ``path``; an existing plan that differs (but in ``compare_skip``)
    is refused, naming the fields, and never replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    d = plan_dict(plan)
    if path.exists():
        old = json.loads(path.read_text())
        diff = sorted(k for k in set(d) | set(old)
                      if k not in compare_skip and d.get(k) != old.get(k))  # fmt: skip
        if diff:
            raise ConfigError(
                f"{path} exists with another plan (differs in {', '.join(diff)}); it is not "
                "replaced: rerun the command it was made by, or give a new sweep id"
            )
        return path
    whole.write(path, json.dumps(d, indent=1, sort_keys=True) + "\n")
    return path


RUN_FIELDS = ("launcher", "launcher_overrides")  # how a sweep runs, not what: may change


class Saved:
    """``save``/``load`` of a plan dataclass at ``<results>/<FOLDER>/<sweep_id><SUFFIX>``."""

    FOLDER, SUFFIX, WHAT = "", ".plan.json", "sweep"

    def path(self) -> Path:
        return Path(self.results_dir) / self.FOLDER / f"{self.sweep_id}{self.SUFFIX}"  # type: ignore[attr-defined]

    def save(self) -> Path:
        return save_plan(self, self.path(), compare_skip=RUN_FIELDS)

    @classmethod
    def load(cls, results_dir: str | Path, sweep_id: str) -> Any:
        """The saved plan (unknown keys ignored), or ConfigError."""
        path = Path(results_dir) / cls.FOLDER / f"{sweep_id}{cls.SUFFIX}"
        if not path.exists():
            raise ConfigError(
                f"no {cls.WHAT} plan {path}: not such a sweep, or another results dir"
            )
        d = json.loads(path.read_text())
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        kw = {k: v for k, v in d.items() if k in known}
        for k, v in kw.items():  # JSON lists back to the tuples the plan holds
            if isinstance(v, list) and v and isinstance(v[0], list):
                kw[k] = tuple(tuple(x) for x in v)
        return cls(**kw)


def latest(
    records: Sequence[Mapping[str, Any]], key_of: KeyOf, rerun: Sequence[str] = RERUN
) -> dict[Hashable, dict[str, Any]]:
    """Job key -> its latest record, but those to run again (``rerun``: status or run id)."""
    last: dict[Hashable, dict[str, Any]] = {}
    for r in records:
        k = key_of(r)
        if k is not None:
            last[k] = dict(r)
    again = set(rerun)
    return {
        k: r
        for k, r in last.items()
        if r.get("status") not in again and str(r.get("run_id")) not in again
    }


def pending(
    keys: Sequence[Hashable],
    records: Sequence[Mapping[str, Any]],
    key_of: KeyOf,
    rerun: Sequence[str] = RERUN,
) -> list[int]:
    done = latest(records, key_of, rerun)
    return [i for i, k in enumerate(keys) if k not in done]


def progress(
    stage: str, keys: Sequence[Hashable], records: Sequence[Mapping[str, Any]], key_of: KeyOf
) -> str:
    """One line: how many of a stage's jobs are recorded, by status, and how many not."""
    last: dict[Hashable, str] = {}
    for r in records:
        k = key_of(r)
        if k is not None:
            last[k] = str(r.get("status"))
    got = [last[k] for k in keys if k in last]
    counts = pd.Series(got, dtype=object).value_counts().to_dict() if got else {}
    by = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    missing = len(keys) - len(got)
    return (
        f"{stage}: {len(got)} of {len(keys)} recorded"
        + (f" ({by})" if by else "")
        + (f", {missing} without a record" if missing else "")
    )


def table_path(results_dir: str | Path, kind: str, sweep_id: str, complete: bool) -> Path:
    d = Path(results_dir) / kind
    return d / f"{sweep_id}.csv" if complete else d / "partial" / f"{sweep_id}.csv"


def write_sweep_table(
    df: pd.DataFrame, results_dir: str | Path, kind: str, sweep_id: str, complete: bool
) -> tuple[Path, bool]:
    """(path, whether written): a table with jobs missing or ``error`` runs goes to
    ``partial/``, replaced by each later one; a complete one is never replaced, and removes
    the partial one."""
    errors = int(df["n_error"].fillna(0).sum()) if "n_error" in df.columns else 0
    complete = complete and not errors
    path = table_path(results_dir, kind, sweep_id, complete)
    if complete:
        wrote = write_table(df, path)
        table_path(results_dir, kind, sweep_id, False).unlink(missing_ok=True)
        return path, wrote
    path.parent.mkdir(parents=True, exist_ok=True)
    whole.write(path, df.to_csv(index=False))
    return path, True
