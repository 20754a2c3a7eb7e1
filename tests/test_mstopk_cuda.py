"""MSTopK on CUDA: at most one host sync per call, exact results, the Triton kernel (GPU only).

Run on a GPU machine with ``pytest -m gpu tests/test_mstopk_cuda.py``.  The sync count is
taken twice: from torch's sync debug mode (every synchronising CUDA call warns) and from the
module's own counter (:func:`bench.comm.selection.host_syncs`).  The last tests run the CUDA
branch of ``bench topk`` on the CPU with stand-in CUDA events (default suite).
"""

from __future__ import annotations

import time
import warnings

import pytest
import torch

from bench.benchmarks.timing import interleaved
from bench.comm import selection
from bench.comm.cost import k_for
from bench.comm.selection import MSTOPK_METHODS, host_syncs, mstopk

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

N = 25_600_000  # ResNet-50's gradient


@pytest.fixture(scope="module")
def gaussian() -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(0)
    return torch.randn(N, device="cuda", generator=g)


def _synced_call(x: torch.Tensor, k: int, method: str, **kw: object):
    """mstopk under sync debug mode: (result, [where each sync warning came from], counted)."""
    torch.cuda.synchronize()
    before = host_syncs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = mstopk(x, k, method, **kw)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    syncs = [
        f"{w.filename}:{w.lineno}: {w.message}"
        for w in caught
        # the sync warnings, not the one-time "debug mode is a prototype" notice
        if "called a synchronizing cuda operation" in str(w.message).lower()
    ]
    return out, syncs, host_syncs() - before


def _magnitudes(v: torch.Tensor) -> torch.Tensor:
    return v.abs().float().sort().values


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("density", [0.001, 0.01])
@pytest.mark.parametrize("method", MSTOPK_METHODS)
def test_one_sync_and_exact(gaussian: torch.Tensor, method: str, density: float, dtype) -> None:
    x = gaussian.to(dtype)
    k = k_for(N, density)
    mstopk(x, k, method)  # warm-up: Triton compilation, allocator
    (vals, idx), syncs, counted = _synced_call(x, k, method)
    assert len(syncs) <= 1, syncs
    assert counted == 1
    assert idx.numel() == k and idx.unique().numel() == k
    assert torch.equal(vals, x[idx])
    exact = torch.topk(x.abs().float(), k, sorted=False).values
    if method == "paper":  # approximate within the last band; same set as the CPU structure
        cov = float(x[idx].double().pow(2).sum() / exact.double().pow(2).sum())
        assert cov >= 0.99, cov
        ref = mstopk(x, k, method, _device_path=False)[1]
        assert set(idx.tolist()) == set(ref.tolist())
    else:
        assert torch.equal(_magnitudes(vals), _magnitudes(exact))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("density", [0.001, 0.01])
def test_triton_and_torch_paths_select_alike(gaussian: torch.Tensor, density: float, dtype) -> None:
    x = gaussian.to(dtype)
    k = k_for(N, density)
    (tv, ti), syncs, _ = _synced_call(x, k, "tiled", kernel="triton")
    assert len(syncs) <= 1, syncs
    pv, pi = mstopk(x, k, "tiled", kernel="torch")
    exact = torch.topk(x.abs().float(), k, sorted=False).values
    assert torch.equal(_magnitudes(tv), _magnitudes(exact))
    assert torch.equal(_magnitudes(pv), _magnitudes(exact))
    if dtype == torch.float32:  # no ties to break differently: the very same indices
        assert set(ti.tolist()) == set(pi.tolist())
    mstopk(x, k, "tiled")  # kernel="auto" takes the Triton path and it works
    assert not selection._TRITON_BROKEN


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("density", [0.001, 0.01])
def test_paper_search_in_triton_matches_torch(
    gaussian: torch.Tensor, density: float, dtype
) -> None:
    """The same float64 search in two launches per iteration: the very same set."""
    x = gaussian.to(dtype)
    k = k_for(N, density)
    (_, ti), syncs, _ = _synced_call(x, k, "paper", kernel="triton")
    assert len(syncs) <= 1, syncs
    pi = mstopk(x, k, "paper", kernel="torch")[1]
    assert ti.numel() == k and set(ti.tolist()) == set(pi.tolist())
    assert not selection._TRITON_BROKEN


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("method", MSTOPK_METHODS)
def test_nonfinite_raises_on_cuda(gaussian: torch.Tensor, method: str) -> None:
    for pos, bad in [(0, float("nan")), (N // 2 + 3, float("inf")), (N - 1, -float("inf"))]:
        x = gaussian.clone()
        x[pos] = bad
        with pytest.raises(ValueError, match="NaN or Inf"):
            mstopk(x, k_for(N, 0.001), method)


# --- the CUDA branch of ``bench topk`` without a GPU: stand-in events, CPU tensors -------


class _FakeEvent:
    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _FakeEvent) -> float:
        return (end.t - self.t) * 1e3


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)


