"""A workload: model, data, loss and metrics as one unit, the only thing the loop talks to."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bench.data import DataBundle, build_data
from bench.models import build_model
from bench.models.transformer import translate
from bench.registry import Registry
from bench.results import whole

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
        """(loss, correct top-1 predictions) of one training batch."""
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

    def write_translations(self, results_dir: str, run_id: str) -> None:
        """No decoded output (the record's ``translations`` stays None)."""


@WORKLOADS.register("translation")
class Translation:
    """Sequence-to-sequence translation: label-smoothed cross-entropy over the target
    tokens (the loop's "samples"), BLEU of decoded held-out lines (docs/internals/train.md)."""

    metrics = ("bleu", "loss")

    def __init__(self, cfg: Any, rank: int, world_size: int, device: torch.device) -> None:
        self.cfg = cfg
        self.data = build_data(cfg.data, cfg.cache, rank, world_size, device, cfg.train.seed)
        self.model: nn.Module = build_model(cfg.model, self.data.num_classes)
        self.smoothing = cfg.optim.label_smoothing
        self.hypotheses: list[str] | None = None

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean loss per target token, correctly predicted target tokens)."""
        x = batch[0]  # the labels are x.tgt_out's tokens (a batch's own are for counting)
        logits = model(x.src, x.tgt_in)[x.tgt_in != 0]
        y = x.tgt_out[x.tgt_out != 0]
        loss = nn.functional.cross_entropy(logits.float(), y, label_smoothing=self.smoothing)
        return loss, (logits.argmax(-1) == y).sum()

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader: Any, autocast: Any) -> dict[str, float]:
        import sacrebleu  # deferred: this workload's alone

        model.eval()
        dev = next(model.parameters()).device
        sums = torch.zeros(2, dtype=torch.float64, device=dev)  # loss sum, target tokens
        mine: dict[int, list[int]] = {}
        beam, max_pos = self.cfg.data.beam_size, self.cfg.model.max_positions
        for x, y in loader:
            with autocast():
                logits = model(x.src, x.tgt_in)[x.tgt_in != 0]
                out = translate(model, x.src, beam=beam, max_positions=max_pos)
            sums[0] += nn.functional.cross_entropy(logits.float(), y, reduction="sum")
            sums[1] += y.numel()
            mine.update(zip(x.index.tolist(), out))
        if dist.is_initialized():
            dist.all_reduce(sums)
            parts: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(parts, mine)
            for p in parts:
                mine.update(p)
        model.train()
        sp = self.data.tokenizer
        hyps = [sp.decode(mine.get(i, [])) for i in range(len(self.data.eval_ref))]
        bleu = sacrebleu.corpus_bleu(hyps, [self.data.eval_ref]).score / 100.0
        self.hypotheses = hyps
        loss = sums[0].item() / max(1.0, sums[1].item())
        return {"bleu": bleu, "loss": loss, "ppl": math.exp(min(loss, 50.0))}

    def write_translations(self, results_dir: str, run_id: str) -> str | None:
        """The last evaluation's hypotheses in ``<results>/translations/<run_id>.txt``."""
        if self.hypotheses is None:
            return None
        path = Path(results_dir) / "translations" / f"{run_id}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        whole.write(path, "".join(h.replace("\n", " ") + "\n" for h in self.hypotheses))
        return str(path)
