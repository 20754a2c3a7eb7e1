"""Run inside each spawned gloo worker by tests/test_comm_nocomm.py."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def run(rank: int, world: int) -> dict:
    from bench.comm.hooks import build_nocomm

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1, bias=False)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state, hook = build_nocomm(None, None, None)
    ddp.register_comm_hook(state, lambda state, bucket: hook(state, bucket))
    x = torch.full((4, 8), float(rank + 1))
    waited = []
    for _ in range(3):
        ddp.zero_grad()
        if rank == 1:
            time.sleep(0.3)  # rank 1 is slow: rank 0 must wait for it at every step
        t0 = time.perf_counter()
        ddp(x).sum().backward()
        waited.append(time.perf_counter() - t0)
    grad = model.weight.grad.clone()
    out = {"grad": grad.tolist(), "waited": waited, "steps": state.stats.steps}
    out["bytes"] = state.stats.pop().get("comm/bytes_per_step", None)
    dist.barrier()
    return out
