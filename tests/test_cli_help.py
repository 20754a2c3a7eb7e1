"""Every command's ``--help`` opens with what the command does, then its options and an
example; both flag forms (``--results-dir DIR`` and ``results.dir=DIR``) work everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from reproduce.__main__ import _commands, main

COMMANDS = ["train", "dawnbench", *sorted(_commands())]


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_opens_with_what_it_does(cmd: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    first = out.lstrip().splitlines()[0]
    assert not first.startswith("usage") and "powered by" not in first, first  # what, not how
    assert len(first.split()) >= 6, first  # a sentence, not a name
    assert "usage:" in out and "--dry-run" in out and "--results-dir" in out
    assert "example:\n  python -m reproduce " + cmd in out


def test_top_level_help_lists_every_command(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for cmd in COMMANDS:
        assert f"\n  {cmd} " in out, cmd
    assert "example:" in out


def test_both_flag_forms(tmp_path: Path, capsys) -> None:
    """``--results-dir DIR`` for the training commands, ``results.dir=DIR`` for the others."""
    main(["dawnbench", "--dry-run", "--results-dir", str(tmp_path / "a")])
    assert f"record appended to {tmp_path / 'a' / 'runs.jsonl'}" in capsys.readouterr().out
    main(["dawnbench", "--dry-run", f"--results-dir={tmp_path / 'b'}"])
    assert f"record appended to {tmp_path / 'b' / 'runs.jsonl'}" in capsys.readouterr().out
    main(["bench", "topk", "--dry-run", "--quick", f"results.dir={tmp_path / 'c'}"])
    assert str(tmp_path / "c" / "bench" / "topk.csv") in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []  # dry runs: nothing made


def test_version(capsys) -> None:
    """``--version``: the package's version (and the commit where known), exit 0."""
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("reproduce ") and any(c.isdigit() for c in out), out


@pytest.mark.parametrize("cmd", ["ablation", "advise", "figures", "compare", "scaling", "gpucheck"])
def test_help_is_plain_text(cmd: str, capsys) -> None:
    """No reStructuredText markup in a command's help: no roles, double backquotes, bold."""
    with pytest.raises(SystemExit):
        main([cmd, "--help"])
    out = capsys.readouterr().out
    for markup in (":func:", ":mod:", ":class:", ":data:", "``", "**"):
        assert markup not in out, (cmd, markup)


@pytest.mark.parametrize(
    "cmd, option",
    [("gpucheck", "--budget-s"), ("scaling", "--epochs"), ("scaling", "--batch-per-worker")],
)
def test_help_shows_defaults(cmd: str, option: str, capsys) -> None:
    with pytest.raises(SystemExit):
        main([cmd, "--help"])
    out = capsys.readouterr().out
    line = out[out.index(f"  {option}") :].split("\n  -")[0]
    assert "(default " in " ".join(line.split()), line


def test_scaling_help_one_default_size_list(capsys) -> None:
    import re

    with pytest.raises(SystemExit):
        main(["scaling", "--help"])
    lists = set(re.findall(r"\d+x\d+(?:,\d+x\d+)+", capsys.readouterr().out))
    assert len(lists) == 1, lists


def test_train_help_offers_no_internal_comm(capsys) -> None:
    """comm=nocomm (the scaling sweep's compute-only baseline) is no training method."""
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    comm = next(ln for ln in capsys.readouterr().out.splitlines() if "comm=" in ln)
    assert "dense" in comm and "nocomm" not in comm


@pytest.mark.parametrize(
    "args, needle, absent",
    [
        (["train", "--foo"], "unknown option --foo", "--info"),
        (["train", "--inf"], "unknown option --inf", "--info"),
        (["ablation", "--workload", "imagee", "--dry-run"], "did you mean image?", None),
    ],
)
def test_suggestions(args: list[str], needle: str, absent: str | None, capsys) -> None:
    """A misspelt flag is told only flags the help mentions; a workload its closest name."""
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and (absent is None or absent not in err), err
