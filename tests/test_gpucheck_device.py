"""The hook paths' stream safety and determinism on a GPU (what a CPU cannot show).

A tensor made on the hook's stream and read in a callback on a pool stream must be
recorded there, and a serialized PowerSGD bucket must wait on the stream writing it:
otherwise the allocator reuses memory, or PowerSGD reads a bucket, too early, which only
shows as wrong numbers under load.  These run the hooks under the race probe (a GPU sleep
before every issue and in every callback) and compare with the undelayed run.
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = [pytest.mark.gpu]

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


def test_the_cuda_scatter_is_deterministic():
    from bench.comm.communicators import _scatter_mean

    gen = torch.Generator(device="cuda").manual_seed(0)
    n, w, k = 1 << 16, 8, 1 << 14
    idx = torch.randint(0, n // 64, (w, k), device="cuda", generator=gen)  # many repeats
    vals = torch.randn(w, k, device="cuda", generator=gen)
    first = torch.empty(n, device="cuda")
    _scatter_mean(first, idx, vals, w, n)
    for _ in range(10):
        again = torch.empty(n, device="cuda")
        _scatter_mean(again, idx, vals, w, n)
        assert torch.equal(again, first)
    ref = torch.zeros(n, dtype=torch.float64, device="cuda")
    ref.index_add_(0, idx.reshape(-1), vals.reshape(-1).double())
    assert torch.allclose(first.double(), ref / w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("hooks", [("powersgd",), ("mstopk", "topk")])
def test_gloo_hooks_on_cuda_tensors_pass_under_the_race_probe(hooks):
    """World 1 over gloo with CUDA buckets: PowerSGD serialized, the sparse hooks' buffers
    read in callbacks; every case equal to its undelayed run and with no host sync."""
    import torch.distributed as dist

    from bench.benchmarks.spawn import free_port
    from bench.gpucheck.hooks import check_layout

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        rows = check_layout(0, 1, "cuda:0", 0, 1024, hooks)
    finally:
        dist.destroy_process_group()
    assert rows and all(not r["why"] for r in rows), [r["why"] for r in rows]
