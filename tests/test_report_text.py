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
    (d / "bench").mkdir()  # a benchmark with no one-line headline, 3 rows
    (d / "bench" / "comm.csv").write_text("bench_id,hardware,x\n" + "b1,cpu,1\n" * 3)
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
    # a benchmark with rows but no headline is not reported as never run
    assert "3 rows in [bench/comm.csv](bench/comm.csv)" in report
    assert "No rows recorded yet: `python -m reproduce bench comm`" not in report
    # every table row has its header's number of cells (no cell broken by a line break)
    for text in (report, appendix):
        width = None
        for line in text.splitlines():
            if not line.startswith("|"):
                width = None
                continue
            cells = len(re.split(r"(?<!\\)\|", line))
            width = width or cells
            assert cells == width, line[:200]
    # cost to target where the run recorded its price (3.6 USD/h x 8 s), none invented
    assert set(re.findall(r"\$[\d.,]+", report + appendix)) == {"$0.008"}
    assert "cost to target (mean, USD)" in appendix and "not recorded" in appendix


def test_a_table_cell_keeps_its_row_whole() -> None:
    from bench.report.tables import table_cell

    assert table_cell("a | b\n\nmore text") == "a \\| b more text"


@pytest.mark.parametrize("cost", [None, 3.6])
def test_dawnbench_entry_gives_cost_to_target_only_when_priced(cost: float | None) -> None:
    from bench.results.dawnbench import entry

    rec = _record("p", "dense", 0, 10.0, model="resnet9", started_at="2026-01-01T00:00:00")
    rec["config"]["results"] = {} if cost is None else {"cost_per_hour": cost}
    e = entry(rec)
    assert e.get("costPerHour") == cost
    assert e["misc"]["costToTargetUSD"] == (None if cost is None else pytest.approx(0.01))
