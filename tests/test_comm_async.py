"""The hooks return before their collectives complete; times mean the same for every hook;
float16 wire values never overflow.

One spawn of 4 gloo workers posing as 2 nodes x 2 runs :func:`tests.helpers.comm_checks.
run_async`: for each hook, rank 0 hands over 4 buckets while the other ranks join
``DELAY_S`` late.  A hook that waited for its collective (the old flat allgather and
hitopk did) would take ``DELAY_S`` to return; one that summed the time of buckets in
flight together would report ``comm_s`` of about 4 ``DELAY_S`` in a step of ``DELAY_S``.
"""

from __future__ import annotations

import pytest

from bench.benchmarks.spawn import run_workers
from bench.comm.stats import PhaseTimes, union_length
from tests.helpers.comm_checks import DELAY_S, run_async

HOOKS = ("dense", "fp16", "mstopk", "hitopk", "powersgd")


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_workers(run_async, 4, 2, timeout_s=300)


def test_hooks_return_before_their_collectives_complete(results: list[dict]) -> None:
    r0 = results[0]["asynchronous"]
    for name in HOOKS:
        t = r0[name]
        assert t["call_s"] < DELAY_S / 2, (name, t)  # returned long before the peers joined
        assert t["wall_s"] >= 0.9 * DELAY_S, (name, t)  # ...and completed after they did
        assert t["finite"] == 1.0


def test_comm_time_is_the_union_of_collectives_in_flight(results: list[dict]) -> None:
    for rank, r in enumerate(results):
        for name in HOOKS:
            t = r["asynchronous"][name]
            # never more than the step: 4 buckets in flight together count once
            assert t["comm_s"] <= t["wall_s"] + 1e-3, (rank, name, t)
            if rank == 0:  # rank 0's collectives were in flight while it waited for the peers
                assert t["comm_s"] >= 0.8 * DELAY_S, (name, t)
            if name in ("mstopk", "hitopk"):  # selection, packing, scatter-add were timed
                assert t["select_s"] > 0, (name, t)
            if name == "powersgd":  # torch's hook: all of its span is comm (stats.py)
                assert t["select_s"] == 0.0, t


def test_float16_wire_values_beyond_its_range_stay_finite_and_conserved(
    results: list[dict],
) -> None:
    for r in results:
        w = r["wire_range"]
        for name in ("mstopk", "hitopk"):
            assert w[f"{name}/float32/finite"] == 1.0 and w[f"{name}/float16/finite"] == 1.0
            assert w[f"{name}/float32/error"] < 1e-5, w  # the residual kept the excess
            assert w[f"{name}/float16/error"] < 2e-3, w  # float16 rounding of the mean


def test_union_length_counts_overlaps_once() -> None:
    assert union_length([]) == 0.0
    assert union_length([(0.0, 1.0), (0.5, 2.0), (0.2, 0.3), (3.0, 4.0)]) == 3.0
    assert union_length([(1.0, 2.0)] * 4) == 1.0


def test_phase_times_pop_and_start_over() -> None:
    import torch

    t = PhaseTimes()
    x = torch.zeros(1)
    a = t.now(x)
    t.add_select(a, a + 0.25)
    t.add_select(a, a + 0.5)
    t.add_comm(a, a + 1.0)
    t.add_comm(a + 0.5, a + 1.5)
    select_s, comm_s = t.pop()
    assert select_s == pytest.approx(0.75) and comm_s == pytest.approx(1.5)
    assert t.pop() == (0.0, 0.0)


class _Event:
    """Stands in for torch.cuda.Event: a time stamp (s) read as milliseconds."""

    def __init__(self, t: float, done: bool = True) -> None:
        self.t, self.done = t, done

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    def elapsed_time(self, end: _Event) -> float:
        return (end.t - self.t) * 1e3


def test_phase_times_read_cuda_events_only_when_complete() -> None:
    t = PhaseTimes()
    t.add_comm(_Event(10.0), _Event(11.0))
    t.add_comm(_Event(10.5), _Event(12.0, done=False))  # still in flight
    t.add_select(_Event(12.0), _Event(12.25))
    t.add_comm(None, None)  # timing off: nothing recorded
    t._read_cuda(wait=False)
    assert len(t._cuda) == 1  # the pair in flight is kept, not waited for
    assert t.pop() == pytest.approx((0.25, 2.0))  # pop waits: union of [10, 11], [10.5, 12]
