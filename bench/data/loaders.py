"""Per-rank loaders that the training loop iterates.

Every loader yields ``(images, labels)`` already on the training device (images float,
normalised, NCHW), has ``len()`` = steps per epoch on this rank, ``set_epoch(epoch)``
(reshuffle, and for later loaders progressive resizing) and ``epoch_stats()`` (numbers
for the per-epoch curve, e.g. cache hits; reset when read).

``epoch_stats()`` always holds ``data/rank_samples``: the real samples this loader yielded
since the last call (no padding), which the training loop can sum over ranks.

Sharding: every loader takes its batches from :mod:`bench.data.sampling` (training: a
per-epoch global permutation dealt over the ranks as DistributedSampler with
``drop_last=True`` does, so every rank takes the same number of steps; evaluation: the
strided shard ``rank::world``, every held-out sample scored exactly once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from bench.data.sampling import EpochSampler, rank_batches, steps_per_epoch
from bench.data.types import SAMPLES

Batch = tuple[torch.Tensor, torch.Tensor]


def random_crop(x: torch.Tensor, pad: int, gen: torch.Generator) -> torch.Tensor:
    """Per-sample random crop of a zero-padded batch back to its size (vectorised)."""
    if pad <= 0:
        return x
    b, c, h, w = x.shape
    xp = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=gen).to(x.device)
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=gen).to(x.device)
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
    bi = torch.arange(b, device=x.device)[:, None, None, None]
    ci = torch.arange(c, device=x.device)[None, :, None, None]
    return xp[bi, ci, rows, cols]


def random_flip(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    mask = (torch.rand(x.shape[0], generator=gen) < 0.5).to(x.device)
    return torch.where(mask[:, None, None, None], x.flip(3), x)


class TensorLoader:
    """Batches from in-memory tensors (digits, CIFAR-10): augmentation runs on whole
    batches on the training device, which is far cheaper than per-image transforms."""

    def __init__(
        self,
        images: torch.Tensor,  # uint8 or float, NCHW, on CPU
        labels: torch.Tensor,
        *,
        batch_size: int,  # per rank
        rank: int,
        world_size: int,
        device: torch.device,
        mean: torch.Tensor,  # per channel, in the units of ``images``
        std: torch.Tensor,
        train: bool,
        seed: int = 0,
        pad: int = 0,
        flip: bool = False,
    ) -> None:
        self.images, self.labels = images, labels
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.device, self.train, self.seed = device, train, seed
        self.pad, self.flip = pad, flip
        self.mean = mean.view(1, -1, 1, 1).to(device)
        self.std = std.view(1, -1, 1, 1).to(device)
        self.epoch = 0
        n = len(labels)
        # this rank's samples per epoch (the same for every epoch)
        self.num_samples = n // world_size if train else len(range(rank, n, world_size))
        self._samples = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return steps_per_epoch(
            len(self.labels), self.world_size, self.batch_size, self.train, self.rank
        )

    def epoch_stats(self) -> dict[str, Any]:
        out, self._samples = {SAMPLES: self._samples}, 0
        return out

    def __iter__(self) -> Iterator[Batch]:
        plan = rank_batches(
            len(self.labels),
            self.rank,
            self.world_size,
            self.batch_size,
            self.train,
            self.seed,
            self.epoch,
        )
        gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch * 1_009 + self.rank)
        for b in plan:
            b = torch.from_numpy(b)
            x = self.images[b].to(self.device, non_blocking=True).float()
            x = (x - self.mean) / self.std
            if self.train:
                x = random_crop(x, self.pad, gen)
                if self.flip:
                    x = random_flip(x, gen)
            self._samples += len(b)
            yield x, self.labels[b].to(self.device, non_blocking=True)


class DeviceLoader:
    """A torch DataLoader over a map-style data set, sharded by rank, moved to device."""

    def __init__(
        self,
        dataset: Dataset,
        *,
        batch_size: int,
        rank: int,
        world_size: int,
        device: torch.device,
        train: bool,
        num_workers: int,
        seed: int = 0,
        collate_fn: Callable | None = None,
    ) -> None:
        self.device, self.train = device, train
        self.sampler = EpochSampler(len(dataset), rank, world_size, seed, train)  # type: ignore[arg-type]
        self._samples = 0
        self.loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=self.sampler,
            shuffle=False,
            drop_last=train,
            num_workers=num_workers,
            pin_memory=device.type == "cuda",
            persistent_workers=num_workers > 0,
            collate_fn=collate_fn,
        )

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def epoch_stats(self) -> dict[str, Any]:
        out, self._samples = {SAMPLES: self._samples}, 0
        return out

    def __iter__(self) -> Iterator[Batch]:
        nb = self.device.type == "cuda"
        for x, y in self.loader:
            self._samples += len(y)
            yield x.to(self.device, non_blocking=nb), y.to(self.device, non_blocking=nb)
