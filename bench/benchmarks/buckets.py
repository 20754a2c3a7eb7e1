"""Duck-typed DDP gradient buckets, for calling a communication hook without a model."""

from __future__ import annotations

import torch


class FakeBucket:
    """The part of ``dist.GradBucket`` that the hooks use."""

    def __init__(self, index: int, shapes: list[torch.Size], last: bool, seed: int) -> None:
        self._index, self._last = index, last
        numels = [int(torch.Size(s).numel()) for s in shapes]
        self._buf = torch.randn(sum(numels), generator=torch.Generator().manual_seed(seed))
        self._buf.mul_(1e-3)
        self._shapes = shapes
        self._src = self._buf.clone()
        self._params = [torch.empty(0) for _ in shapes]

    def refill(self) -> None:  # a new step's gradient (hooks overwrite the buffer)
        self._buf.copy_(self._src)

    def buffer(self) -> torch.Tensor:
        return self._buf

    def set_buffer(self, t: torch.Tensor) -> None:
        self._buf = t

    def gradients(self) -> list[torch.Tensor]:
        out, off = [], 0
        for s in self._shapes:
            n = int(torch.Size(s).numel())
            out.append(self._buf[off : off + n].view(s))
            off += n
        return out

    def parameters(self) -> list[torch.Tensor]:
        return self._params

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last
