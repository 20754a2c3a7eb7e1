"""``python -m bench.cluster list|cleanup``: the emulated clusters of this machine by run id,
and the removal of those whose owner is dead (:func:`bench.cluster.netns.main`)."""

import sys

from bench.cluster.netns import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