def test_cuda_event_times_interleaves(fake_cuda: None) -> None:
    calls: list[str] = []
    cases = {n: (lambda n=n: calls.append(n)) for n in "abc"}
    res = interleaved(cases, warmup=2, reps=4, events=True)
    assert calls[:6] == list("abcabc")  # warm-up rounds, untimed
    assert calls[6:] == list("abcbcacababc")  # rotated by one each round
    assert all(r["reps"] == 4 and r["median_ms"] >= 0 for r in res.values())


def test_cuda_bench_rows(fake_cuda: None, tmp_path) -> None:
    pytest.importorskip("pandas")  # the benchmark's rows (this module loads without it)
    from bench.benchmarks import topk as topk_bench
    from bench.benchmarks.harness import BenchRun

    bench = BenchRun("topk", tmp_path)
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    cuda = torch.device("cuda")
    topk_bench._one(bench, x, "gaussian", x.numel(), 0.01, 2, 1, cuda, (), ef=False)
    df = bench.frame().set_index("method")
    assert set(df.index) == {
        "sum",
        "torch.topk",
        "mstopk-tiled[torch]",
        "mstopk-paper[torch]",
        "mstopk-sampled",
        "mstopk-hist",
    }
    assert (df["device"] == "cuda").all() and (df["cuda_syncs"] == 0).all()
    ms = df[df.index.str.startswith("mstopk")]
    assert (ms["coverage"] >= 0.99).all() and (ms["syncs"] >= 1).all()
    assert df.loc["mstopk-tiled[torch]", "coverage"] == pytest.approx(1.0)
    assert df.loc["sum", "x_floor"] == 1.0
    names = topk_bench._mstopk_cases(cuda, ("tiled",))  # where only tiled's kernel works
    assert names["mstopk-tiled[triton]"] == ("tiled", {"kernel": "triton"})
    assert "mstopk-paper[torch]" in names and "mstopk-paper[triton]" not in names


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("density", [0.001, 0.01, 0.25])
def test_radix_path_sync_free_in_a_hook_and_captured_in_a_graph(
    gaussian: torch.Tensor, density: float, dtype
) -> None:
    """Inside deferred_finite (a hook) no sync at all, by torch's own count, at every
    density; the same call captured in a CUDA graph and replayed on new values selects
    their top k (fixed shapes, nothing read back)."""
    from bench.comm.selection_core import deferred_finite

    x = gaussian.to(dtype)
    k = k_for(N, density)
    exact = torch.topk(x.abs().float(), k, sorted=False).values
    finite: list[torch.Tensor] = []
    mstopk(x, k, "tiled")  # warm-up: compiles
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with deferred_finite(finite):
                vals, idx = mstopk(x, k, "tiled")
        finally:
            torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchronizing cuda operation" in str(w.message).lower()]
    assert not syncs, [str(w.message) for w in syncs]
    assert bool(torch.stack(finite).all()) and idx.unique().numel() == k
    assert torch.equal(_magnitudes(vals), _magnitudes(exact))
    assert "radix" not in selection._TRITON_BROKEN
    static = x.clone()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), deferred_finite([]):
        mstopk(static, k, "tiled")  # warm-up on the capturing stream
        with torch.cuda.graph(graph, stream=stream):
            gvals, gidx = mstopk(static, k, "tiled")
    torch.cuda.current_stream().wait_stream(stream)
    static.copy_(torch.randn_like(static))
    graph.replay()
    want = torch.topk(static.abs().float(), k, sorted=False).values
    assert gidx.unique().numel() == k and torch.equal(_magnitudes(gvals), _magnitudes(want))
