"""``bench topk``: top-k selection time, torch.topk vs the MSTopK variants interleaved on the
same tensor, a read pass as floor; at 25.6 M also the error-feedback step in three in-place
forms.  Columns and protocol: docs/internals/benchmarks.md (topk)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import torch
from matplotlib.colors import to_rgb

from bench.benchmarks import BENCHMARKS, BenchmarkSpec
from bench.benchmarks.harness import BenchRun, finite, fmt
from bench.benchmarks.timing import cuda_syncs, interleaved
from bench.comm.cost import k_for
from bench.comm.selection import MSTOPK_METHODS, host_syncs, mstopk, mstopk_ef
from bench.results.plots import SELECTION_COLOURS, SELECTION_STYLES, save_figure

SIZES = [1_000_000, 4_000_000, 16_000_000, 25_600_000, 64_000_000]
CUDA_SIZES = [25_600_000, 100_000_000]
DENSITIES = [0.001, 0.01]
RESNET50 = 25_600_000
CUDA_WARMUP, CUDA_REPS = 2, 10
TRITON_METHODS = ("tiled", "paper")  # the mstopk methods with a Triton kernel


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


def _ef_cases(grad: torch.Tensor, k: int, resid0: torch.Tensor | None = None) -> dict[str, Any]:
    """The error-feedback step in its three in-place forms, each with its own residual
    (``resid0`` or zeros); each call returns the sent ``(values, indices)``."""
    cases: dict[str, Any] = {}

    def unfused(select: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], Any]:
        resid = torch.zeros_like(grad) if resid0 is None else resid0.clone()

        def step() -> tuple[torch.Tensor, torch.Tensor]:
            resid.add_(grad)
            idx = select(resid)
            sent = resid[idx]
            resid[idx] = 0
            return sent, idx

        return step

    cases["topk+ef"] = unfused(lambda r: torch.topk(r.abs(), k, sorted=False).indices)
    cases["mstopk+ef"] = unfused(lambda r: mstopk(r, k)[1])
    fused_resid = torch.zeros_like(grad) if resid0 is None else resid0.clone()
    cases["mstopk+ef[fused]"] = lambda: mstopk_ef(fused_resid, grad, k)
    return cases


def check_ef_cases(grad: torch.Tensor, k: int) -> None:
    """One step of each error-feedback form from the same nonzero residual selects the set
    ``torch.topk`` selects from ``residual + grad``; raises RuntimeError otherwise."""
    g = torch.Generator().manual_seed(1)
    resid0 = (torch.randn(grad.numel(), generator=g) * float(grad.std())).to(grad)
    want = set(torch.topk((resid0 + grad).abs(), k, sorted=False).indices.tolist())
    for name, step in _ef_cases(grad, k, resid0.view_as(grad)).items():
        if set(step()[1].tolist()) != want:
            raise RuntimeError(f"bench topk: {name} does not select torch.topk's set")


def run(results_dir: str = "results", quick: bool = False) -> Path:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sizes = [100_000] if quick else (CUDA_SIZES if device.type == "cuda" else SIZES)
    triton: list[str] = []  # the methods whose kernel="triton" compiles and runs here
    x = torch.randn(1 << 20, device=device) if device.type == "cuda" else None
    for m in TRITON_METHODS if x is not None else ():
        try:
            mstopk(x, 1000, m, kernel="triton")
            triton.append(m)
        except Exception as e:  # noqa: BLE001 - reported; its torch path is timed alone
            print(f"bench topk: no mstopk-{m}[triton] rows ({e!r})", flush=True)
    ef_size = 100_000 if quick else RESNET50
    densities = [0.01] if quick else DENSITIES
    default_threads = torch.get_num_threads()
    bench = BenchRun("topk", results_dir)
    print(
        "bench topk: mstopk-tiled is mstopk's default method, this project's own exact variant "
        "(a sampled threshold, one compare pass, an exact top k of the candidates; on CUDA a "
        "radix select of group maxima); mstopk-paper is the paper's multi-threshold search "
        "(approximate within its last band), timed beside it on the same tensor",
        flush=True,
    )
    try:
        for n in sizes:
            settings = [("gaussian", 1)]
            if n == ef_size:
                settings += [("heavy", 1), ("cauchy", 1)]
                if device.type == "cpu" and default_threads > 1:
                    settings += [("gaussian", default_threads)]
            for kind, threads in settings:
                if device.type == "cpu":
                    torch.set_num_threads(threads)
                # made where they are used (100 M normals take milliseconds on a GPU)
                gen = torch.Generator(device).manual_seed(0)
                if kind == "cauchy":  # heavier still: no mean; values spread over many octaves
                    x = torch.empty(n).cauchy_(generator=torch.Generator().manual_seed(0))
                    x = x.mul_(1e-3).to(device)
                elif kind == "heavy":  # Student's t, 1.5 degrees of freedom
                    x = torch.distributions.StudentT(torch.tensor(1.5, device=device)).sample((n,))
                    x = x * 1e-3
                else:
                    x = torch.randn(n, device=device, generator=gen)
                reps = 2 if quick else (3 if n > RESNET50 else 5)
                ef = n == ef_size and kind == "gaussian" and threads == 1
                for density in densities:
                    _one(bench, x, kind, n, density, reps, threads, device, tuple(triton), ef)
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
        check_ef_cases(x, k)
        cases.update(_ef_cases(x, k))
    cuda = device.type == "cuda"
    warmup, reps = (CUDA_WARMUP, CUDA_REPS) if cuda else (1, reps)
    res = interleaved(cases, warmup=warmup, reps=reps, events=cuda)
    floor, base = res["sum"]["median_ms"], res["torch.topk"]["median_ms"]
    for name, t in res.items():
        cov, syncs = float("nan"), float("nan")
        if name in ms_cases:
            before = host_syncs()
            idx = mstopk(x, k, ms_cases[name][0], **ms_cases[name][1])[1]
            syncs = host_syncs() - before
            cov = float(x[idx].double().pow(2).sum()) / exact_sq  # the mass captured
        elif name == "torch.topk" or "+ef" in name:
            cov = 1.0  # the error-feedback forms were checked to select torch.topk's set
        extra = {}
        if cuda:  # synchronising CUDA calls of one call (torch's sync debug mode)
            torch.cuda.synchronize()
            with cuda_syncs() as found:
                cases[name]()
            extra["cuda_syncs"] = len(found)
        row = dict(method=name, input=kind, numel=n, density=density, k=k, threads=threads)
        row.update(coverage=cov, speedup_vs_topk=base / t["median_ms"])
        row.update(x_floor=t["median_ms"] / floor, device=device.type, syncs=syncs)
        row = bench.add(**row, **extra, **t)
        cs = f"/{extra['cuda_syncs']}" if cuda else ""
        print(
            f"{name:>20} {kind:>8} n={n:>11,} d={density:<6} thr={threads} "
            f"{row['median_ms']:9.3f} ms  cov={cov:.5f}  syncs={syncs}{cs}  "
            f"x{row['speedup_vs_topk']:.1f} vs topk  {row['x_floor']:.1f}x floor",
            flush=True,
        )
    _summary(res)


def _summary(res: dict[str, dict[str, float]]) -> None:
    """The ratios the benchmark is about, printed after each (size, density)."""
    ms = {name: t["median_ms"] for name, t in res.items()}
    tiled = next((n for n in ms if n.startswith("mstopk-tiled")), None)
    paper = next((n for n in ms if n.startswith("mstopk-paper")), None)
    if tiled and paper:
        print(
            f"  {tiled} (mstopk's default: this project's exact variant) "
            f"{ms[tiled] / ms['sum']:.1f}x floor; {paper} (the paper's search, same tensor) "
            f"{ms[paper] / ms['sum']:.1f}x floor; torch.topk {ms['torch.topk'] / ms['sum']:.1f}x",
            flush=True,
        )
    if "topk+ef" in ms:
        print(
            "  error feedback: topk+ef (in place) / torch.topk "
            f"{ms['topk+ef'] / ms['torch.topk']:.2f}; "
            f"faster selection: topk+ef / mstopk+ef {ms['topk+ef'] / ms['mstopk+ef']:.2f}; "
            f"fusing: mstopk+ef / mstopk+ef[fused] {ms['mstopk+ef'] / ms['mstopk+ef[fused]']:.2f}",
            flush=True,
        )


def _plot(bench: BenchRun) -> None:
    # legend entries of the baselines, saying what they are
    labels = {"sum": "read floor (a sum over the tensor)", "torch.topk": "torch.topk (baseline)"}
    df = bench.frame()
    df = df[(df["input"] == "gaussian") & (df["threads"] == 1)]
    dens = sorted(d for d in df["density"].unique() if d > 0)
    fig, axes = plt.subplots(1, len(dens), figsize=(6 * len(dens), 4.5), squeeze=False)
    for ax, d in zip(axes[0], dens, strict=True):
        sub = df[df["density"] == d]
        for method, g in sub.groupby("method", sort=False):
            if "+ef" in method:
                continue
            g = g.sort_values("numel")
            key = method.removeprefix("mstopk-").split("[")[0]
            key = key if key in SELECTION_STYLES else "other"
            ls, mk = SELECTION_STYLES[key]
            if method.endswith("[torch]"):  # the torch build of a kernel: dotted, hollow
                ls = ":"
            # the selector's colour mixed towards black (by < 0) or white (by > 0)
            by, end = SHADES.get(key, 0.0), 1.0 if SHADES.get(key, 0.0) > 0 else 0.0
            colour = tuple(c + abs(by) * (end - c) for c in to_rgb(SELECTION_COLOURS[key]))
            ax.plot(g["numel"], g["median_ms"], ls=ls, marker=mk, color=colour,
                    mfc="none" if method.endswith("[torch]") else None,
                    label=labels.get(method, method), markersize=5)  # fmt: skip
        ax.set(xscale="log", yscale="log", xlabel="tensor size (float32 elements, log)")
        ax.set_ylabel("selection time per call (ms, median, log)")
        on_cpu = (sub["device"] == "cpu").all()
        ax.set_title(f"density {d}, 1 thread" if on_cpu else f"density {d}, CUDA")
        ax.grid(True, which="both", alpha=0.3)
    # one legend, beside the last panel: it covers no line
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    torch_builds = df["method"].str.endswith("[torch]").any()
    # which code the rows timed (a kernel's label stays, what runs under it can change)
    sha, date = str(bench.meta.get("git_sha") or "")[:7], str(bench.meta.get("date") or "")[:10]
    code = ", ".join(p for p in (f"git {sha}" if sha else "", date) if p)
    code = f" ({code})" if code else ""
    fig.suptitle(
        f"top-k selection time on {bench.meta['hardware']}{code}\nmstopk's "
        "implementations in shades of mstopk's colour"
        + (" (hollow, dotted: a kernel's torch build)" if torch_builds else "")
        + "; baselines that are not methods (torch.topk, the read floor) in black",
        fontsize=9,
    )
    save_figure(fig, bench.png_path)


# each implementation its own shade of the selector's colour: -1 black .. 0 itself .. 1 white
SHADES = {"paper": 0.0, "tiled": -0.55, "sampled": 0.5, "hist": -0.28, "other": 0.7}


FAMILIES = (  # (method prefix, how the report names it): the paper's first
    ("mstopk-paper", "the paper's threshold search"),
    ("mstopk-tiled", "this project's exact variant"),
)


def headline(rows: pd.DataFrame) -> list[str]:
    """The largest tensor of the run at its smallest density, against torch.topk of the
    same run: the paper's threshold search, then this project's exact variant ``tiled``,
    each implementation with its own number (none is picked as the best of several)."""
    if not {"method", "numel", "density", "median_ms"} <= set(rows.columns):
        return []
    m = rows["method"].astype(str)
    r = rows[
        (rows["density"] > 0)
        & m.str.startswith(("torch.topk", "mstopk"))
        & ~m.str.contains(r"\+ef")
    ]
    if "input" in r:
        r = r[r["input"].fillna("gaussian") == "gaussian"]
    if r.empty:
        return []
    r = r[r["numel"] == r["numel"].max()]
    r = r[r["density"] == r["density"].min()]
    base = r[r["method"] == "torch.topk"]
    if base.empty:
        return []
    b = float(base["median_ms"].median())
    n, d = int(r["numel"].iloc[0]), float(r["density"].iloc[0])
    parts = []
    for prefix, name in FAMILIES:
        fam = r[r["method"].astype(str).str.startswith(prefix)]
        for method, g in fam.groupby("method", sort=True):
            ms = float(g["median_ms"].median())
            parts.append(f"{name} ({method}) {fmt(finite(ms), ' ms')}, {b / ms:.2f}x")
    if not parts:
        return []
    return [
        f"top-k of {n:,} values at density {d:g}, against torch.topk {fmt(b, ' ms')} (1.00x): "
        + "; ".join(parts)
    ]


BENCHMARKS.register("topk")(BenchmarkSpec(run=run, replot=_plot, headline=headline))
