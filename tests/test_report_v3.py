"""The answer from a whole v3 sweep (run by a fake runner, tests/fake_sweep.py): measured
columns at the named ratios first, each cell beside the model's prediction, the projections
with their band, the prediction table with its errors and the steps carry-over table."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from bench.report import answer
from bench.results.records import load_records
from tests.fake_sweep import run_sweep

SWEEP = "fv3"


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("v3")
    mp = pytest.MonkeyPatch()
    try:
        argv = ["--workload", "image", "--comm", "dense,hitopk,diloco", "--seeds", "3"]
        run_sweep(base, mp, *argv, "--sweep-id", SWEEP)
    finally:
        mp.undo()
    return base


def test_the_answer_leads_with_the_measured_ratios_beside_the_models_prediction(swept) -> None:
    table = swept / "ablation" / f"{SWEEP}.csv"
    short, detail, _, cols = answer.answer_sections(
        load_records(swept), {"dawnbench_digits": table}, swept
    )
    text = "\n".join(short)
    head = next(ln for ln in short if ln.startswith("| ") and "measured" in ln)
    cells = [c.strip() for c in head.split("|")[2:-1]]
    assert cells[:2] == [
        "**measured** at 1.34: emulated 2 x 2",
        "**measured** at 5.37: emulated 2 x 2",
    ]
    assert all(c.startswith("**projected**") for c in cells[2:])
    row = next(ln for ln in short if ln.startswith("| hitopk vs dense"))
    measured, projected = row.split("|")[2:4], row.split("|")[4:-1]
    assert all("(model " in c and "band" not in c for c in measured)
    assert all("band [" in c for c in projected)
    assert "measured at 1.34: " in text and "measured at 5.37: " in text
    assert "Mbit/s (ratio 1.3" in text and "for 5.37" in text  # each shaped link in the setting
    # the prediction beside the measurement, per method and measured cluster, with its error
    m = pd.read_csv(swept / "ablation" / f"{SWEEP}-measured.csv")
    rows = [ln for ln in detail if ln.startswith("| 1.34 |") or ln.startswith("| 5.37 |")]
    assert len(rows) == len(m) == 2 * 3
    assert all(ln.rstrip(" |").endswith("%") for ln in rows)
    assert any(ln.startswith("Median size of the error over the methods: ") for ln in detail)
    # the carry-over: every selected configuration, and what it changed
    carry = pd.read_csv(swept / "ablation" / f"{SWEEP}-carryover.csv")
    assert sum(ln.startswith(("| dense | `", "| hitopk | `", "| diloco | `")) for ln in detail) == (
        len(carry)
    )
    assert any(ln.startswith("What it changed: ") for ln in detail)
    assert [c.cluster for c in cols["dawnbench_digits"]][:2] == ["measured-1.34", "measured-5.37"]


def test_the_setting_names_the_workload_whose_numbers_are_an_older_protocols() -> None:
    """While one workload's v3 sweep has landed and the other's not, the Setting says which
    numbers are the older protocol's, and says nothing once both are v3."""
    v3 = answer.protocol.NAME
    mixed = answer.older_standing({"dawnbench_digits": v3, "transformer_tiny": "equal-budget-v2"})
    assert mixed.startswith(" The transformer_tiny numbers are from sweeps of `equal-budget-v2`")
    assert "dawnbench_digits" not in mixed and mixed.endswith(f"`{v3}` sweep of it has landed yet.")
    both = answer.older_standing({"a": "equal-budget-v2", "b": "equal-budget-v2"})
    assert both.startswith(" The a and b numbers") and "sweep of them has" in both
    assert answer.older_standing({"dawnbench_digits": v3, "transformer_tiny": v3}) == ""
