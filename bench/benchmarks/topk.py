"""``bench topk``: top-k selection time, torch.topk vs the MSTopK variants, one read pass as floor.

For each size (1 M, 4 M, 16 M, 25.6 M = ResNet-50's gradient, 64 M float32 elements) and
density (0.001, 0.01) it times, in the same run and on the same tensor:

- ``sum``: ``x.sum()``, one read pass over the tensor: the floor any selection pays;
- ``torch.topk``: ``torch.topk(x.abs(), k)``, the exact baseline;
- ``mstopk-<method>`` for each method of :func:`bench.comm.selection.mstopk`;
- at 25.6 M, the error-feedback step too: ``topk+ef`` (``acc = g + r``; exact top-k of
  ``acc``; ``r = acc`` with the sent entries zeroed, each a separate tensor) against
  ``mstopk+ef`` (the fused residual memory: ``r += g`` in place, select, subtract in place).

Columns: ``method``, ``input`` (gaussian; heavy = Student-t with 1.5 dof at 25.6 M),
``numel``, ``density``, ``k``, ``median_ms`` (see Timing below), ``coverage`` (the fraction of
the exact top-k's squared magnitude captured), ``speedup_vs_topk`` (torch.topk's median /
this median) and ``x_floor`` (this median / ``sum``'s median), ``threads``, ``syncs`` (host
syncs of one mstopk call, counted by :func:`bench.comm.selection.host_syncs`) and, on
CUDA, ``cuda_syncs`` (synchronising CUDA calls of one call of the case, from torch's sync
debug mode; every case).

On CUDA (when available) the sizes are 25.6 M and 100 M elements, generated on the GPU,
and ``tiled`` and ``paper`` are timed twice: ``mstopk-tiled[triton]`` (the column maxima
by a Triton kernel, the default there) and ``mstopk-tiled[torch]``, likewise
``mstopk-paper[triton]`` (its search in Triton) and ``[torch]``; each case is timed with CUDA events
(2 warm-up rounds, then 10 interleaved rounds; the GPU is idle before each call).

Timing: the cases of one (size, density) are measured *interleaved* (one call of each in
turn, the order rotated every round, after a warm-up round), so that load from other
processes on a shared machine hits baseline and subject alike; the median per case is
reported.  On the CPU every case runs with one intra-op thread (``threads=1``): that is a
DDP worker's share of this 2-core machine (2 workers per node), and on a loaded machine
torch's 2-thread kernels wait for the slower thread (the 25.6 M rows are repeated with
torch's default thread count for comparison).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from bench.benchmarks import BENCHMARKS, BenchmarkSpec
from bench.benchmarks.harness import BenchRun, interleaved, summarize
from bench.comm.compressors import MSTopKCompressor, ResidualMemory
from bench.comm.selection import MSTOPK_METHODS, host_syncs, k_for, mstopk

SIZES = [1_000_000, 4_000_000, 16_000_000, 25_600_000, 64_000_000]
CUDA_SIZES = [25_600_000, 100_000_000]
DENSITIES = [0.001, 0.01]
RESNET50 = 25_600_000
CUDA_WARMUP, CUDA_REPS = 2, 10
TRITON_METHODS = ("tiled", "paper")  # the mstopk methods with a Triton kernel


def _input(kind: str, n: int, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":  # generated where it is used: 100 M normals in milliseconds
        if kind == "heavy":
            return (
                torch.distributions.StudentT(torch.tensor(1.5, device=device)).sample((n,)) * 1e-3
            )
        return torch.randn(n, device=device, generator=torch.Generator(device).manual_seed(0))
    g = torch.Generator().manual_seed(0)
    if kind == "heavy":
        x = torch.distributions.StudentT(1.5).sample((n,)) * 1e-3
    else:
        x = torch.randn(n, generator=g)
    return x.to(device)


def cuda_event_times(
    cases: dict[str, Callable[[], object]], warmup: int = CUDA_WARMUP, reps: int = CUDA_REPS
) -> dict[str, dict[str, float]]:
    """:func:`~bench.benchmarks.harness.summarize` of each case's GPU times (ms) by CUDA events.

    Interleaved like :func:`~bench.benchmarks.harness.interleaved` (``warmup`` untimed
    rounds, then one call of each case per round, the order rotated by one each round); the
    GPU is drained before each call, so a call's time includes its own host waits.
    """
    names = list(cases)
    for _ in range(warmup):
        for n in names:
            cases[n]()
    times: dict[str, list[float]] = {n: [] for n in names}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(reps):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            torch.cuda.synchronize()
            start.record()
            cases[n]()
            end.record()
            end.synchronize()
            times[n].append(start.elapsed_time(end))
    return {n: summarize(ts) for n, ts in times.items()}


def _cuda_syncs(fn: Callable[[], object]) -> int:
    """Synchronising CUDA calls made by one call of ``fn`` (torch's sync debug mode)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message).lower() for w in caught)


def _triton_methods(device: torch.device) -> tuple[str, ...]:
    """The methods of :data:`TRITON_METHODS` whose ``kernel="triton"`` compiles and runs here."""
    if device.type != "cuda":
        return ()
    ok = []
    x = torch.randn(1 << 20, device=device)
    for m in TRITON_METHODS:
        try:
            mstopk(x, 1000, m, kernel="triton")
            ok.append(m)
        except Exception as e:  # noqa: BLE001 - reported; its torch path is timed alone
            print(f"bench topk: no mstopk-{m}[triton] rows ({e!r})", flush=True)
    return tuple(ok)


def _mstopk_cases(
    device: torch.device, triton: tuple[str, ...]
) -> dict[str, tuple[str, dict[str, str]]]:
    """Row name -> (method, extra mstopk options)."""
    out: dict[str, tuple[str, dict[str, str]]] = {}
    for m in MSTOPK_METHODS:
        if m in TRITON_METHODS and device.type == "cuda":
            for kern in ("triton", "torch") if m in triton else ("torch",):
                out[f"mstopk-{m}[{kern}]"] = (m, {"kernel": kern})
        else:
            out[f"mstopk-{m}"] = (m, {})
    return out


def _coverage(x: torch.Tensor, idx: torch.Tensor, exact_sq: float) -> float:
    return float(x[idx].double().pow(2).sum()) / exact_sq


def _ef_cases(x: torch.Tensor, k: int, density: float) -> dict[str, object]:
    """Unfused exact top-k + error feedback vs the fused residual memory with MSTopK."""
    grad = x
    resid = torch.zeros_like(x)

    def unfused() -> torch.Tensor:
        acc = grad + resid
        idx = torch.topk(acc.abs(), k, sorted=False).indices
        vals = acc[idx]
        new = acc.clone()
        new[idx] = 0
        resid.copy_(new)
        return vals

    mem, comp = ResidualMemory(), MSTopKCompressor()

    def fused() -> None:
        acc = mem.compensate(grad, "b")
        c = comp.compress(acc, density)
        mem.update("b", acc, c)

    return {"topk+ef": unfused, "mstopk+ef": fused}


def run(results_dir: str = "results", quick: bool = False) -> Path:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sizes = [100_000] if quick else (CUDA_SIZES if device.type == "cuda" else SIZES)
    triton = _triton_methods(device)
    ef_size = 100_000 if quick else RESNET50
    densities = [0.01] if quick else DENSITIES
    default_threads = torch.get_num_threads()
    bench = BenchRun("topk", results_dir)
    try:
        for n in sizes:
            settings = [("gaussian", 1)]
            if n == ef_size:
                settings += [("heavy", 1)]
                if device.type == "cpu" and default_threads > 1:
                    settings += [("gaussian", default_threads)]
            for kind, threads in settings:
                if device.type == "cpu":
                    torch.set_num_threads(threads)
                x = _input(kind, n, device)
                reps = 2 if quick else (3 if n > RESNET50 else 5)
                for density in densities:
                    _one(
                        bench,
                        x,
                        kind,
                        n,
                        density,
                        reps,
                        threads,
                        device,
                        triton,
                        ef=n == ef_size and kind == "gaussian" and threads == 1,
                    )
                del x
    finally:
        torch.set_num_threads(default_threads)
    path = bench.save()
    _plot(bench)
    return path


def _one(
    bench: BenchRun,
    x: torch.Tensor,
    kind: str,
    n: int,
    density: float,
    reps: int,
    threads: int,
    device: torch.device,
    triton: tuple[str, ...],
    ef: bool,
) -> None:
    k = k_for(n, density)
    exact = torch.topk(x.abs(), k, sorted=False)
    exact_sq = float(exact.values.double().pow(2).sum())
    cases: dict[str, Callable[[], object]] = {
        "sum": lambda: x.sum(),
        "torch.topk": lambda: torch.topk(x.abs(), k, sorted=False),
    }
    ms_cases = _mstopk_cases(device, triton)
    for name, (m, kw) in ms_cases.items():
        cases[name] = lambda m=m, kw=kw: mstopk(x, k, m, **kw)
    if ef:
        cases.update(_ef_cases(x, k, density))
    cuda = device.type == "cuda"
    res = cuda_event_times(cases) if cuda else interleaved(cases, warmup=1, reps=reps)
    floor, base = res["sum"]["median_ms"], res["torch.topk"]["median_ms"]
    for name, t in res.items():
        cov, syncs = float("nan"), float("nan")
        if name in ms_cases:
            before = host_syncs()
            idx = mstopk(x, k, ms_cases[name][0], **ms_cases[name][1])[1]
            syncs = host_syncs() - before
            cov = _coverage(x, idx, exact_sq)
        elif name == "torch.topk":
            cov = 1.0
        extra = {"cuda_syncs": _cuda_syncs(cases[name])} if cuda else {}
        row = bench.add(
            method=name,
            input=kind,
            numel=n,
            density=density,
            k=k,
            threads=threads,
            coverage=cov,
            speedup_vs_topk=base / t["median_ms"],
            x_floor=t["median_ms"] / floor,
            device=device.type,
            syncs=syncs,
            **extra,
            **t,
        )
        cs = f"/{extra['cuda_syncs']}" if cuda else ""
        print(
            f"{name:>20} {kind:>8} n={n:>11,} d={density:<6} thr={threads} "
            f"{row['median_ms']:9.3f} ms  cov={cov:.5f}  syncs={syncs}{cs}  "
            f"x{row['speedup_vs_topk']:.1f} vs topk  {row['x_floor']:.1f}x floor",
            flush=True,
        )


def _plot(bench: BenchRun) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.results.plots import save_figure

    df = bench.frame()
    df = df[(df["input"] == "gaussian") & (df["threads"] == 1)]
    dens = sorted(d for d in df["density"].unique() if d > 0)
    fig, axes = plt.subplots(1, len(dens), figsize=(6 * len(dens), 4.5), squeeze=False)
    for ax, d in zip(axes[0], dens, strict=True):
        sub = df[df["density"] == d]
        for method, g in sub.groupby("method", sort=False):
            if method in ("topk+ef", "mstopk+ef"):
                continue
            g = g.sort_values("numel")
            style = "k--" if method == "sum" else ("r-o" if method == "torch.topk" else "-o")
            ax.plot(g["numel"], g["median_ms"], style, label=method, markersize=4)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("elements (float32)")
        ax.set_ylabel("median ms")
        on_cpu = "device" not in sub or (sub["device"] == "cpu").all()
        ax.set_title(f"density {d}, 1 thread" if on_cpu else f"density {d}, CUDA")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"top-k selection time on {bench.meta['hardware']}", fontsize=10)
    save_figure(fig, bench.png_path)


BENCHMARKS.register("topk")(BenchmarkSpec(run=run, replot=_plot))
