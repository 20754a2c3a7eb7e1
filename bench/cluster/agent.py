"""A node's elastic agent: ``python -m bench.cluster.agent <torchrun arguments>``.

torch.distributed's ``torchrun``, unchanged, except that each failed worker group is noted
in the run's event log (:func:`bench.cluster.torchrun.instrument_agent`) before the agent
restarts it, so that the run's record can list its restarts.
"""

from __future__ import annotations

import os

from bench.cluster.torchrun import EVENTS_ENV, _note, instrument_agent


def main() -> None:
    """torchrun; an error of the agent itself (a rendezvous that timed out) is noted too."""
    from torch.distributed.run import main as torchrun

    instrument_agent()
    try:
        torchrun()
    except Exception as e:
        if os.environ.get(EVENTS_ENV):
            msg = str(e).strip().splitlines()[0][:500] if str(e).strip() else ""
            if not msg and "Rendezvous" in type(e).__name__:
                msg = "not every node joined within cluster.rdzv_timeout_s"
            reason = f"{type(e).__name__}: {msg}"
            _note(os.environ[EVENTS_ENV], kind="agent_error", reason=reason)
        raise


if __name__ == "__main__":
    main()
