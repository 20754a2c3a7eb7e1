"""``tiled``'s CUDA radix path (:func:`bench.comm.mstopk_triton.radix_topk`) on the CPU.

The Triton kernels themselves run under Triton's interpreter (``TRITON_INTERPRET=1``, a
subprocess: the variable is read when Triton is imported): exact against ``torch.topk``
in every group size, with ties, zeros, the fused error-feedback addition, non-finite
input, and no host sync inside a hook.  The speed is the device run's
(``python -m reproduce gpucheck``, step ``select``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_groups_are_64_bytes_unless_k_groups_would_hold_a_quarter_of_n() -> None:
    pytest.importorskip("triton")
    from bench.comm.mstopk_triton import group_size

    assert group_size(100_000_000, 100_000, 4) == 16  # float32, density 0.001
    assert group_size(100_000_000, 100_000, 2) == 32  # bfloat16
    assert group_size(25_600_000, 256_000, 2) == 16  # bfloat16 at 0.01: 4 k g <= n
    assert group_size(1_000_000, 62_500, 4) == 4  # density 1/16
    assert group_size(1_000_000, 250_000, 4) == 1  # density 0.25: single elements


_INTERPRETED = """
import torch
from bench.comm import mstopk_triton as t
from bench.comm.selection import mstopk, mstopk_ef
from bench.comm.selection_core import deferred_finite, host_syncs

def same(v, i, x, k):
    ref = torch.topk(x.abs().float(), k).values.sort().values
    return (torch.equal(v.abs().float().sort().values, ref) and i.unique().numel() == k
            and torch.equal(v, x[i]) and i.dtype == torch.int64)

gen = torch.Generator().manual_seed(0)
# group sizes 16 / 32 (density 0.001-0.01), 4 (1/16), 1 (0.25, 1 - 1e-4), k = 1
for n, k in [(100_003, 100), (65_536, 700), (64_000, 4000), (40_000, 10_000), (30_001, 29_999),
             (50_000, 1)]:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(n, generator=gen).to(dtype)
        v, i, f = t.radix_topk(x, k)
        assert same(v, i, x, k) and bool(f), (n, k, dtype)
x = torch.randint(-3, 4, (40_000,), generator=gen).float()  # seven values: ties everywhere
for k in (500, 17_000):
    v, i, _ = t.radix_topk(x, k)
    assert same(v, i, x, k), k
z = torch.zeros(40_000)
z[:10] = 1.0  # fewer non-zeros than k
v, i, _ = t.radix_topk(z, 300)
assert same(v, i, z, 300)
x = torch.full((40_000,), 2.0)  # every element tied
v, i, _ = t.radix_topk(x, 333)
assert same(v, i, x, 333)
# the error-feedback addition in the same read: residual += grad, then its top k
for dtype in (torch.float32, torch.bfloat16):
    r = torch.randn(100_000, generator=gen).to(dtype)
    g = torch.randn(100_000, generator=gen).to(dtype)
    want = r + g
    v, i, _ = t.radix_topk(r, 100, g)
    # the interpreter casts float32 to bfloat16 by truncation, the GPU to nearest even
    # (torch's rounding): within one bfloat16 step here, selected from what was stored
    assert torch.allclose(r.float(), want.float(), rtol=2**-7, atol=0) and same(v, i, r, 100)
    assert dtype == torch.bfloat16 or torch.equal(r, want)
r0, g = torch.randn(100_000, generator=gen), torch.randn(100_000, generator=gen)
r = r0.clone()
v, i = mstopk_ef(r, g, 100, kernel="triton", _device_path=True)
assert same(v, i, r0 + g, 100) and bool((r[i] == 0).all())
# non-finite input: flagged on the device, refused by mstopk, indices still in range
for bad in (float("nan"), float("inf"), -float("inf")):
    x = torch.randn(100_003, generator=gen)
    x[77_777] = bad
    v, i, f = t.radix_topk(x, 100)
    assert not bool(f) and int(i.min()) >= 0 and int(i.max()) < x.numel(), bad
    try:
        mstopk(x, 100, kernel="triton", _device_path=True)
        raise AssertionError("not refused")
    except ValueError as e:
        assert "NaN or Inf" in str(e)
# one sync a call (the flag); inside a hook none, at every density
x = torch.randn(100_003, generator=gen)
s = host_syncs()
v, i = mstopk(x, 100, kernel="triton", _device_path=True)
assert host_syncs() - s == 1 and same(v, i, x, 100)
flags = []
s = host_syncs()
with deferred_finite(flags):
    for k in (100, 1000, 25_000):  # density 0.001, 0.01, 0.25
        v, i = mstopk(x, k, kernel="triton", _device_path=True)
        assert same(v, i, x, k), k
assert host_syncs() == s and len(flags) == 3 and bool(torch.stack(flags).all())
print("ok")
"""


def test_radix_kernels_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


def test_torch_structure_makes_no_sync_in_a_hook_at_any_density() -> None:
    """Without Triton (``kernel="torch"``) the CUDA structure: column maxima, or torch.topk
    above density 1/16, where the view has fewer than 2 rows; nothing is read inside a hook."""
    import torch

    from bench.comm.selection import mstopk
    from bench.comm.selection_core import deferred_finite, host_syncs

    x = torch.randn(200_003, generator=torch.Generator().manual_seed(1))
    flags: list[torch.Tensor] = []
    before = host_syncs()
    with deferred_finite(flags):
        for density in (0.001, 0.01, 0.1, 0.25):
            k = int(density * x.numel())
            v, i = mstopk(x, k, kernel="torch", _device_path=True)
            ref = torch.topk(x.abs(), k).values.sort().values
            assert torch.equal(v.abs().sort().values, ref) and i.unique().numel() == k
    assert host_syncs() == before and len(flags) == 4
