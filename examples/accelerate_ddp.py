"""Hugging Face Accelerate with a bench.comm hook, on CPU (gloo) or GPU.

::

    torchrun --nproc_per_node=2 examples/accelerate_ddp.py --hook mstopk --target 0.9
    accelerate launch --num_processes 2 examples/accelerate_ddp.py --hook powersgd

Accelerate's ``DistributedDataParallelKwargs(comm_hook=)`` takes only its own hook types,
so the hook goes on the prepared model, which is the DDP module when there are several
processes.  Prints the final accuracy on held-out data and exits with 1 below ``--target``.
"""

from __future__ import annotations

import argparse
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs
from torch.utils.data import DataLoader, TensorDataset

from bench.comm import make_hook

HOOK_OPTIONS = {
    "mstopk": dict(density=0.05, min_numel=1024, warmup_steps=5),
    "hitopk": dict(density=0.05, min_numel=1024, warmup_steps=5, procs_per_node=1),
    "powersgd": dict(powersgd_rank=2, warmup_steps=5),
    "fp16": dict(),
}


def blobs(n: int, seed: int) -> TensorDataset:
    """Ten Gaussian classes in 32 dimensions, far enough apart to be learnt in an epoch."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(10, 32, generator=torch.Generator().manual_seed(0)) * 2
    y = torch.randint(0, 10, (n,), generator=g)
    return TensorDataset(centres[y] + torch.randn(n, 32, generator=g), y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hook", default="mstopk", choices=sorted(HOOK_OPTIONS))
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--target", type=float, default=0.9)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    state, hook = make_hook(args.hook, model=model, **HOOK_OPTIONS[args.hook])
    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(),
        kwargs_handlers=[DistributedDataParallelKwargs(bucket_cap_mb=0.05)],
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train = DataLoader(blobs(2048, 1), batch_size=64, shuffle=True)
    ddp, opt, train = accelerator.prepare(model, opt, train)
    if hasattr(ddp, "register_comm_hook"):  # the DDP module (one process: no exchange)
        ddp.register_comm_hook(state, hook)
    for _ in range(args.epochs):
        for x, y in train:
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            opt.zero_grad()
            accelerator.backward(loss)
            opt.step()
    x, y = blobs(1024, 2).tensors
    with torch.no_grad():
        acc = float((model(x.to(accelerator.device)).argmax(1).cpu() == y).float().mean())
    if accelerator.is_main_process:
        steps = state.step if state.bound else 0
        print(f"{args.hook}: accuracy {acc:.3f} after {steps} hook steps", flush=True)
    accelerator.end_training()
    sys.exit(0 if acc >= args.target else 1)


if __name__ == "__main__":
    main()
