"""A workload: model, data, loss, metric and target as one pluggable unit.

The training loop only talks to a :class:`Workload`; image classification is the one
here (top-1/top-5 accuracy), and a translation workload (BLEU) can be registered beside
it without touching the loop.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bench.data import DataBundle, build_data
from bench.models import build_model
from bench.registry import Registry

WORKLOADS: Registry = Registry("workload")


@WORKLOADS.register("classification")
class Classification:
    """Cross-entropy (with label smoothing) training, top-1/top-5 on the held-out split."""

    metrics = ("top1", "top5", "loss")

    def __init__(self, cfg: Any, rank: int, world_size: int, device: torch.device) -> None:
        self.cfg = cfg
        self.data: DataBundle = build_data(
            cfg.data, cfg.cache, rank, world_size, device, cfg.train.seed
        )
        self.model: nn.Module = build_model(cfg.model, self.data.num_classes, self.data.in_channels)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=cfg.optim.label_smoothing)

    def loss(
        self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, number of correct top-1 predictions) for one training batch."""
        x, y = batch
        out = model(x)
        return self.criterion(out, y), (out.argmax(1) == y).sum()

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader: Any, autocast: Any) -> dict[str, float]:
        """Metrics over the whole held-out split (each rank scores its shard; sums reduced)."""
        model.eval()
        dev = next(model.parameters()).device
        sums = torch.zeros(4, dtype=torch.float64, device=dev)  # top1, top5, loss sum, count
        k = min(5, self.data.num_classes)
        for x, y in loader:
            with autocast():
                out = model(x)
            loss = nn.functional.cross_entropy(out.float(), y, reduction="sum")
            topk = out.topk(k, dim=1).indices
            sums[0] += (topk[:, 0] == y).sum()
            sums[1] += (topk == y[:, None]).any(1).sum()
            sums[2] += loss
            sums[3] += y.numel()
        if dist.is_initialized():
            dist.all_reduce(sums)
        model.train()
        n = max(1.0, sums[3].item())
        return {"top1": sums[0].item() / n, "top5": sums[1].item() / n, "loss": sums[2].item() / n}
