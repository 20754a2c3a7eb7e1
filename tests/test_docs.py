"""The docs hold: every ``python -m reproduce ...`` command written in README.md and
docs/*.md passes the CLI's own checks (the command, its options, the config keys and group
options it sets), and every relative link in README.md and docs/**/*.md names a file that
exists (and a heading of it, when the link names one).  The commands are checked in this
process, as ``--dry-run`` would check them, up to the point where a run would start."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import REPO

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]  # where the commands are
LINKING = [README, *sorted((REPO / "docs").rglob("*.md"))]  # whose links must resolve
ANSWER = ("<!-- answer: ", "<!-- answer end -->")  # the block bench.report.answer writes

# Every placeholder the docs write in a command, and what the check puts in its place
# ("..." is dropped).  A placeholder not listed here fails the check.
PLACEHOLDERS = {
    "<i>": "0",
    "<0|1>": "0",
    "<node0>": "node0",
    "<nodes>": "2",
    "<gpus_per_node>": "1",
    "<partition>": "p",
    "<p>": "p",
    "<sweep_id>": "protocol-1",
    "[overrides]": "",
    "RUN_ID": "20261130-222143-510ca9",
    "SWEEP_ID": "protocol-1",
    "DIR": "runs",
    "NAME": "topk",
    "...": "",
}
SHELL = ("|", "||", "&&", ";", "&")  # a command ends at the first of these
START = re.compile(r"^\s*(?:.*&& )?(python -m reproduce\b.*)")  # a command line of a code block

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`(python -m reproduce\b[^`]*)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _words(command: str) -> list[str]:
    """A command's words after ``python -m reproduce``, up to a shell operator, with the
    placeholders filled in."""
    words = shlex.split(command, comments=True)[3:]
    for i, w in enumerate(words):
        if w in SHELL or w.startswith((">", "2>")):
            words = words[:i]
            break
    text = " ".join(words)
    for hole, value in PLACEHOLDERS.items():
        text = re.sub(rf"(?<![\w.]){re.escape(hole)}(?![\w.])", value, text)
    return text.split()


def _commands() -> list[tuple[str, str]]:
    """``(where, command)`` for every command in a code block or inline code."""
    found = []
    for page in PAGES:
        text = page.read_text()
        name = page.relative_to(REPO)
        for block in FENCE.finditer(text):
            line = text.count("\n", 0, block.start(1)) + 1
            body = block.group(1).replace("\\\n", " ")
            for k, ln in enumerate(body.splitlines()):
                if m := START.match(ln):  # not the trees' notes of which command runs where
                    found.append((f"{name}:{line + k}", m.group(1)))
        prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for m in INLINE.finditer(prose):
            line = prose.count("\n", 0, m.start()) + 1
            found.append((f"{name}:{line}", " ".join(m.group(1).split())))
    return found


class _Parsed(BaseException):
    """Raised in place of running a command once its own parser has accepted it."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.ns = args


def _compose(overrides: list[str]) -> None:
    """Compose the config (each job's, for a ``-m`` sweep) as a run would: an unknown key,
    group or option exits with one error line."""
    from reproduce._dryrun import compose, sweep_jobs

    multirun = any(o in ("-m", "--multirun") for o in overrides)
    args, skip = [], False
    for o in overrides:
        if skip:
            skip = False
        elif o in ("--cfg", "-c", "--package", "-p", "--config-name", "-cn"):
            skip = True  # Hydra's flags that take a value
        elif not o.startswith(("-", "hydra.", "hydra/")):
            args.append(o)
    for job in sweep_jobs(args) if multirun else [args]:
        compose(job)


