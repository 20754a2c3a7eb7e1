"""What the commands of ``python -m reproduce`` share."""

from __future__ import annotations

import argparse
import sys


class Parser(argparse.ArgumentParser):
    """The argument parser of one command: a bad argument is one line naming the command
    (``error: <command>: ...``), exit status 2, like a bad config key."""

    def __init__(self, command: str, **kwargs: object) -> None:
        super().__init__(prog=f"python -m reproduce {command}", **kwargs)  # type: ignore[arg-type]
        self.command = command

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {self.command}: {message}", file=sys.stderr)
        sys.exit(2)
