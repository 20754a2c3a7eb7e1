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


def test_train_dry_run_prints_the_plan_then_the_config_with_verbose(tmp_path: Path, capsys) -> None:
    res = tmp_path / "r"
    main(["train", "--dry-run", f"results.dir={res}", "comm=hitopk", "cluster.nnodes=2"])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("would launch: 4 worker(s) = 2 node(s) x 2")  # the plan first
    assert f"record appended to {res / 'runs.jsonl'}" in lines[0]
    assert lines[1].startswith("expected time: ")
    assert "model:" not in out and len(lines) <= 6  # no YAML without --verbose
    assert not res.exists()  # nothing recorded, no directory made
    main(["train", "--dry-run", "-v", f"results.dir={res}", "comm=hitopk", "cluster.nnodes=2"])
    out = capsys.readouterr().out
    assert out.index("would launch") < out.index("resolved config:") < out.index("model:")
    assert "name: resnet9" in out and "name: hitopk" in out
    assert not res.exists()


def test_dry_run_estimates_from_earlier_records(tmp_path: Path, capsys, monkeypatch) -> None:
    from bench.results.env import hardware

    # the committed records hold runs of this configuration on some CPU kinds: leave them
    # out, so that the estimate is this record's alone on any machine
    monkeypatch.setattr("reproduce._dryrun.REFERENCE", str(tmp_path / "no-reference"))

    rec = {
        "run_id": "old",
        "status": "ok",
        "experiment": "dawnbench_digits",
        "comm": "dense",
        "world_size": 2,
        "hardware": hardware(),
        "wall_time_s": 90.0,
        "config": {"train": {"epochs": 12}},
    }
    (tmp_path / "runs.jsonl").write_text(json.dumps(rec) + "\n")
    # the command's own start-up (imports, composition, checks), which no record holds
    monkeypatch.setattr("reproduce._dryrun.startup_s", lambda: 12.0)
    main(["dawnbench", "--dry-run", f"results.dir={tmp_path}"])
    out = capsys.readouterr().out
    assert "expected time: about 102 s (90 s: the median wall time of 1 earlier" in out
    assert "this machine's hardware; 12 s: this command's start-up" in out


def test_startup_is_this_process_s_age() -> None:
    import time

    from reproduce._dryrun import startup_s

    t = startup_s()
    time.sleep(0.2)
    assert 0.0 < t < startup_s() < 3600


