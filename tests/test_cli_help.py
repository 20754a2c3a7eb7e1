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
