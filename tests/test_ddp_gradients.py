"""DDP on 2 gloo workers produces the same averaged gradient as one process on the
same global batch (BN in eval mode, so per-rank batch statistics do not enter)."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.models import build_model
from bench.models.config import ModelConfig


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    m = build_model(ModelConfig(name="resnet9", width=4), 10)
    m.eval()
    return m


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    ddp = torch.nn.parallel.DistributedDataParallel(_model())
    x, y = _batch()
    shard = slice(rank * 4, (rank + 1) * 4)
    torch.nn.functional.cross_entropy(ddp(x[shard]), y[shard]).backward()
    if rank == 0:
        torch.save([p.grad for p in ddp.module.parameters()], out)
    dist.barrier()
    dist.destroy_process_group()


def test_ddp_matches_single_process(tmp_path) -> None:
    out = str(tmp_path / "g.pt")
    mp.spawn(_worker, args=(2, _port(), out), nprocs=2, join=True)
    ddp_grads = torch.load(out)
    m = _model()
    x, y = _batch()
    torch.nn.functional.cross_entropy(m(x), y).backward()
    for g_ddp, p in zip(ddp_grads, m.parameters()):
        torch.testing.assert_close(g_ddp, p.grad, rtol=1e-5, atol=1e-6)
