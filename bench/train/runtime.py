"""A worker's process group, device, mixed precision, gradient clipping and step timer."""

from __future__ import annotations

import contextlib
import datetime
import inspect
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from bench.cluster.torchrun import GENERATION_ENV, worker_threads

# DDP's keyword for "no buffer broadcast at each forward": torch 2.14 deprecates
# broadcast_buffers (a FutureWarning per worker) for forward_sync_buffers, which still syncs
# them once at construction, where every rank's buffers are the same anyway
NO_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
    else {"broadcast_buffers": False}
)


def setup_distributed(cfg: Any) -> tuple[int, int, torch.device]:
    """(rank, world size, device); the process group from the launcher's environment."""
    use_cuda = torch.cuda.is_available() and cfg.train.device in ("auto", "cuda")
    if cfg.train.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device=cuda but CUDA is not available")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    backend = str(cfg.cluster.backend)
    if backend == "auto":
        backend = "nccl" if use_cuda else "gloo"
    if "RANK" in os.environ and not dist.is_initialized():
        timeout = datetime.timedelta(seconds=float(cfg.comm.timeout_s))
        dist.init_process_group(
            backend=backend,
            device_id=device if backend == "nccl" else None,
            timeout=timeout,
            **_attempt_store(timeout),
        )
    # the node's cores shared by its workers at most (docs/internals/train.md)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    torch.set_num_threads(worker_threads(cfg.cluster.threads_per_worker, local_world))
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    return rank, world, device


def _attempt_store(timeout: datetime.timedelta) -> dict[str, Any]:
    """The process group's store, a namespace per elastic restart (a new group must not read
    the old one's keys); {} when the agent hosts no store."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    # the agents' token of this rendezvous round (bench.cluster.torchrun.instrument_agent)
    attempt = os.environ.get(GENERATION_ENV) or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    client = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    return {
        "store": dist.PrefixStore(f"/bench/attempt_{attempt}", client),
        "rank": int(os.environ["RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
    }


def node_count(world: int) -> int:
    """Nodes of the run (the launcher's GROUP_WORLD_SIZE)."""
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return int(os.environ.get("GROUP_WORLD_SIZE", world // max(1, per_node)))


def amp_context(
    amp: str, device: torch.device
) -> tuple[Callable[[], Any], torch.amp.GradScaler | None]:
    """(autocast context factory, gradient scaler or None) of ``train.amp``."""
    mode = str(amp)
    if mode == "auto":
        mode = "bf16" if device.type == "cuda" else "off"
    if mode == "off":
        return contextlib.nullcontext, None
    dtype = torch.bfloat16 if mode == "bf16" else torch.float16
    scaler = torch.amp.GradScaler(device.type) if mode == "fp16" else None
    return (lambda: torch.autocast(device.type, dtype=dtype)), scaler


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` as rank ``src`` has it, on every rank (itself without a process group)."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src)
    return box[0]


def broadcast_buffers(model: torch.nn.Module) -> None:
    """Evaluate every rank with rank 0's BN statistics (each rank updated its own)."""
    if dist.is_initialized():
        for b in model.buffers():
            dist.broadcast(b, 0)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(t)
    return t


class PhaseTimer:
    """Seconds per phase of a step, summed until :meth:`pop`; on CUDA with ``sync`` each
    boundary synchronises, charging kernels to their phase."""

    def __init__(self, device: torch.device, sync: bool) -> None:
        self.sync = sync and device.type == "cuda"
        self.totals: dict[str, float] = {}
        self._t = time.perf_counter()

    def mark(self, phase: str) -> None:
        if self.sync:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.totals[phase] = self.totals.get(phase, 0.0) + now - self._t
        self._t = now

    def restart(self) -> None:
        self._t = time.perf_counter()

    def pop(self) -> dict[str, float]:
        out, self.totals = self.totals, {}
        return out


def clip_gradients(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    max_norm: float,
) -> torch.Tensor:
    """Clip the gradients' global L2 norm (unscaled first) to ``max_norm``; the norm before."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if scaler is not None and scaler.is_enabled() and any(g.dtype == torch.float16 for g in grads):
        # fp16 gradients (the flat update's model copy): unscale_ refuses them, and the flat
        # optimizer unscales in fp32 itself; clip the scaled gradients instead
        return _clip_scaled(grads, scaler._get_scale_async(), max_norm)
    if scaler is not None:
        scaler.unscale_(optimizer)
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def _clip_scaled(grads: list[torch.Tensor], scale: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Clip gradients scaled by ``scale`` to an unscaled norm of ``max_norm`` (no host sync)."""
    norms = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads])
    total = torch.linalg.vector_norm(norms) / scale.float()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.to(g.device))
    return total
