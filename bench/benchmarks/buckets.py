"""Duck-typed DDP gradient buckets, for calling a communication hook without a model."""

from __future__ import annotations

import torch


class FakeBucket:
    """The part of ``dist.GradBucket`` that the hooks use, over a fixed random gradient."""

    def __init__(self, index: int, shapes: list[torch.Size], last: bool, seed: int) -> None:
        self._index, self._last, self._shapes = index, last, shapes
        self._numels = [int(torch.Size(s).numel()) for s in shapes]
        gen = torch.Generator().manual_seed(seed)
        self._src = torch.randn(sum(self._numels), generator=gen).mul_(1e-3)
        self._buf = self._src.clone()
        self._params = [torch.empty(0) for _ in shapes]

    def refill(self) -> None:  # a new step's gradient (hooks overwrite the buffer)
        self._buf.copy_(self._src)

    def buffer(self) -> torch.Tensor:
        return self._buf

    def set_buffer(self, t: torch.Tensor) -> None:
        self._buf = t

    def gradients(self) -> list[torch.Tensor]:
        parts = self._buf.split(self._numels)
        return [g.view(s) for g, s in zip(parts, self._shapes, strict=True)]

    def parameters(self) -> list[torch.Tensor]:
        return self._params

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last
