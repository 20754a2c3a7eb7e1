"""Spawned-worker half of ``tests/test_comm_nosync.py``: host reads inside the DDP hooks.

A CPU has no device to synchronise with, so the proxy is every way Python code can read a
tensor's value on the host (``item``, ``tolist``, ``bool``/``int``/``float``, ``nonzero``,
``numpy``) and the selectors' own counter (``host_syncs``).  On CUDA each of those is a
host sync; counted while DDP's backward pass runs the hooks and their callbacks, they
must stay at zero.  The selectors run their CUDA structure (``_device_path``), the one a
GPU takes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bench.comm import make_hook
from bench.comm.selection_core import host_syncs

HOOKS = ("dense", "fp16", "bf16", "topk", "mstopk", "randomk", "hitopk")
_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "nonzero", "numpy")


@contextlib.contextmanager
def counted_reads() -> Iterator[dict[str, int]]:
    """Count calls of the tensor-reading methods (any thread) inside the block."""
    counts = {name: 0 for name in _READS}
    lock = threading.Lock()
    saved = {name: getattr(torch.Tensor, name) for name in _READS}
    saved_fn = torch.nonzero

    def wrap(name: str, fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            with lock:
                counts[name] += 1
            return fn(*args, **kwargs)

        return counted

    for name, fn in saved.items():
        setattr(torch.Tensor, name, wrap(name, fn))
    torch.nonzero = wrap("nonzero", saved_fn)
    try:
        yield counts
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
        torch.nonzero = saved_fn


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.Linear(256, 8))


def _run(name: str, world: int, steps: int, nan_at: int | None) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(_model(), bucket_cap_mb=0.1)  # several buckets per step
    opts: dict[str, Any] = {"density": 0.05, "min_numel": 0, "timing": False}
    if name == "hitopk":
        opts["procs_per_node"] = 1  # every worker its own node
    state, hook = make_hook(name, **opts)
    ddp.register_comm_hook(state, hook)
    state.nan_check = True  # every reduced bucket's flag too (what train.nan_check=step sets)
    if getattr(state.comm.compressor, "selector", "") == "mstopk":  # its CUDA structure
        state.comm.compressor.options["_device_path"] = True
    reads, syncs, flags, error = {}, 0, [], ""
    gen = torch.Generator().manual_seed(1 + dist.get_rank())
    for step in range(steps):
        x = torch.randn(32, 64, generator=gen)
        loss = ddp(x).square().mean()
        if step == nan_at:
            loss = loss * float("nan")
        before = host_syncs()
        with counted_reads() as counts:
            loss.backward()  # DDP runs the hook; waits for every bucket's future
        if step:  # step 0 fills host-side caches once (wire limits: CPU constants)
            syncs += host_syncs() - before
            for k, v in counts.items():
                reads[k] = reads.get(k, 0) + v
        flags += [bool(ok) for _, ok in state.take_finite()]
        ddp.zero_grad()
    try:
        state.check_finite()
    except ValueError as e:
        error = str(e)
    return {"reads": reads, "syncs": syncs, "flags": flags, "error": error}


def run_nosync(rank: int, world: int) -> dict[str, Any]:
    """Per hook: host reads during backward passes 2 and 3; mstopk again with a NaN at 2."""
    out = {name: _run(name, world, 3, None) for name in HOOKS}
    out["mstopk-nan"] = _run("mstopk", world, 3, nan_at=1)
    return out
