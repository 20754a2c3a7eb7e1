"""``--dry-run`` on every command: the resolved config and what would run, nothing run,
recorded or written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reproduce.__main__ import main
from tests.test_figures import _curve, _record


def _files(d: Path) -> list[Path]:
    return sorted(d.rglob("*")) if d.exists() else []


def test_train_dry_run_prints_config_and_launch(tmp_path: Path, capsys) -> None:
    res = tmp_path / "r"
    main(["train", "--dry-run", f"results.dir={res}", "comm=hitopk", "cluster.nnodes=2"])
    out = capsys.readouterr().out
    assert "model:" in out and "name: resnet9" in out and "name: hitopk" in out  # the YAML
    assert "would launch: 4 worker(s) = 2 node(s) x 2" in out
    assert f"record appended to {res / 'runs.jsonl'}" in out
    assert not res.exists()  # nothing recorded, no directory made


def test_dawnbench_dry_run_uses_the_recipe(tmp_path: Path, capsys) -> None:
    main(["dawnbench", "--dry-run", f"results.dir={tmp_path / 'r'}"])
    out = capsys.readouterr().out
    assert "experiment: dawnbench_digits" in out and "nothing run" in out
    assert _files(tmp_path) == []


def test_multirun_dry_run_lists_the_jobs(tmp_path: Path, capsys) -> None:
    main(
        [
            "train",
            "-m",
            "--dry-run",
            "comm=dense,hitopk",
            "cluster.nnodes=2",
            f"results.dir={tmp_path}",
        ]
    )
    out = capsys.readouterr().out
    assert "sweep of 2 job(s)" in out
    assert "job 0: comm=dense" in out and "job 1: comm=hitopk" in out
    assert out.count("would launch: 4 worker(s)") == 2
    assert _files(tmp_path) == []


def test_dry_run_refuses_bad_input(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["train", "--dry-run", "experiment=nope", f"results.dir={tmp_path}"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "nope" in err and "known:" in err and "dawnbench_digits" in err
    with pytest.raises(SystemExit) as e:
        main(["train", "--dry-run", "data.batch_size=127", f"results.dir={tmp_path}"])
    assert e.value.code == 2 and "not divisible" in capsys.readouterr().err
    assert _files(tmp_path) == []


def test_bench_dry_run(tmp_path: Path, capsys) -> None:
    main(["bench", "topk", "--dry-run", "--quick", "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "benchmark topk" in out and "quick" in out and "SIZES" in out
    assert str(tmp_path / "bench" / "topk.csv") in out
    assert _files(tmp_path) == []


def test_compare_dry_run(tmp_path: Path, capsys) -> None:
    recs = [_record("a", "dense", 0, 10.0), _record("b", "hitopk", 0, 8.0)]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    for r in recs:
        _curve(tmp_path / "curves" / f"{r['run_id']}.csv", r["time_to_target_s"])
    before = _files(tmp_path)
    out_png = tmp_path / "c.png"
    main(["compare", "a", "b", "--results-dir", str(tmp_path), "--out", str(out_png), "--dry-run"])
    out = capsys.readouterr().out
    assert "a: 'dense', 3 epoch(s)" in out and f"would draw {out_png}" in out
    assert _files(tmp_path) == before
