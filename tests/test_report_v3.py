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
    # a claim's evidence names which measured column each comparison is from
    from bench.report.claims import _compared

    _, lines = _compared(cols, {"dawnbench_digits": "link"}, lambda c: [("hitopk", "dense")])
    assert "measured at 1.34 (2 x 2): hitopk vs dense" in lines[0]
    assert "measured at 5.37 (2 x 2): hitopk vs dense" in lines[0]
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


def test_a_workload_without_a_v3_table_names_its_sweep_under_way_and_the_answer_it_replaces(
    tmp_path,
):
    """The answer never says "no sweep" of a workload whose v3 sweep is running: it names
    that sweep with its recorded runs, and the older protocol's table it will replace."""
    import json

    from bench.report import tables

    folder = tmp_path / "ablation"
    folder.mkdir()
    exp, v3 = "transformer_protocol", answer.protocol.NAME

    def plan(sid: str, name: str, table: bool) -> None:
        (folder / f"{sid}.plan.json").write_text(json.dumps({"name": name, "experiment": exp}))
        if table:
            (folder / f"{sid}.csv").write_text("comm\n")

    assert tables.not_yet(exp, tmp_path, []) == ""
    plan("ablation-1-old", "equal-budget-v2", table=True)
    plan("ablation-2-new", v3, table=False)
    plan("ablation-3-other", v3, table=False)  # another workload's: not this one's
    (folder / "ablation-3-other.plan.json").write_text(
        json.dumps({"name": v3, "experiment": "dawnbench_digits"})
    )
    runs = [{"config": {"results": {"sweep_id": "ablation-2-new"}}}] * 3
    runs += [{"config": {"results": {"sweep_id": "ablation-1-old"}}}]
    said = tables.not_yet(exp, tmp_path, runs)
    assert said.startswith(f"its `{v3}` sweep `ablation-2-new` is under way (3 runs recorded;")
    assert "--resume ablation-2-new" in said and "ablation-3-other" not in said
    assert "partial" not in said  # no table of it yet
    (folder / "partial").mkdir()
    (folder / "partial" / "ablation-2-new.csv").write_text("comm\n")  # the stages so far
    said = tables.not_yet(exp, tmp_path, runs)
    assert "(3 runs recorded; its tables so far: `ablation/partial/ablation-2-new*.csv`;" in said
    assert said.endswith(
        "answer it replaces, whose faults v3 fixes (docs/protocol.md, "
        "History), is `ablation/ablation-1-old.csv`"
    )
    (folder / "ablation-2-new.csv").write_text("comm\n")  # landed: no longer under way
    assert "under way" not in tables.not_yet(exp, tmp_path, runs)


def test_a_projection_scales_by_the_carry_over_only_where_steps_do_not_carry_over(swept):
    """hitopk needs relatively more steps at 8 nodes (1.5 against dense's 0.9 in the fake):
    its projected times are its evaluation seeds' times x that factor, every other method's,
    dense's included, stay at 2 nodes, and the factor's interval widens the band only where
    it applies."""
    from bench.report import versus

    df = pd.read_csv(swept / "ablation" / f"{SWEEP}.csv")
    proj = df[df["ratio"].notna()]
    hit, others = proj[proj["comm"] == "hitopk"], proj[proj["comm"] != "hitopk"]
    assert (hit["steps_factor"] - 1.5 / 0.9).abs().max() < 0.1
    assert (others["steps_factor"] == 1).all() and df[df["ratio"].isna()][
        "steps_factor"
    ].isna().all()
    # every projected row keeps all its evaluation seeds, the 2-node runs
    evals = df[df["ratio"].isna()].set_index(["for_cluster", "comm"])["n_runs"]
    assert set(proj["n_runs"]) == {int(evals.max())}
    records = load_records(swept)
    cols = versus.columns(swept, df, records)
    col = next(c for c in cols if not c.measured)
    assert len(col.times["hitopk"]) == len(col.times["dense"])  # corners aligned
    row = proj[(proj["for_cluster"] == col.cluster) & (proj["comm"] == "hitopk")].iloc[0]
    assert col.mean("hitopk") == pytest.approx(row["time_to_target_mean_s"], rel=1e-6)
    v = col.versus("dense", "hitopk")
    assert v.speedup == pytest.approx(row["speedup_vs_dense"], rel=1e-6)
    assert v.band_high - v.band_low > v.high - v.low
    # the factor's corners: the same times for a method without one, apart for hitopk
    assert col.times["diloco"][0] == col.times["diloco"][1] == col.times["diloco"][2]
    assert col.times["hitopk"][1] != col.times["hitopk"][0] != col.times["hitopk"][2]


def test_the_ratios_figure_takes_the_carry_over_factor_too(swept):
    """The composed figure across ratios prices hitopk's runs with the same factor as the
    table: at the headline cluster's ratio the two times agree."""
    from bench.report.figures import HEADLINE, ratios_table

    df = pd.read_csv(swept / "ablation" / f"{SWEEP}.csv")
    row = df[(df["for_cluster"] == HEADLINE) & (df["comm"] == "hitopk")].iloc[0]
    comp = ratios_table(swept, df)
    at = comp[(comp["comm"] == "hitopk") & (comp["vs_role"] == "dense")]
    near = at.iloc[(at["ratio"] - row["ratio"]).abs().argsort()[:1]].iloc[0]
    assert near["ratio"] == pytest.approx(row["ratio"], rel=1e-6)
    assert near["time_to_target_s"] == pytest.approx(row["time_to_target_mean_s"], rel=1e-3)
