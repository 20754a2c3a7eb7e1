"""README.md's answer block, copied from REPORT.md so that the two cannot disagree.

The block sits between :data:`START` and :data:`END` in the README; its text is
REPORT.md's "The answer" section (up to the next ``## `` heading), with the paths the
report gives relative to its own directory made relative to the repository.

``python -m bench.report.readme`` rewrites the block from ``results/REPORT.md``;
``--check`` exits 1 when it differs (the test suite runs the same comparison).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

START = "<!-- answer: copied from results/REPORT.md by `python -m bench.report.readme` -->"
END = "<!-- answer end -->"
SECTION = "## The answer"
ROOT = Path(__file__).resolve().parents[2]


def answer_of(report: str, prefix: str = "results/") -> str:
    """REPORT.md's answer section, without its heading, paths prefixed with ``prefix``."""
    lines = report.splitlines()
    try:
        i = lines.index(SECTION)
    except ValueError:
        raise ValueError(f"the report has no {SECTION!r} section") from None
    j = next((k for k in range(i + 1, len(lines)) if lines[k].startswith("## ")), len(lines))
    body = "\n".join(lines[i + 1 : j]).strip("\n")
    # `ablation/x.csv` -> `results/ablation/x.csv` (paths the report gives from its folder)
    return re.sub(r"`(ablation|figures|scaling|bench)/", lambda m: f"`{prefix}{m.group(1)}/", body)


def block_of(readme: str) -> str:
    """The README's current block (between the markers)."""
    if START not in readme or END not in readme:
        raise ValueError("README.md has no answer block (its start and end markers)")
    return readme.split(START, 1)[1].split(END, 1)[0].strip("\n")


def rewrite(readme: str, report: str) -> str:
    head, rest = readme.split(START, 1)
    tail = rest.split(END, 1)[1]
    return f"{head}{START}\n{answer_of(report)}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.report.readme", description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 if the block is stale")
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    ap.add_argument("--report", default=str(ROOT / "results" / "REPORT.md"))
    a = ap.parse_args(argv)
    readme, report = Path(a.readme).read_text(), Path(a.report).read_text()
    if a.check:
        same = block_of(readme) == answer_of(report)
        print("README's answer block matches REPORT.md" if same else "README's answer is stale")
        return 0 if same else 1
    Path(a.readme).write_text(rewrite(readme, report))
    print(f"{a.readme}: answer block rewritten from {a.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
