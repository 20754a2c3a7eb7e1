"""The benchmark harness: interleaved timing (call order, warm-up, summaries), defined once."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bench.benchmarks import harness, timing


def _recorder(names: list[str]) -> tuple[list[str], dict[str, object]]:
    calls: list[str] = []
    return calls, {n: (lambda n=n: calls.append(n)) for n in names}


def test_rounds_are_rotated_after_untimed_warmup():
    calls, cases = _recorder(["a", "b", "c"])
    times = timing.interleaved_times(cases, warmup=1, reps=4)
    assert calls == list("abc" + "abc" + "bca" + "cab" + "abc")
    assert {n: len(t) for n, t in times.items()} == {"a": 4, "b": 4, "c": 4}
    assert all(t >= 0 for ts in times.values() for t in ts)


def test_shuffled_rounds_follow_a_seeded_shuffle():
    names = ["a", "b", "c", "d"]
    calls, cases = _recorder(names)
    timing.interleaved_times(cases, warmup=0, reps=3, shuffle=True)
    rng, order, expected = random.Random(0), list(names), []
    for _ in range(3):
        rng.shuffle(order)
        expected += order
    assert calls == expected


def test_setup_runs_untimed_before_each_call_and_a_sample_is_iters_calls():
    calls: list[str] = []
    cases = {n: (lambda n=n: calls.append(n)) for n in "ab"}
    times = timing.interleaved_times(
        cases, warmup=1, reps=2, iters=2, setup={"a": lambda: calls.append("setup")}
    )
    assert calls == ["setup", "a", "b"] + ["setup", "a", "a", "b", "b"] + [
        "b",
        "b",
        "setup",
        "a",
        "a",
    ]
    assert {n: len(t) for n, t in times.items()} == {"a": 2, "b": 2}
    assert timing.median_s(lambda: None, warmup=0, reps=3) >= 0


def test_summaries():
    s = timing.summarize([4.0, 1.0, 3.0, 2.0, 5.0])
    assert s["median_ms"] == 3.0 and s["min_ms"] == 1.0 and s["reps"] == 5
    assert s["iqr_ms"] == pytest.approx(3.0)  # quartiles 1.5 and 4.5 (exclusive method)
    assert timing.summarize([2.0]) == {"median_ms": 2.0, "min_ms": 2.0, "iqr_ms": 0.0, "reps": 1}
    out = timing.interleaved({"x": lambda: None}, warmup=0, reps=3)
    assert set(out["x"]) == {"median_ms", "min_ms", "iqr_ms", "reps"} and out["x"]["reps"] == 3


def test_the_benchmarks_use_the_harness_timing():
    from bench.benchmarks import topk, update

    assert topk.interleaved is timing.interleaved
    assert update.interleaved_times is timing.interleaved_times
    assert not hasattr(update, "_interleaved") and not hasattr(harness, "measure")


@pytest.mark.parametrize("name", ["topk", "comm", "update", "input", "cluster", "throughput"])
def test_replot_redraws_a_committed_figure_without_measuring(name: str, tmp_path: Path) -> None:
    import shutil

    from bench.benchmarks import load_all
    from bench.benchmarks.harness import BenchRun

    repo = Path(__file__).resolve().parents[1]
    (tmp_path / "bench").mkdir()
    csv = shutil.copy(repo / "results" / "bench" / f"{name}.csv", tmp_path / "bench")
    before = Path(csv).read_bytes()
    run = BenchRun.newest(name, tmp_path)
    assert run.rows and {r["bench_id"] for r in run.rows} == {run.bench_id}
    assert run.meta["hardware"] == run.rows[0]["hardware"]
    load_all().get(name).replot(run)
    assert (tmp_path / "bench" / f"{name}.png").stat().st_size > 10_000
    assert Path(csv).read_bytes() == before  # nothing measured, nothing appended


def test_replot_without_a_csv_is_one_clear_error(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    p = run_cli("bench", "topk", "--replot", "--results-dir", str(tmp_path / "none"))
    assert p.returncode == 2 and "no " in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "none").exists()


def test_a_recorded_run_is_rebuilt_from_its_rows_without_measuring(tmp_path: Path, monkeypatch):
    import pandas as pd

    monkeypatch.setattr(harness, "hardware", lambda: pytest.fail("measured the machine"))
    rows = pd.DataFrame(
        [{"case": "a", "median_ms": 1.0, "bench_id": "b1", "hardware": "hw", "git_sha": "s"}]
    )
    png = tmp_path / "figures" / "x.png"
    run = harness.BenchRun.from_rows("demo", rows, tmp_path / "scratch", png)
    assert run.bench_id == "b1" and run.meta == {"bench_id": "b1", "hardware": "hw", "git_sha": "s"}
    assert run.rows == rows.to_dict("records") and run.png_path == png
    assert run.csv_path == tmp_path / "scratch" / "bench" / "demo.csv"
    assert pd.read_csv(run.csv_path).equals(rows) and png.parent.is_dir()


def test_the_benchmarks_with_a_headline_are_the_reports():
    from bench.report.figures import headlines

    assert sorted(headlines()) == ["input", "topk", "update"]
