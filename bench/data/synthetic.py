"""Random tensors of any shape, made on the training device: throughput runs without I/O."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from bench.data.types import SAMPLES


class SyntheticLoader:
    def __init__(
        self,
        *,
        samples: int,
        batch_size: int,
        shape: tuple[int, int, int],
        num_classes: int,
        device: torch.device,
        seed: int,
        rank: int,
        world_size: int,
    ) -> None:
        self.steps = max(1, samples // (batch_size * world_size))
        self.batch_size, self.shape, self.num_classes = batch_size, shape, num_classes
        self.device = device
        self._samples = 0  # yielded since the last epoch_stats()
        self.gen = torch.Generator(device=device).manual_seed(seed * 1000 + rank)
        # one fixed batch: generating fresh noise every step would time the RNG, not the model
        self.x = torch.randn(batch_size, *shape, device=device, generator=self.gen)
        self.y = torch.randint(0, num_classes, (batch_size,), device=device, generator=self.gen)

    def set_epoch(self, epoch: int) -> None:
        pass

    def __len__(self) -> int:
        return self.steps

    def epoch_stats(self) -> dict[str, Any]:
        out, self._samples = {SAMPLES: self._samples}, 0
        return out

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self.steps):
            self._samples += self.batch_size
            yield self.x, self.y