@pytest.mark.parametrize("where", ["file", "runs_dir"])
def test_dry_run_refuses_what_the_run_refuses(tmp_path: Path, capsys, where: str) -> None:
    """A results directory that is a file (or whose runs.jsonl is a directory) is refused
    by the dry run with the real run's message, and nothing is made."""
    from bench.launch.run import check_results_dir
    from bench.registry import ConfigError

    target = tmp_path / "res"
    if where == "file":
        target.write_text("not a directory")
    else:
        (target / "runs.jsonl").mkdir(parents=True)
    before = _files(tmp_path)
    with pytest.raises(ConfigError) as real:
        check_results_dir(str(target))  # what the run itself says
    with pytest.raises(SystemExit) as e:
        main(["dawnbench", "--dry-run", f"results.dir={target}"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert str(real.value) in err and "would be refused" in err
    assert _files(tmp_path) == before


def test_dawnbench_dry_run_uses_the_recipe(tmp_path: Path, capsys) -> None:
    main(["dawnbench", "--dry-run", f"results.dir={tmp_path / 'r'}"])
    out = capsys.readouterr().out
    assert "(experiment dawnbench_digits)" in out and "nothing run" in out
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
    assert out.count("would launch: 4 worker(s)") == 2 and out.count("expected time:") == 2
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
    assert "a: 'yours: a dense', 3 epoch(s)" in out and f"would draw {out_png}" in out
    assert _files(tmp_path) == before


@pytest.mark.parametrize("cmd", ["ablation", "scaling"])
def test_sweep_dry_run_refuses_a_results_dir_that_is_a_file(
    tmp_path: Path, capsys, cmd: str
) -> None:
    bad = tmp_path / "a-file"
    bad.write_text("x")
    with pytest.raises(SystemExit) as e:
        main([cmd, "--quick", "--cluster", "local", "--dry-run", "--results-dir", str(bad)])
    assert e.value.code == 2
    assert "is not a directory" in capsys.readouterr().err
    assert bad.read_text() == "x"


def test_resume_dry_run_makes_the_resumes_checks(tmp_path: Path, capsys) -> None:
    """``resume=RUN_ID --dry-run`` refuses what the resume refuses (no checkpoint, a
    finished run) and plans what it would continue; nothing is written."""
    from tests.conftest import TINY, run_cli

    p = run_cli("train", f"results.dir={tmp_path}", "train.epochs=1", *TINY, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    runs = tmp_path / "runs.jsonl"
    rec = json.loads(runs.read_text())
    args = ["train", "--dry-run", f"results.dir={tmp_path}"]
    for run_id, needle in [("nosuchrun", "no checkpoint"), (rec["run_id"], "has finished")]:
        with pytest.raises(SystemExit) as e:
            main([*args, f"resume={run_id}"])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "the resume would be refused" in err and needle in err
    runs.write_text(json.dumps({**rec, "status": "interrupted"}) + "\n")  # as if stopped
    before = {f: f.read_bytes() for f in _files(tmp_path) if f.is_file()}
    main(["dawnbench", *args[1:], f"resume={rec['run_id']}"])
    out = capsys.readouterr().out
    assert f"would resume run {rec['run_id']}" in out and "attempt 2" in out
    assert {f: f.read_bytes() for f in _files(tmp_path) if f.is_file()} == before


def _tree(*roots: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``roots`` (size, mtime), byte caches aside: what a dry
    run must leave as it found it."""
    out = {}
    for root in roots:
        for p in root.rglob("*"):
            if "__pycache__" in p.parts or ".pytest_cache" in p.parts or ".git" in p.parts:
                continue
            st = p.lstat()
            out[str(p)] = (st.st_size if p.is_file() else -1, st.st_mtime_ns)
    return out


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME (and cache folder) of its own, so that what a dry run writes there shows."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.setenv("XDG_CACHE_HOME", str(h / ".cache"))
    monkeypatch.delenv("BENCH_CACHE_DIR", raising=False)
    return h


def test_ablation_dry_run_writes_nothing_and_says_how_long(
    tmp_path: Path, home: Path, capsys
) -> None:
    """The translation protocol's dry run: no corpus, tokenizer, plan or folder made (in
    the repository, the results dir or the cache under HOME), the data line said once,
    the expected duration said, and (a quick try on the local cluster, nothing measured)
    no need of root."""
    from bench.results.env import REPO_ROOT

    runs = tmp_path / "runs"
    before = _tree(REPO_ROOT, tmp_path)
    main(["ablation", "--workload", "translation", "--quick", "--cluster", "local",
          "--comm", "dense", "--dry-run", "--results-dir", str(runs)])  # fmt: skip
    out = capsys.readouterr().out
    assert _tree(REPO_ROOT, tmp_path) == before
    assert out.count("data=translation:") == 1 and "would be made" in out
    assert "minutes on 2 cores" in out
    assert "no measured cluster" in out and " on local" in out and "needs root" not in out


def test_vocabulary_line_is_said_once(tmp_path: Path, capsys) -> None:
    from bench.data.config import DataConfig
    from bench.data.corpus import write_corpus
    from bench.data.translation import check

    root = write_corpus(tmp_path, train=80, valid=10, test=10)
    cfg = DataConfig(name="translation", root=str(root), vocab_size=200)
    check(cfg)
    check(cfg)  # a sweep checks each of its jobs' configs
    assert capsys.readouterr().out.count("sentencepiece vocabulary") == 1


def test_figures_reference_dry_run_lists_where_it_writes_and_writes_nothing(
    tmp_path: Path, capsys
) -> None:
    mine, ref = tmp_path / "runs", tmp_path / "ref"
    for d, rid, comm in ((mine, "a", "dense"), (ref, "b", "hitopk")):
        rec = _record(rid, comm, 0, 10.0)
        d.mkdir()
        (d / "runs.jsonl").write_text(json.dumps(rec) + "\n")
        _curve(d / "curves" / f"{rid}.csv", 10.0)
    before = _tree(tmp_path)
    main(["figures", "--results-dir", str(mine), "--reference", str(ref), "--dry-run"])
    out = capsys.readouterr().out
    assert _tree(tmp_path) == before
    dest = mine / "with-reference"
    listed = [ln.split(":")[0].strip() for ln in out.splitlines() if ln.startswith("  /")]
    assert listed and all(p.startswith(str(dest)) for p in listed), out
    assert f"and {dest / 'REPORT.md'}; nothing written" in out
    assert f"inputs in {dest}: 2 record(s)" in out
