"""REPORT.md's text as a user of their own runs reads it: commands that write where the
report was made from and paste as written, no empty section, headline rows that match
the CSVs, tables that render, and cost to target where a cost is recorded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reproduce.figures import main
from tests.test_figures import _curve, _record


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """A user's runs/: two dawnbench runs, no sweep, one with a cost per hour."""
    d = tmp_path / "runs"
    d.mkdir()
    recs = [_record("u-dense", "dense", 0, 10.0), _record("u-hitopk", "hitopk", 0, 8.0)]
    recs[1]["config"]["results"] = {"cost_per_hour": 3.6}
    (d / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    for r in recs:
        _curve(d / "curves" / f"{r['run_id']}.csv", r["time_to_target_s"])
    return d


def _report(d: Path) -> tuple[str, str]:
    main(["--results-dir", str(d)])
    return (d / "REPORT.md").read_text(), (d / "REPORT-appendix.md").read_text()


def test_a_users_report_suggests_commands_that_write_to_its_runs(runs: Path, capsys) -> None:
    report, appendix = _report(runs)
    capsys.readouterr()
    assert f"--results-dir {runs}`" in report
    assert "--results-dir results`" not in report + appendix
    # every command in backticks is a command alone: its notes stay outside them
    for cmd in re.findall(r"`(python -m reproduce [^`]*)`", report + appendix):
        assert "(" not in cmd.replace("choice(", ""), cmd
    figures = report.split("## Figures")[1].split("\n## ")[0]
    assert figures.strip(), "an empty Figures section"
    assert "REPORT-appendix.md" in figures