def _check(words: list[str], monkeypatch) -> None:
    """``python -m reproduce <words>`` through the CLI's own checks, without running it."""
    import reproduce.__main__ as cli

    hydra = []
    monkeypatch.setattr(cli, "_hydra", hydra.append)  # train / dawnbench: the overrides
    parse = argparse.ArgumentParser.parse_args

    def parsed(self, args=None, namespace=None):
        raise _Parsed(parse(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parsed)
    try:
        cli.main(words)
    except _Parsed as p:
        args = p.ns
    else:
        (overrides,) = hydra
        if any(o.startswith("resume=") for o in overrides):  # as the resume: the
            drop = ("resume=", "experiment=", "data=")  # checkpoint has the recipe
            overrides = [o for o in overrides if not o.startswith(drop)]
        _compose(overrides)
        return
    if words[0] == "bench" and args.name:
        from bench.benchmarks import load_all

        assert args.name in load_all().names(), f"unknown benchmark {args.name}"
    if getattr(args, "overrides", None):  # ablation, scaling: overrides for every job
        exp = [f"experiment={args.experiment}"] if getattr(args, "experiment", "") else []
        _compose([*exp, *args.overrides])


COMMANDS = _commands()


def test_the_docs_write_commands() -> None:
    pages = {where.split(":")[0] for where, _ in COMMANDS}
    assert len(COMMANDS) >= 40 and "README.md" in pages and len(pages) >= 6


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_command_of_the_docs_parses(where: str, command: str, monkeypatch, capsys) -> None:
    words = _words(command)
    holes = re.findall(r"<[^>]*>", " ".join(words))
    assert not holes, f"{where}: placeholder {holes} not in PLACEHOLDERS"
    if not words:
        return  # "python -m reproduce ...": the CLI as such, no command named
    try:
        _check(words, monkeypatch)
    except SystemExit as e:
        if e.code:
            pytest.fail(f"{where}: {command}\n{capsys.readouterr().err.strip()}")


@pytest.mark.parametrize(
    "command",
    [
        "python -m reproduce trian",  # an unknown command
        "python -m reproduce ablation --qiuck",  # an unknown option
        "python -m reproduce train com=hitopk",  # an unknown config key
        "python -m reproduce dawnbench comm=hitpk",  # an unknown group option
        "python -m reproduce train -m comm=dense,hitopk optim.lrr=0.1",  # in a sweep
        "python -m reproduce scaling --quick cluster.nnode=2",  # a sweep's override
        "python -m reproduce bench topkk --dry-run",  # an unknown benchmark
    ],
)
def test_the_check_catches_a_bad_command(command: str, monkeypatch) -> None:
    with pytest.raises((SystemExit, AssertionError)) as e:
        _check(_words(command), monkeypatch)
    assert not isinstance(e.value, SystemExit) or e.value.code


def _slug(heading: str) -> str:
    """A heading's anchor, as the repository's host makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6} (.+)$", text, re.M):
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(f"{slug}-{n}" if n else slug)
    return out


def _links() -> list[tuple[str, Path, str]]:
    out = []
    for page in LINKING:
        text = page.read_text()
        prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        prose = re.sub(r"`[^`]*`", "", prose)
        for m in LINK.finditer(prose):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            line = prose.count("\n", 0, m.start()) + 1
            out.append((f"{page.relative_to(REPO)}:{line}", page, target))
    return out


def test_every_relative_link_resolves() -> None:
    bad = []
    for where, page, target in _links():
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{where}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{where}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


def test_the_readme_links_every_docs_page_and_fits() -> None:
    text = README.read_text()
    for page in ("gpu", "emulated-cluster", "sweeps", "hooks", "benchmarks",
                 "submission-files", "troubleshooting", "architecture", "install"):  # fmt: skip
        assert f"](docs/{page}.md)" in text, page
    # the answer block is REPORT.md's (tests/test_readme_answer.py); the rest of the
    # README leaves it 15 of 250 lines, and no line of it is longer than 300 characters
    head, rest = text.split(ANSWER[0], 1)
    rest = rest.split(ANSWER[1], 1)[1]
    lines = (head + rest).splitlines()
    assert len(lines) <= 250 - 15
    assert max(len(ln) for ln in lines) <= 300
