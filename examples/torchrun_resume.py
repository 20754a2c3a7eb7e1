"""A user's own DDP training with a bench.comm hook, checkpointed and resumed.

Run on CPU (gloo) or GPU (nccl), e.g.::

    torchrun --nproc_per_node=2 examples/torchrun_resume.py --hook mstopk --out /tmp/run
    torchrun --nproc_per_node=2 examples/torchrun_resume.py --hook hitopk --out /tmp/run \\
        --save-at 5 --kill            # checkpoints after step 5, then every worker dies
    torchrun --nproc_per_node=2 examples/torchrun_resume.py --hook hitopk --out /tmp/run \\
        --resume                      # continues from the checkpoint

The hook's state is made before ``init_process_group`` and binds on the first backward;
the checkpoint holds the model and optimizer (rank 0) and each rank's hook state
(``state.state_dict()``, keyed by parameter names).  The resumed run continues bit for bit
like the uninterrupted one: DDP's first step after the restart lays its buckets out
differently, and the hook regroups them into the saved ones (``bench/comm/state.py``).
Each step's loss and a digest of the weights go to ``<out>/history-rank<r>.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from bench.comm import make_hook

HOOK_OPTIONS = {  # small buckets still compressed (min_numel), a 2-worker "cluster"
    "mstopk": dict(density=0.05, min_numel=1024, warmup_steps=1),
    "topk": dict(density=0.05, min_numel=1024, warmup_steps=1),
    "hitopk": dict(density=0.05, min_numel=1024, warmup_steps=1, procs_per_node=1),
    "powersgd": dict(powersgd_rank=2, warmup_steps=2),
    "fp16": dict(),
}


def batch(rank: int, step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch of a step: the same in every run (and after a resume)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(64, 32, generator=g)
    y = (x[:, :10] * torch.arange(1, 11)).argmax(1)  # a learnable labelling
    return x.to(device), y.to(device)


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hook", default="mstopk", choices=sorted(HOOK_OPTIONS))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--save-at", type=int, default=0, help="checkpoint after this step")
    ap.add_argument("--kill", action="store_true", help="SIGKILL every worker after saving")
    ap.add_argument("--resume", action="store_true", help="continue from <out>/ckpt")
    ap.add_argument(
        "--without-hook-state",
        action="store_true",
        help="resume the model and optimizer only (what losing the hook state costs)",
    )
    args = ap.parse_args()
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU()
    )
    model.append(torch.nn.Linear(128, 10))

    # --- the hook: made before the process group, bound on the first backward
    state, hook = make_hook(args.hook, model=model, **HOOK_OPTIONS[args.hook])

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    model.to(device)
    ddp = DDP(model, bucket_cap_mb=0.05)  # several buckets
    ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    ckpt = args.out / "ckpt"
    start, history = 0, []
    if args.resume:  # --- restore the model, the optimizer and this rank's hook state
        common = torch.load(ckpt / "common.pt", map_location=device, weights_only=True)
        model.load_state_dict(common["model"])
        opt.load_state_dict(common["optimizer"])
        start = common["step"]
        hook_sd = torch.load(ckpt / f"hook-rank{rank}.pt", map_location=device, weights_only=True)
        if not args.without_hook_state:
            state.load_state_dict(hook_sd)  # not bound yet: applied when it binds

    for step in range(start + 1, args.steps + 1):
        x, y = batch(rank, step, device)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append({"step": step, "loss": loss.item(), "weights": digest(model)})
        if step == args.save_at:  # --- checkpoint: every rank its hook state
            ckpt.mkdir(parents=True, exist_ok=True)
            torch.save(state.state_dict(), ckpt / f"hook-rank{rank}.pt")
            if rank == 0:
                sd = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
                torch.save(sd, ckpt / "common.pt")
            dist.barrier()
            if args.kill:
                _write(args.out, rank, history, args.resume)
                os.kill(os.getpid(), signal.SIGKILL)
    _write(args.out, rank, history, args.resume)
    if rank == 0:
        print(f"{args.hook}: step {args.steps} loss {history[-1]['loss']:.4f}", flush=True)
    dist.destroy_process_group()


def _write(out: Path, rank: int, history: list[dict], resumed: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"history-rank{rank}.json"
    before = json.loads(path.read_text()) if resumed and path.exists() else []
    path.write_text(json.dumps(before + history))


if __name__ == "__main__":
    main()
