"""``python -m bench.cluster list|cleanup``: the emulated clusters on this machine.

``list`` prints every namespace and link of the project by run id, with the run's owner
(pid and start time) and whether it is alive; ``cleanup`` removes those of runs whose
owner is dead (a launcher killed with ``kill -9`` whose guardian was killed too).  A live
run's resources are never touched.
"""

import sys

from bench.cluster.netns import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
