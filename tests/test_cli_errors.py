"""Bad input: one clear error line, non-zero exit, before any worker process starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli


def _one_line_error(p, *needles: str) -> None:
    assert p.returncode != 0, p.stdout + p.stderr
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert err, p.stdout
    assert "Traceback" not in p.stderr, p.stderr
    msg = "\n".join(err)
    assert len(err) <= 3, msg
    for n in needles:
        assert n in msg, msg
    assert "run " not in p.stdout  # no worker started (rank 0 prints "run <id>: ...")


@pytest.mark.parametrize(
    "overrides, needles",
    [
        (["optim.nosuchkey=1"], ["nosuchkey"]),
        (["model=nosuchmodel"], ["nosuchmodel"]),
        (["cluster.nproc_per_node=0"], ["nproc_per_node"]),
        (["optim.lr=-0.1"], ["optim.lr"]),
        (["data.batch_size=0"], ["batch_size"]),
        (["data.batch_size=127"], ["not divisible", "2 workers"]),
        (["data=cifar10"], ["data.root"]),
        (["data=imagenet", "data.root=/nonexistent/imagenet"], ["/nonexistent/imagenet"]),
        (["train.epochs=lots"], ["train.epochs"]),
        (["optim.update=warp"], ["warp", "naive", "flat"]),
        (["train.amp=fp8"], ["fp8", "bf16"]),
        (["data.loader=tf"], ["tf", "dali"]),
        (["train.target_metric=bleu"], ["target_metric", "top1", "top5"]),
    ],
)
def test_bad_input(tmp_path: Path, overrides: list[str], needles: list[str]) -> None:
    p = run_cli("train", f"results.dir={tmp_path}", *overrides, timeout=120)
    _one_line_error(p, *needles)
    assert list(tmp_path.iterdir()) == []  # no record, and no Hydra output either


def test_cifar_dir_without_batches(tmp_path: Path) -> None:
    (tmp_path / "cifar").mkdir()
    p = run_cli(
        "train", "data=cifar10", f"data.root={tmp_path / 'cifar'}", f"results.dir={tmp_path}"
    )
    _one_line_error(p, "data_batch_1")


def test_unknown_command_and_dawnbench_data() -> None:
    _one_line_error(run_cli("frobnicate"), "frobnicate")
    _one_line_error(run_cli("dawnbench", "data=synthetic"), "data=synthetic")
    _one_line_error(run_cli("bench", "nosuchbench"), "nosuchbench")


@pytest.mark.parametrize(
    "args, needles",
    [
        (["trian"], ["did you mean train?"]),
        (["figurse"], ["did you mean figures?"]),
        (["train", "com=hitopk"], ["'com'", "did you mean comm?"]),
        (["train", "-m", "com=dense,hitopk"], ["'com'", "did you mean comm?"]),
        (["train", "optim.lrr=0.1"], ["'optim.lrr'", "did you mean optim.lr?"]),
        (["train", "trian.epochs=3"], ["did you mean train?"]),
        (
            ["dawnbench", "+comm.densty=0.01", "--dry-run"],
            ["'comm.densty'", "did you mean comm.density?"],
        ),
        (["dawnbench", "++comm.densty=0.01"], ["'comm.densty'", "did you mean comm.density?"]),
        (["train", "+train.no_such_key=1", "--dry-run"], ["'train.no_such_key'"]),
        (["train", "model=resnet5"], ["model=resnet5", "did you mean resnet50?", "known:"]),
        (["dawnbench", "data=cifar"], ["data=cifar", "did you mean cifar10?"]),
        (["train", "--dryrun"], ["--dryrun", "did you mean --dry-run?"]),
        (["train", "--resuls-dir", "x"], ["did you mean --results-dir?"]),
        (["figures", "--resuls-dir", "x"], ["figures:", "did you mean --results-dir?"]),
        (["ablation", "--seds", "2"], ["ablation:", "did you mean --seeds?"]),
        (["advise", "--model", "resnet5"], ["did you mean resnet50?"]),
        (["gpucheck", "--only", "train-hitpk"], ["did you mean train-hitopk?"]),
        (["bench", "topkk"], ["'topkk'", "did you mean topk?"]),
    ],
)
def test_did_you_mean(tmp_path: Path, args: list[str], needles: list[str]) -> None:
    """A misspelt command, config key, group, group option or flag: one line naming it
    and the closest known one, exit 2, nothing started."""
    p = run_cli(*args, f"results.dir={tmp_path}", timeout=120)
    _one_line_error(p, *needles)
    assert p.returncode == 2
    assert "?;" not in p.stderr  # the question ends the message: nothing after it
    assert not (tmp_path / "runs.jsonl").exists()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["train", "resume="], "resume= needs the id of the run to continue: resume=RUN_ID"),
        (["dawnbench", "resume=", "--dry-run"], "resume= needs the id of the run"),
        (["figures", "--results-dir", "FILE"], "FILE is a file, not a results directory"),
    ],
)
def test_messages_say_what_is_wrong(tmp_path: Path, capsys, args: list[str], needle: str) -> None:
    """An empty run id is named as such (not "run  has no checkpoint"); a results
    directory that is a file is not offered to dawnbench as one."""
    from reproduce.__main__ import main

    (tmp_path / "FILE").write_text("x")
    with pytest.raises(SystemExit) as e:
        main([a.replace("FILE", str(tmp_path / "FILE")) for a in args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle.replace("FILE", str(tmp_path / "FILE")) in err
    assert "results.dir=" not in err and len(err.strip().splitlines()) == 1


def test_a_stopped_run_without_a_checkpoint_is_told_to_run_again() -> None:
    from reproduce.train import after_stop

    lines = ["reference: ...", "next: python -m reproduce figures"]
    argv = ["experiment=dawnbench_digits", "results.dir=my runs"]
    out = after_stop({"status": "interrupted", "checkpoint": None}, lines, argv)
    assert out[-1] == (
        "next: no checkpoint to continue from; run it again: python -m reproduce train "
        "experiment=dawnbench_digits 'results.dir=my runs'"
    )
    kept = after_stop({"status": "error", "checkpoint": "c/epoch-0001"}, lines, argv)
    assert kept == ["reference: ..."]  # the resume command was given with the checkpoint
    assert after_stop({"status": "ok"}, lines, argv) == lines


def test_the_run_s_end_says_how_to_get_its_cost() -> None:
    from reproduce.train import cost_lines

    rec = {"time_to_target_s": 36.0, "config": {"results": {"cost_per_hour": None}}}
    (line,) = cost_lines(rec)
    assert "results.cost_per_hour=" in line and "costToTargetUSD" in line
    rec["config"]["results"]["cost_per_hour"] = 3.0
    assert cost_lines(rec) == ["cost to target: 0.0300 USD at 3.0 USD per hour"]
    assert cost_lines({"time_to_target_s": None}) == []  # not reached: no cost to target
