"""README's answer is REPORT.md's: the block at the top of README.md is the committed
report's answer section, so no headline number of the README can contradict the report."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.report import answer as readme

ROOT = Path(__file__).resolve().parents[1]


def block_of(text: str, start: str = readme.START, end: str = readme.END) -> str:
    """README's block between the markers."""
    assert start in text and end in text, "README.md has no such block (its markers)"
    return text.split(start, 1)[1].split(end, 1)[0].strip("\n")


def test_the_readme_answer_block_is_the_reports() -> None:
    text = (ROOT / "README.md").read_text()
    report = (ROOT / "results" / "REPORT.md").read_text()
    assert block_of(text) == readme.answer_of(report), (
        "README's answer is stale: python -m bench.report.answer rewrites it"
    )
    assert readme.rewrite(text, report, ROOT / "results") == text, (
        "README's hardware counts are stale: python -m bench.report.answer counts them"
    )
    first = "\n".join(text.splitlines()[:45])
    assert "## The answer" in first and "**Setting:**" in first
    assert re.search(r"\[\d+\.\d+, \d+\.\d+\]", first)  # intervals, on the first screen


def test_the_readme_answer_fits_one_screen_measured_first() -> None:
    """At most 20 lines: a verdict per workload and one small table whose measured column
    comes before the projected ones, each marked so; the long form stays in REPORT.md."""
    block = block_of((ROOT / "README.md").read_text())
    lines = block.splitlines()
    assert len(lines) <= 20, f"README's answer block has {len(lines)} lines"
    assert "measured" in block and "projected" in block
    head = next(ln for ln in lines if ln.startswith("| ") and "measured" in ln)
    assert head.index("measured") < head.index("projected")
    assert "results/REPORT.md" in block
    verdicts = [ln for ln in lines if ln.startswith("- **")]
    assert len(verdicts) >= 1 and all(ln.count(". ") == 0 for ln in verdicts)  # one sentence


def test_the_block_is_rewritten_from_a_report_and_checked(tmp_path: Path) -> None:
    report = "# R\n\n## The answer\n\nTable: `ablation/s.csv`.\n\n## Figures\n\nx\n"
    md = tmp_path / "README.md"
    md.write_text(f"# T\n\n{readme.START}\nold\n{readme.END}\n\n## Quick start\n")
    rp = tmp_path / "REPORT.md"
    rp.write_text(report)
    assert readme.main(["--readme", str(md), "--report", str(rp), "--check"]) == 1
    assert readme.main(["--readme", str(md), "--report", str(rp)]) == 0
    assert block_of(md.read_text()) == "Table: `results/ablation/s.csv`."
    assert md.read_text().endswith("\n\n## Quick start\n")  # the rest untouched
    assert readme.main(["--readme", str(md), "--report", str(rp), "--check"]) == 0
    with pytest.raises(ValueError, match="no '## The answer'"):
        readme.answer_of("# R\n")


@pytest.mark.filterwarnings("ignore:.*skipped, not a run record")
def test_the_hardware_block_counts_every_record_by_machine(tmp_path: Path) -> None:
    """Each machine named by a record, its count and its first and last day; a line that
    is not a record is skipped, a record without the field is counted as not recorded."""
    import json

    runs = tmp_path / "runs.jsonl"
    recs = [
        {"run_id": "a", "hardware": "CPU A", "started_at": "2026-12-01T10:00:00+00:00"},
        {"run_id": "b", "hardware": "CPU A", "started_at": "2026-12-03T10:00:00+00:00"},
        {"run_id": "c", "hardware": "GPU B", "started_at": "2026-11-30T10:00:00+00:00"},
        {"run_id": "d", "started_at": "2026-11-30T11:00:00+00:00"},
    ]
    runs.write_text("\n".join(json.dumps(r) for r in recs) + "\n{broken\n")
    with pytest.warns(UserWarning, match="skipped, not a run record"):
        lines = readme.hardware_lines(tmp_path)
    assert lines == [
        "- 2 records: CPU A (2026-12-01 to 2026-12-03)",
        "- 1 record: GPU B (2026-11-30)",
        "- 1 record: not recorded (2026-11-30)",
    ]
    md = tmp_path / "README.md"
    md.write_text(
        f"# T\n\n{readme.START}\nold\n{readme.END}\n\n{readme.HW_START}\n- 9 records: x\n"
        f"{readme.HW_END}\n"
    )
    rp = tmp_path / "REPORT.md"
    rp.write_text("# R\n\n## The answer\n\nA.\n")
    args = ["--readme", str(md), "--report", str(rp), "--results-dir", str(tmp_path)]
    assert readme.main([*args, "--check"]) == 1
    assert readme.main(args) == 0
    assert block_of(md.read_text(), readme.HW_START, readme.HW_END).startswith("- 2 records: CPU A")
    assert readme.main([*args, "--check"]) == 0


def test_a_run_kept_out_of_its_measured_row_is_said_and_drawn_on_no_clock() -> None:
    """A measured row with a run on another CPU kind kept out (``--keep-out``): the answer's
    legend gives that row's seeds and says which ran where; the clock figures leave the
    run out while a projection that counts it keeps it."""
    import pandas as pd

    from bench.report import answer as ans
    from bench.report import figures

    ten = " ".join(f"r{i}" for i in range(10))
    df = pd.DataFrame([
        {"for_cluster": "measured-5.37", "comm": "hitopk", "n_runs": 9, "run_ids": ten[:-3],
         "kept_out": "seed 9: r9 on AMD EPYC"},
        {"for_cluster": "paper", "comm": "hitopk", "n_runs": 10, "run_ids": ten, "kept_out": None},
    ])  # fmt: skip
    said = ans.kept_out_text("transformer_protocol", df)
    assert said == [
        "9 for transformer_protocol's hitopk measured at 5.37: its seed 9 ran on AMD EPYC, "
        "another CPU kind, and is kept out of that column (its steps count in the projections)"
    ]
    assert "[95 % interval over 10 evaluation seeds; 9 for transformer" in ans.legend_line(
        10, True, said
    )
    assert figures.kept_out_ids(df) == {"r9"} and "r9" in figures.table_run_ids(df)
    assert ans.kept_out_text("x", df.drop(columns="kept_out")) == []  # an older table
    assert ans.kept_out_clause(df) == (
        " (1 of them on another CPU kind, kept out of its measured row: hitopk's seed 9 at "
        "measured-5.37 on AMD EPYC)"
    )
    assert ans.kept_out_clause(df.drop(columns="kept_out")) == ""
