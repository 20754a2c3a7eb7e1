"""DAWNBench submission files: the entries repository's checks, reimplemented, pass on the
files of a run that reached its target and fail the threshold of one that did not."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest

from bench.config import Config, to_container
from bench.results import dawnbench
from bench.results.records import RunRecord

REQUIRED = ("version", "author", "authorEmail", "framework", "model", "hardware", "timestamp")
# the entries repository's categories: the TSV columns of a top-1 and a top-5 target
COLUMNS = {
    "top1": ["epoch", "hours", "top1Accuracy"],
    "top5": ["epoch", "hours", "top1Accuracy", "top5Accuracy"],
}


def entries_problems(json_path: str, metric: str, threshold_pct: float) -> list[str]:
    """What the DAWNBench entries repository's submission tests would reject: the JSON
    must parse and carry the required fields, a YYYY-MM-DD timestamp and version v1.0;
    the TSV beside it must have exactly the category's columns, at least one row, and a
    row at or above the threshold."""
    problems = []
    record = json.loads(Path(json_path).read_text())
    problems += [f"missing {f}" for f in REQUIRED if f not in record]
    try:
        datetime.strptime(record.get("timestamp", ""), "%Y-%m-%d")
    except ValueError:
        problems.append("timestamp is not YYYY-MM-DD")
    if record.get("version") != "v1.0":
        problems.append(f"version {record.get('version')!r}")
    tsv = Path(json_path).with_suffix(".tsv")
    if not tsv.exists():
        return [*problems, "no TSV"]
    df = pd.read_csv(tsv, sep="\t")
    if sorted(df.columns) != sorted(COLUMNS[metric]):
        problems.append(f"columns {list(df.columns)}")
    if len(df) == 0:
        problems.append("empty TSV")
    field = f"{metric}Accuracy"
    if field in df and not df[field].max() >= threshold_pct:
        problems.append("no row reaches the threshold")
    return problems


def _curve(top1: list[float], top5: list[float] | None = None) -> list[dict]:
    nan = float("nan")
    rows = []
    for i, a in enumerate(top1, 1):
        rows.append(
            {
                "epoch": i,
                "clock/train_s": 360.0 * i,  # 0.1 h per epoch
                "acc/top1": a,
                "acc/top5": top5[i - 1] if top5 else (nan if math.isnan(a) else min(1, a + 0.1)),
            }
        )
    return rows


def _record(curve: list[dict], metric: str = "top1", target: float = 0.9, **results) -> dict:
    cfg = to_container(Config())
    cfg["results"].update(results)
    cfg["data"]["progressive"] = [[0, 24], [2, 32]]
    rec = RunRecord(
        run_id="20260101-000000-abcdef",
        started_at="2026-01-01T00:00:00+00:00",
        status="error",
        experiment="dawnbench_digits",
        model="resnet9",
        data="digits",
        comm="hitopk",
        comm_density=0.01,
        comm_warmup_epochs=1,
        comm_density_schedule=[],
        update="flat",
        optimizer="sgd",
        cache="none",
        loader="torch",
        world_size=4,
        nnodes=2,
        target_metric=metric,
        target_value=target,
        torch_version="2.14.1",
        hardware="CPU test machine",
        config=cfg,
    )
    reached = any(r.get(f"acc/{metric}", 0) >= target for r in curve)
    rec = rec.finish(
        curve,
        status="ok" if reached else "target_missed",
        train_time_s=curve[-1]["clock/train_s"],
        world_size=4,
        launch_time=0.0,
    )
    return rec.to_dict()


def test_a_run_that_reached_its_top1_target_passes_the_entries_checks(tmp_path: Path) -> None:
    nan = float("nan")
    curve = _curve([0.5, nan, 0.91, 0.93])  # epoch 2 was not evaluated
    rec = _record(curve, author="Jane Doe", author_email="jane@example.org", cost_per_hour=3.06)
    js, tsv = dawnbench.write(tmp_path, rec, curve)
    assert js == str(tmp_path / "dawnbench" / f"{rec['run_id']}.json")
    assert tsv == str(Path(js).with_suffix(".tsv"))
    assert entries_problems(js, "top1", 90.0) == []
    df = pd.read_csv(tsv, sep="\t")
    assert list(df["epoch"]) == [1, 3, 4]  # evaluated epochs only
    assert df["hours"].tolist() == pytest.approx([0.1, 0.3, 0.4])
    assert df["top1Accuracy"].tolist() == pytest.approx([50.0, 91.0, 93.0])  # percent
    d = json.loads(Path(js).read_text())
    assert (d["author"], d["authorEmail"], d["costPerHour"]) == (
        "Jane Doe",
        "jane@example.org",
        3.06,
    )
    assert d["timestamp"] == "2026-01-01" and d["framework"] == "PyTorch 2.14.1"
    m = d["misc"]
    assert m["reachedTarget"] is True and m["epochsToTarget"] == 3
    assert m["timeToTargetHours"] == pytest.approx(0.3)
    assert m["imageSizes"] == [24, 24, 32, 32]  # data.progressive, per epoch run
    assert m["communication"] == {
        "method": "hitopk",
        "density": 0.01,
        "warmupEpochs": 1,
        "densitySchedule": [],
    }
    assert m["updateMode"] == "flat" and m["optimizer"]["name"] == "sgd"


def test_a_top5_target_writes_both_accuracy_columns(tmp_path: Path) -> None:
    curve = _curve([0.6, 0.75], top5=[0.85, 0.94])
    rec = _record(curve, metric="top5", target=0.93)
    js, tsv = dawnbench.write(tmp_path, rec, curve)
    assert entries_problems(js, "top5", 93.0) == []
    assert list(pd.read_csv(tsv, sep="\t").columns) == COLUMNS["top5"]
    # ImageNet's category wants 4 columns: a top-1 TSV would be rejected there
    assert entries_problems(js, "top1", 0.0) == ["columns " + str(COLUMNS["top5"])]


def test_a_missed_target_writes_files_that_fail_the_threshold(tmp_path: Path) -> None:
    curve = _curve([0.5, 0.8])
    rec = _record(curve, target=0.9)
    js, _ = dawnbench.write(tmp_path, rec, curve)
    assert json.loads(Path(js).read_text())["misc"]["reachedTarget"] is False
    assert entries_problems(js, "top1", 90.0) == ["no row reaches the threshold"]


def test_unset_author_is_said_and_an_unknown_cost_left_out(tmp_path: Path, capsys) -> None:
    curve = _curve([0.95])
    js, _ = dawnbench.write(tmp_path, _record(curve), curve)
    d = json.loads(Path(js).read_text())
    assert d["author"] == d["authorEmail"] == "unknown" and "costPerHour" not in d
    assert "results.author" in capsys.readouterr().out
    assert entries_problems(js, "top1", 90.0) == []  # non-empty placeholders pass
    # once per results directory: a second run there is not told again
    rec2 = dict(_record(curve), run_id="20991231-000000-second")
    dawnbench.write(tmp_path, rec2, curve)
    assert "results.author" not in capsys.readouterr().out
    dawnbench.write(tmp_path / "other", rec2, curve)
    assert "results.author" in capsys.readouterr().out


def test_no_files_for_bleu_or_a_run_never_evaluated(tmp_path: Path) -> None:
    curve = [{"epoch": 1, "clock/train_s": 10.0, "eval/bleu": 0.95}]
    rec = _record(_curve([0.5]))
    rec["target_metric"] = "bleu"  # DAWNBench has no translation category
    assert dawnbench.write(tmp_path, rec, curve) == (None, None)
    nan = float("nan")
    unevaluated = _curve([nan])
    assert dawnbench.write(tmp_path, _record(unevaluated), unevaluated) == (None, None)
    assert not (tmp_path / "dawnbench").exists()


def test_a_resumed_run_rewrites_its_files_from_the_whole_curve(tmp_path: Path) -> None:
    first = _curve([0.5, 0.7])
    js, tsv = dawnbench.write(tmp_path, _record(first), first)
    assert len(pd.read_csv(tsv, sep="\t")) == 2
    whole = _curve([0.5, 0.7, 0.92])  # the next attempt's curve continues the first
    rec = _record(whole)
    rec["attempt"] = 2
    assert dawnbench.write(tmp_path, rec, whole) == (js, tsv)
    assert list(pd.read_csv(tsv, sep="\t")["epoch"]) == [1, 2, 3]
    assert json.loads(Path(js).read_text())["misc"]["attempt"] == 2
    assert entries_problems(js, "top1", 90.0) == []
    assert sorted(p.name for p in (tmp_path / "dawnbench").iterdir()) == [
        f"{rec['run_id']}.json",
        f"{rec['run_id']}.tsv",
    ]


def test_a_negative_cost_per_hour_is_refused_before_the_run(tmp_path: Path) -> None:
    from bench.launch.run import validate
    from bench.registry import ConfigError

    cfg = Config()
    cfg.results.dir, cfg.results.cost_per_hour = str(tmp_path), -3.0
    with pytest.raises(ConfigError, match="results.cost_per_hour"):
        validate(cfg)
    cfg.results.cost_per_hour = 3.06
    validate(cfg)
