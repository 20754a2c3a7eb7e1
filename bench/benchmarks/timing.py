"""The one timing harness of benchmarks, gpucheck and profiles: warm-up, interleaving, median;
CUDA events where asked, else the host clock with CUDA synchronised around each sample.
Standard library and torch only (the GPU machine has nothing else)."""

from __future__ import annotations

import contextlib
import random
import statistics
import time
import traceback
import warnings
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

K = TypeVar("K", bound=Hashable)  # the name of a timed case


def _sync() -> None:
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


@contextlib.contextmanager
def cuda_syncs(
    on: bool = True, site: Callable[[list[traceback.FrameSummary]], str] | None = None
) -> Iterator[list[str]]:
    """Where synchronising CUDA calls were made from Python threads inside the block (torch's
    sync debug mode warns at each; gloo's C++ threads do not reach Python's warnings):
    ``file:line`` of the warning, or ``site(the Python stack at the call)``."""
    found: list[str] = []
    if not on:
        yield found
        return

    def note(message: Any, category: Any, filename: str, lineno: int, *_: Any) -> None:
        if "synchronizing cuda operation" in str(message).lower():
            found.append(site(traceback.extract_stack()[:-1]) if site else f"{filename}:{lineno}")

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = note  # called on the warning's own thread, its stack intact
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield found
        finally:
            torch.cuda.set_sync_debug_mode(0)


class Clock:
    """Stamps on the current stream: CUDA events on a GPU, the host clock on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def stamp(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def ms(self, a: Any, b: Any) -> float:
        """Milliseconds from stamp ``a`` to stamp ``b`` (events: once both are done)."""
        return a.elapsed_time(b) if self.cuda else 1e3 * (b - a)


def summarize(times_ms: Sequence[float]) -> dict[str, float]:
    """Median, min and inter-quartile range (ms) of timed calls, and their count."""
    q = statistics.quantiles(times_ms, n=4) if len(times_ms) >= 2 else [times_ms[0]] * 3
    return {
        "median_ms": statistics.median(times_ms),
        "min_ms": min(times_ms),
        "iqr_ms": q[2] - q[0],
        "reps": len(times_ms),
    }


def interleaved_times(
    cases: Mapping[K, Callable[[], object]],
    *,
    warmup: int = 1,
    reps: int = 5,
    shuffle: bool = False,
    iters: int = 1,
    events: bool = False,
    slowest_rank: bool = False,
    setup: Mapping[K, Callable[[], object]] | None = None,
) -> dict[K, list[float]]:
    """Times (ms per call) of ``reps`` rounds, one sample (``iters`` calls) of each case per
    round, after ``warmup`` rounds of one call each (discarded); ``setup[name]`` runs
    untimed before each sample of its case.  Each round's order is rotated by one, or
    shuffled (seed 0), so that no case always runs right after the same other one."""
    names = list(cases)

    def sample(name: K, n: int) -> float:
        """ms per call of ``n`` back-to-back calls; ``slowest_rank``: all ranks start together
        and the slowest one's time counts."""
        if setup is not None and name in setup:
            setup[name]()
        _sync()
        if slowest_rank:
            dist.barrier()
        if events:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        for _ in range(n):
            cases[name]()
        if events:
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            _sync()
            ms = (time.perf_counter() - t0) * 1e3
        if slowest_rank:
            t = torch.tensor([ms])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            ms = float(t.item())
        return ms / n

    for _ in range(warmup):
        for name in names:
            sample(name, 1)
    times: dict[K, list[float]] = {name: [] for name in names}
    rng, order = random.Random(0), list(names)
    for r in range(reps):
        if shuffle:
            rng.shuffle(order)
        else:
            order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            times[name].append(sample(name, iters))
    return times


def interleaved(
    cases: Mapping[K, Callable[[], object]], **options: Any
) -> dict[K, dict[str, float]]:
    """:func:`summarize` of each case's :func:`interleaved_times`."""
    return {n: summarize(ts) for n, ts in interleaved_times(cases, **options).items()}


def median_s(
    fn: Callable[[], object], *, setup: Callable[[], object] | None = None, **options: Any
) -> float:
    """Median seconds of one call of ``fn`` (:func:`interleaved_times` of the one case)."""
    on = {0: setup} if setup is not None else None
    return statistics.median(interleaved_times({0: fn}, setup=on, **options)[0]) / 1e3
