"""What the commands of ``python -m reproduce`` share: the default results directories, the
argument parser (help layout, one-line errors with "did you mean") and the flag forms."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import textwrap
from collections.abc import Iterable, Sequence

from bench.results.paths import RUNS_DIR

# A user's runs go to RESULTS (git-ignored); the committed reference results are in
# REFERENCE and change only when a command is pointed at them by name.
RESULTS = RUNS_DIR
REFERENCE = "results"

# One flag style across commands: training takes Hydra overrides and these flags as their
# synonyms; the other commands take flags and these overrides as their synonyms.
SYNONYMS = {"results.dir": "--results-dir", "experiment": "--experiment", "cluster": "--cluster"}


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean X?"`` for the closest of ``choices``, or ``""``: a message's end."""
    close = difflib.get_close_matches(word, sorted(set(choices)), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def plain(text: str) -> str:
    """Help text without the docstrings' reStructuredText markup."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", lambda m: m.group(1), text)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"\1", text)
    return re.sub(r"(?<![\w`])`([^`]+)`(?![\w`])", r"\1", text)


def fail(msg: str, code: int = 2) -> None:
    """One error line on stderr and exit ``code`` (2: bad input, nothing started)."""
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)


def flags_to_overrides(argv: Sequence[str]) -> list[str]:
    """The :data:`SYNONYMS` flags as Hydra overrides, a path quoted as Hydra reads it back."""
    flags = {v: k for k, v in SYNONYMS.items()}
    out: list[str] = []
    it = iter(argv)
    for a in it:
        name, eq, value = a.partition("=")
        flag = name in flags
        if flag and not eq:
            value = next(it, None)
            if value is None:
                fail(f"{name} needs a value ({flags[name]}=VALUE works too)")
        name, eq = (flags[name], "=") if flag else (name, eq)
        if name == "results.dir" and eq and (flag or value[:1] not in ("'", '"')):
            from bench.config import hydra_value  # a path, not Hydra's grammar: quoted

            value = hydra_value(value)  # (Hydra is not on the gpucheck path)
        out.append(f"{name}{eq}{value}" if flag or name == "results.dir" else a)
    return out


def unquoted(overrides: Sequence[str]) -> list[str]:
    """Overrides with a quoted value as Hydra reads them, for a resume (without Hydra)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out = []
    for o in overrides:
        key, eq, value = o.partition("=")
        if eq and value[:1] in ("'", '"'):
            value = OverridesParser.create().parse_override(o).value()
            o = key + "=" + value.replace("\\${", "${")  # as OmegaConf reads it
        out.append(o)
    return out


class Parser(argparse.ArgumentParser):
    """One command's parser: ``--help`` is ``summary``, usage, ``example``, ``details``; a
    bad argument is one line with "did you mean", exit 2; :data:`SYNONYMS` are accepted."""

    def __init__(
        self,
        command: str,
        summary: str = "",
        example: str = "",
        details: str = "",
        **kwargs: object,
    ) -> None:
        kwargs.pop("description", None)  # the summary and details take its place
        epilog = "\n\n".join(
            p for p in (f"example:\n  {example}" if example else "", details.strip()) if p
        )
        super().__init__(
            prog=f"python -m reproduce {command}",
            epilog=epilog or None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            **kwargs,  # type: ignore[arg-type]
        )
        self.command = command
        self.summary = summary

    def format_help(self) -> str:
        text = plain(super().format_help())
        if not self.summary:
            return text
        summary = textwrap.fill(" ".join(plain(self.summary).split()), width=88)
        return f"{summary}\n\n{text}"

    def results_dir(self, help: str) -> None:
        """``--results-dir DIR``, a user's runs by default."""
        self.add_argument("--results-dir", metavar="DIR", default=RESULTS, help=help)

    def _options(self) -> list[str]:
        return [o for a in self._actions for o in a.option_strings if o.startswith("--")]

    def parse_args(self, args: Sequence[str] | None = None, namespace=None):  # type: ignore[override]
        argv = list(sys.argv[1:] if args is None else args)
        opts = set(self._options())
        out = []
        for a in argv:
            key, eq, value = a.partition("=")
            if eq and key in SYNONYMS and SYNONYMS[key] in opts:
                out += [SYNONYMS[key], value]
            else:
                out.append(a)
        return super().parse_args(out, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        m = re.match(r"unrecognized arguments: (\S+)", message)
        if m and m.group(1).startswith("-"):
            message += did_you_mean(m.group(1).split("=")[0], self._options())
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            message += did_you_mean(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
        print(f"error: {self.command}: {message}", file=sys.stderr)
        sys.exit(2)
