"""``nocomm``: each worker keeps its own gradient (nothing of it is sent), and the workers
stay in step (the step's last bucket waits for a 4-byte barrier), on 2 gloo workers."""

from __future__ import annotations

from bench.benchmarks.spawn import run_workers
from tests.helpers.nocomm_checks import run


def test_nocomm_keeps_local_gradients_and_the_workers_in_step() -> None:
    r0, r1 = run_workers(run, 2, 1, timeout_s=200)
    # d(sum(w . x))/dw = sum of x's rows: 4 x (rank + 1) per coordinate, not averaged
    assert r0["grad"] == [[4.0] * 8] and r1["grad"] == [[8.0] * 8]
    assert r0["steps"] == r1["steps"] == 3
    # rank 0's backward waits for slow rank 1 at every step after the first: in step
    assert min(r0["waited"][1:]) > 0.2, r0["waited"]
