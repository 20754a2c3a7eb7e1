"""Nothing lost, nothing hung: lines of ``runs.jsonl`` that are not records, agents and
workers that stop responding, sweeps that failed on a full disk, concurrent resumes, paths
and values the run would fail on, and the smaller rules of a run's files."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from bench.registry import ConfigError
from bench.results import records
from bench.train import checkpoint as ck
from tests.conftest import REPO, TINY, run_cli
from tests.test_figures import _curve, _record
from tests.test_figures import results as results  # noqa: F401  (the fixture)

BAD_LINES = [
    b'{"run_id": "caf\xe9", "status": "ok"}\n',  # a latin-1 byte
    b'{"note": "merged by hand"}\n',  # JSON, not a record
    b"[1, 2]\n",
]


def _spoil(path: Path) -> None:
    """Put the lines that are not records in the middle of ``path``."""
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:1] + BAD_LINES + lines[1:]))


# 1. readers of runs.jsonl skip lines that are not records; the writer appends


def test_readers_skip_lines_that_are_not_records_naming_file_and_line(tmp_path: Path) -> None:
    records.append_record(tmp_path, {"run_id": "a", "status": "ok"})
    records.append_record(tmp_path, {"run_id": "b", "status": "ok"})
    runs = records.runs_path(tmp_path)
    _spoil(runs)
    with pytest.warns(UserWarning) as caught:
        got = records.load_records(tmp_path)
    assert [r["run_id"] for r in got] == ["a", "b"]
    text = [str(w.message) for w in caught]
    for n, why in ((2, "not UTF-8"), (3, "no run_id"), (4, "not an object")):
        assert any(t.startswith(f"{runs}:{n}: skipped") and why in t for t in text), text
    # the writer appends after them, and keeps every line it found
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        records.append_record(tmp_path, {"run_id": "c", "status": "error"})
        assert [r["run_id"] for r in records.load_records(tmp_path)] == ["a", "b", "c"]
    assert all(line in runs.read_bytes() for line in BAD_LINES)


def test_figures_and_compare_survive_lines_that_are_not_records(
    results: Path,  # noqa: F811
    tmp_path: Path,
    capsys,
) -> None:
    from reproduce import compare, figures

    _spoil(results / "runs.jsonl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        figures.main(["--results-dir", str(results), "--dry-run"])
        compare.main(["r-dense-0", "r-hitopk-0", "--results-dir", str(results),
                      "--out", str(tmp_path / "c.png"), "--dry-run"])  # fmt: skip
    out = capsys.readouterr().out
    assert "r-hitopk-0" in out and "nothing written" in out


def _fake_checkpoint(results: Path, run_id: str, epoch: int = 1, **config) -> Path:
    """A whole (tiny) checkpoint of ``run_id`` with the default config."""
    from tests.test_faults import _config

    cfg = _config(results, *TINY, *(f"{k}={v}" for k, v in config.items()))
    from bench.config import to_container

    d = ck.run_dir(results, run_id) / f"epoch-{epoch:04d}"
    d.mkdir(parents=True)
    torch.save({}, d / "common.pt")
    for r in range(cfg.cluster.nnodes * cfg.cluster.nproc_per_node):
        torch.save({}, d / f"rank{r}.pt")
    run = {"run_id": run_id, "started_at": "x", "launch_time": time.time(), "experiment": "e"}
    manifest = {
        "config": to_container(cfg), "epoch": epoch, "step": 1,
        "world_size": cfg.cluster.nnodes * cfg.cluster.nproc_per_node,
        "train_time_s": 1.0, "curve": [], "status": "running", "run": run,
        "saved_at": time.time(), "files": ck.shard_sizes(d), "evals": None,
    }  # fmt: skip
    d.with_suffix(".json").write_text(json.dumps(manifest))
    return d


def test_a_resume_reads_past_lines_that_are_not_records(tmp_path: Path) -> None:
    from bench.launch.run import prepare_resume

    _fake_checkpoint(tmp_path, "r1")
    records.append_record(tmp_path, {"run_id": "r1", "status": "interrupted"})
    _spoil(records.runs_path(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg, meta, _ = prepare_resume("r1", [f"results.dir={tmp_path}"], dry=True)
    assert meta["attempt"] == 2
