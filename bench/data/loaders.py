"""Per-rank loaders and their contract: ``(x, y)`` on the training device, ``len()`` (steps
per epoch), ``set_epoch``, ``epoch_stats()`` (reset when read; always ``data/rank_samples``);
the one sampling rule, torch's ``DistributedSampler``'s (docs/internals/data.md)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bench.registry import ConfigError

Batch = tuple[torch.Tensor, torch.Tensor]

# epoch_stats() keys: real samples and (token-batched loaders) source + target tokens that this
# rank yielded since the last call, no padding; summed over the ranks: data/samples, data/tokens
SAMPLES = "data/rank_samples"
RANK_TOKENS = "data/rank_tokens"


@dataclass
class DataBundle:
    train: Any  # loader: iterable of (x, y) on device, len, set_epoch, epoch_stats
    eval: Any
    num_classes: int
    train_samples: int  # global samples in one training epoch
    in_channels: int = 3

    def close(self) -> None:
        """Stop the loaders' worker processes and DALI pipelines, where they have any."""
        for loader in (self.train, self.eval):
            if hasattr(loader, "close"):
                loader.close()


def per_rank(batch: int, world_size: int, what: str) -> int:
    """``batch`` split evenly over ``world_size`` workers (ConfigError when it does not split)."""
    if batch % world_size:
        raise ConfigError(f"{what}={batch} is not divisible by the {world_size} workers")
    return batch // world_size


def check_classes(cfg: Any, n: int) -> int:
    """``n``, the class folders found, unless ``data.num_classes`` says otherwise."""
    if cfg.num_classes and cfg.num_classes != n:
        raise ConfigError(
            f"data.num_classes={cfg.num_classes} but {cfg.root} has {n} class folders"
        )
    return n


def epoch_indices(n: int, rank: int, world: int, seed: int, epoch: int) -> np.ndarray:
    """This rank's training samples in ``epoch`` (DistributedSampler's, drop_last=True)."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=g).numpy()
    total = (n // world) * world
    return perm[rank:total:world]


def eval_indices(n: int, rank: int, world: int) -> np.ndarray:
    """This rank's held-out samples: the strided shard ``rank::world``."""
    return np.arange(rank, n, world)


def rank_batches(
    n: int, rank: int, world: int, batch: int, train: bool, seed: int, epoch: int
) -> list[np.ndarray]:
    """Batches of sample indices for one rank and epoch (the sampling rule)."""
    if train:
        mine = epoch_indices(n, rank, world, seed, epoch)
        steps = len(mine) // batch  # drop the last partial batch
    else:
        mine = eval_indices(n, rank, world)
        steps = -(-len(mine) // batch)
    return [mine[i * batch : (i + 1) * batch] for i in range(steps)]


def worker_affine(batches: list[np.ndarray], parts: int) -> list[np.ndarray]:
    """The same training batches' samples re-dealt so that each of ``parts`` DataLoader workers
    reads the same files every epoch (see docs/internals/data.md)."""
    if parts <= 1 or not batches:
        return batches
    b, steps = len(batches[0]), len(batches)
    samples = np.concatenate(batches)
    slots = [range(p, steps, parts) for p in range(parts)]
    own = [samples[samples % parts == p] for p in range(parts)]
    need = [len(slots[p]) * b for p in range(parts)]
    spill = np.concatenate([own[p][need[p] :] for p in range(parts)])
    out: list[np.ndarray] = [samples[:0]] * steps
    taken = 0
    for p in range(parts):
        short = need[p] - min(need[p], len(own[p]))
        mine = np.concatenate([own[p][: need[p]], spill[taken : taken + short]])
        taken += short
        for j, k in enumerate(slots[p]):
            out[k] = mine[j * b : (j + 1) * b]
    return out


def steps_per_epoch(n: int, world: int, batch: int, train: bool, rank: int = 0) -> int:
    """``len(rank_batches(...))`` without drawing the permutation."""
    if train:
        return (n // world) // batch
    return -(-len(range(rank, n, world)) // batch)


class RankLoader:
    """The contract's shared part: this rank's batches of ``n`` samples by the rule, the
    epoch, and the samples yielded since the last ``epoch_stats()``."""

    epoch = 0
    _count = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _plan(self) -> list[np.ndarray]:
        """This epoch's batches of sample indices."""
        n, r, w, b = self.n, self.rank, self.world, self.batch_size
        return rank_batches(n, r, w, b, self.train, self.seed, self.epoch)

    def __len__(self) -> int:
        return steps_per_epoch(self.n, self.world, self.batch_size, self.train, self.rank)

    def __iter__(self) -> Iterator[Batch]:
        for x, y, _ in self.iter_indexed():
            yield x, y

    def epoch_stats(self) -> dict[str, Any]:
        out, self._count = {SAMPLES: self._count}, 0
        return out


class PlanSampler:
    """A DataLoader's batch sampler: its owner's ``_batches()``, drawn at each ``iter()``."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner

    def __iter__(self):
        return self.owner._batches()

    def __len__(self) -> int:
        return len(self.owner)


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


class TensorLoader(RankLoader):
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
        self.images, self.labels, self.n = images, labels, len(labels)
        self.batch_size, self.rank, self.world = batch_size, rank, world_size
        self.device, self.train, self.seed, self.pad, self.flip = device, train, seed, pad, flip
        self.mean = mean.view(1, -1, 1, 1).to(device)
        self.std = std.view(1, -1, 1, 1).to(device)

    def __iter__(self) -> Iterator[Batch]:
        gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch * 1_009 + self.rank)
        for b in self._plan():
            b = torch.from_numpy(b)
            x = self.images[b].to(self.device, non_blocking=True).float()
            x = (x - self.mean) / self.std
            if self.train:
                x = random_crop(x, self.pad, gen)
                if self.flip:
                    mask = (torch.rand(x.shape[0], generator=gen) < 0.5).to(x.device)
                    x = torch.where(mask[:, None, None, None], x.flip(3), x)
            self._count += len(b)
            yield x, self.labels[b].to(self.device, non_blocking=True)


class SyntheticLoader(RankLoader):
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
        self.batch_size = batch_size
        gen = torch.Generator(device=device).manual_seed(seed * 1000 + rank)
        # one fixed batch: generating fresh noise every step would time the RNG, not the model
        self.x = torch.randn(batch_size, *shape, device=device, generator=gen)
        self.y = torch.randint(0, num_classes, (batch_size,), device=device, generator=gen)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self.steps):
            self._count += self.batch_size
            yield self.x, self.y
