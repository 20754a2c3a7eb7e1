"""PyTorch Lightning with a bench.comm hook, on CPU (gloo) or GPU.

::

    torchrun --nproc_per_node=2 examples/lightning_ddp.py --hook mstopk --target 0.9
    python examples/lightning_ddp.py --devices 2 --hook hitopk   # Lightning spawns them

Lightning's ``DDPStrategy(ddp_comm_state=, ddp_comm_hook=)`` registers the hook on CUDA
devices only; on CPU a callback registers it on the DDP module once the strategy has
wrapped the model.  The hook state is made when the strategy is built, before any process
group exists, and binds on the first backward.  Prints the final validation accuracy and
exits with 1 below ``--target``.
"""

from __future__ import annotations

import argparse
import sys

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
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


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple, _: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch: tuple, _: int) -> None:
        x, y = batch
        acc = (self(x).argmax(1) == y).float().mean()
        self.log("val_acc", acc, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class RegisterHook(L.Callback):
    """Registers the comm hook on the DDP module where the strategy did not (CPU)."""

    def __init__(self, state: object, hook: object) -> None:
        self.state, self.hook = state, hook

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        ddp = trainer.strategy.model
        if hasattr(ddp, "register_comm_hook") and trainer.strategy.root_device.type != "cuda":
            ddp.register_comm_hook(self.state, self.hook)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hook", default="mstopk", choices=sorted(HOOK_OPTIONS))
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--target", type=float, default=0.9)
    args = ap.parse_args()
    L.seed_everything(0, verbose=False)
    model = Net()
    state, hook = make_hook(args.hook, model=model, **HOOK_OPTIONS[args.hook])
    gpu = torch.cuda.is_available()
    strategy = DDPStrategy(
        process_group_backend="nccl" if gpu else "gloo",
        bucket_cap_mb=0.05,  # several buckets even for this small model
        **(dict(ddp_comm_state=state, ddp_comm_hook=hook) if gpu else {}),
    )
    trainer = L.Trainer(
        accelerator="gpu" if gpu else "cpu",
        devices=args.devices,
        strategy=strategy,
        max_epochs=args.epochs,
        callbacks=[RegisterHook(state, hook)],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    train = DataLoader(blobs(4096, 1), batch_size=64, shuffle=True)
    val = DataLoader(blobs(1024, 2), batch_size=256)
    trainer.fit(model, train, val)
    acc = float(trainer.callback_metrics["val_acc"])
    if trainer.global_rank == 0:
        print(f"{args.hook}: val_acc {acc:.3f} after {state.step} hook steps", flush=True)
    sys.exit(0 if acc >= args.target else 1)


if __name__ == "__main__":
    main()
