"""``python -m bench.train --config run.json``: one training worker, as the launchers start it."""

import os
import sys

from bench.train.worker import main

if __name__ == "__main__":
    code = main()
    # done and written: skip the interpreter's teardown (seconds of garbage collection
    # over torch's objects in every worker, while the launcher waits)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
