"""README's answer is REPORT.md's: the block at the top of README.md is the committed
report's answer section, so no headline number of the README can contradict the report."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.report import answer as readme

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_answer_block_is_the_reports() -> None:
    text = (ROOT / "README.md").read_text()
    report = (ROOT / "results" / "REPORT.md").read_text()
    assert readme.block_of(text) == readme.answer_of(report), (
        "README's answer is stale: python -m bench.report.answer rewrites it"
    )
    first = "\n".join(text.splitlines()[:45])
    assert "## The answer" in first and "**Setting:**" in first
    assert re.search(r"\[\d+\.\d+, \d+\.\d+\]", first)  # intervals, on the first screen


def test_the_block_is_rewritten_from_a_report_and_checked(tmp_path: Path) -> None:
    report = "# R\n\n## The answer\n\nTable: `ablation/s.csv`.\n\n## Figures\n\nx\n"
    md = tmp_path / "README.md"
    md.write_text(f"# T\n\n{readme.START}\nold\n{readme.END}\n\n## Quick start\n")
    rp = tmp_path / "REPORT.md"
    rp.write_text(report)
    assert readme.main(["--readme", str(md), "--report", str(rp), "--check"]) == 1
    assert readme.main(["--readme", str(md), "--report", str(rp)]) == 0
    assert readme.block_of(md.read_text()) == "Table: `results/ablation/s.csv`."
    assert md.read_text().endswith("\n\n## Quick start\n")  # the rest untouched
    assert readme.main(["--readme", str(md), "--report", str(rp), "--check"]) == 0
    with pytest.raises(ValueError, match="no '## The answer'"):
        readme.answer_of("# R\n")
