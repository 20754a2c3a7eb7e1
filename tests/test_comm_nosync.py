"""No hook reads the device: the finiteness flags stay there until the loop reads them.

NCCL completes a collective's future when it is enqueued, so the hooks' callbacks run
inline on DDP's autograd thread: one host read there would stall the backward pass until
the device caught up.  Two gloo workers (two "nodes" of one, so that ``hitopk`` runs)
count every host read of a tensor while DDP's backward runs each hook
(``tests/helpers/nosync_checks.py``).
"""

from __future__ import annotations

import pytest
import torch

from bench.benchmarks.spawn import run_workers
from bench.comm.selection import mstopk, randomk, topk
from bench.comm.selection_core import deferred_finite, host_syncs
from tests.helpers.nosync_checks import HOOKS, run_nosync


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_workers(run_nosync, 2, 1, timeout_s=300)


@pytest.mark.parametrize("name", HOOKS)
def test_no_hook_callback_reads_the_device(results: list[dict], name: str) -> None:
    for rank, r in enumerate(results):
        got = r[name]
        assert got["syncs"] == 0, (rank, name, got)
        assert sum(got["reads"].values()) == 0, (rank, name, got["reads"])
        assert got["flags"] and all(got["flags"]), (rank, name)  # noted, all finite
        assert got["error"] == ""


def test_a_nan_is_found_by_the_loop_not_inside_the_hook(results: list[dict]) -> None:
    for r in results:
        got = r["mstopk-nan"]
        assert sum(got["reads"].values()) == 0 and got["syncs"] == 0
        assert not all(got["flags"])  # the step with the NaN left a false flag


@pytest.mark.parametrize(
    "select",
    [
        lambda x, k: topk(x, k),
        lambda x, k: randomk(x, k),
        lambda x, k: mstopk(x, k, "tiled", _device_path=True),
    ],
    ids=["topk", "randomk", "mstopk-tiled"],
)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_deferred_selection_keeps_k_indices_and_a_false_flag(select, bad: float) -> None:
    x = torch.randn(1 << 16)
    x[::2] = bad  # half of them: randomk checks only what it picked
    sink: list[torch.Tensor] = []
    before = host_syncs()
    with deferred_finite(sink):
        vals, idx = select(x, 64)
    assert host_syncs() == before  # nothing read
    assert idx.numel() == 64 and vals.numel() == 64 and idx.unique().numel() == 64
    assert sink and not bool(torch.stack(sink).all())
    with pytest.raises(ValueError, match="NaN or Inf"):  # outside the block: read, refused
        select(x, 64)
