"""``tiled``'s CUDA fast path (threshold from a histogram, one compaction) on the CPU.

:class:`~bench.comm.selection_tiled.TorchOps` are the three kernels in torch ops, so the
threshold logic, the exactness, the capacity overflow and the sync counts are checked on
any CPU; one test runs the Triton kernels themselves under Triton's interpreter.  The
speed is the device run's (``python -m reproduce gpucheck``, step ``select``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.comm import selection_tiled as sf
from bench.comm.selection_core import deferred_finite, host_syncs

REPO = Path(__file__).resolve().parents[1]


def _same_magnitudes(vals: torch.Tensor, x: torch.Tensor, k: int) -> bool:
    ref = torch.topk(x.abs().float(), k, sorted=False).values.sort().values
    return torch.equal(vals.abs().float().sort().values, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("n", "k", "c"), [(100_003, 100, 16), (1 << 16, 700, 8), (5000, 3, 2)])
def test_exact_with_one_sync(dtype, n: int, k: int, c: int) -> None:
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
    before = host_syncs()
    vals, idx = sf.tiled_fast(x, k, c, sf.TorchOps)
    assert host_syncs() - before == 1  # the count and the finiteness flag, read together
    assert idx.numel() == k and idx.unique().numel() == k
    assert torch.equal(vals, x[idx])
    assert _same_magnitudes(vals, x, k)


def test_ties_and_zeros_still_give_k_unique_indices() -> None:
    x = torch.randint(-3, 4, (40_000,)).float()  # seven values: ties everywhere
    vals, idx = sf.tiled_fast(x, 500, 16, sf.TorchOps)
    assert idx.unique().numel() == 500 and _same_magnitudes(vals, x, 500)
    z = torch.zeros(40_000)
    z[:10] = 1.0  # fewer non-zeros than k
    vals, idx = sf.tiled_fast(z, 300, 16, sf.TorchOps)
    assert idx.unique().numel() == 300 and _same_magnitudes(vals, z, 300)


def _crowded(c: int, r: int, k: int) -> torch.Tensor:
    """Every row of ``k`` columns large: each of those columns holds ``c`` candidates."""
    x = torch.randn(c, r, generator=torch.Generator().manual_seed(3))
    x[:, :k] += 10.0 + torch.rand(c, k, generator=torch.Generator().manual_seed(4))
    return x.reshape(-1)


def test_more_candidates_than_slots_compacts_again_exactly() -> None:
    c, r, k = 16, 20_000, 1000
    x = _crowded(c, r, k)
    assert c * k > sf.capacity(c * r, k)  # the first compaction overflows
    before = host_syncs()
    vals, idx = sf.tiled_fast(x, k, c, sf.TorchOps)
    assert host_syncs() - before == 1
    assert idx.unique().numel() == k and _same_magnitudes(vals, x, k)


def test_deferred_reads_nothing_and_notes_an_overflow() -> None:
    c, r, k = 16, 20_000, 1000
    finite: list[torch.Tensor] = []
    exact: list[torch.Tensor] = []
    x = torch.randn(c * r)
    before = host_syncs()
    with deferred_finite(finite, exact):
        vals, idx = sf.tiled_fast(x, k, c, sf.TorchOps)
        _, idx2 = sf.tiled_fast(_crowded(c, r, k), k, c, sf.TorchOps)
    assert host_syncs() == before
    assert _same_magnitudes(vals, x, k)
    assert [bool(f) for f in finite] == [True, True]
    assert [bool(e) for e in exact] == [True, False]  # the crowded one was capped
    assert idx2.unique().numel() == k  # k candidates, each >= the threshold


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("where", [0, 77_777, 100_002])  # head, head, tail
def test_nonfinite_refused_or_flagged(bad: float, where: int) -> None:
    x = torch.randn(100_003)
    x[where] = bad
    with pytest.raises(ValueError, match="NaN or Inf"):
        sf.tiled_fast(x, 100, 16, sf.TorchOps)
    finite: list[torch.Tensor] = []
    with deferred_finite(finite):
        _, idx = sf.tiled_fast(x, 100, 16, sf.TorchOps)
    assert idx.unique().numel() == 100 and not bool(torch.stack(finite).all())


def test_threshold_leaves_at_least_k_columns_and_few_more() -> None:
    colmax = torch.randn(1 << 16).abs()
    hist = sf.TorchOps.colmax_hist(colmax[None, :], sf.BINS1, sf.SHIFT1)[1]
    for k in (1, 64, 1000, 20_000):
        thr, finite = sf.threshold(colmax, hist, k, sf.TorchOps)
        above = int((colmax >= thr).sum())
        assert bool(finite) and k <= above <= k * 1.01 + 16, (k, above)


_INTERPRETED = """
import torch
from bench.comm import mstopk_triton as t, selection_tiled as sf
for n, k, c in [(100_003, 100, 16), (50_000, 50, 3)]:
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    v, i = sf.tiled_fast(x, k, c, t)
    ref = torch.topk(x.abs(), k).values.sort().values
    assert torch.equal(v.abs().sort().values, ref) and i.unique().numel() == k, (n, k, c)
    m, h = t.colmax_hist(x[: c * (n // c)].view(c, -1), sf.BINS1, sf.SHIFT1)
    m2, h2 = sf.TorchOps.colmax_hist(x[: c * (n // c)].view(c, -1), sf.BINS1, sf.SHIFT1)
    assert torch.equal(m, m2) and torch.equal(h, h2)
# the device check's stage timings of the same path (what each kernel and launch costs)
from bench.gpucheck.perf import _fast_stages
stages = _fast_stages(torch.randn(100_003), 100, 1, False)
assert set(stages) >= {"colmax+hist", "colmax", "threshold", "compact"}, stages
assert all(ms > 0 for ms in stages.values()), stages
print("ok")
"""


def test_triton_kernels_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
