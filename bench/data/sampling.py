"""The one sampling rule of every loader: which samples a rank reads in an epoch, in batches.

Training follows :class:`torch.utils.data.DistributedSampler` (``shuffle=True``,
``drop_last=True``) exactly: one global permutation of the ``n`` samples per epoch, drawn by
``torch.randperm`` from a generator seeded with ``seed + epoch`` and identical on every
rank; its first ``(n // world) * world`` entries are dealt out round-robin (rank ``r`` takes
positions ``r, r + world, ...``).  The ``n % world`` samples left over change every epoch,
so every sample is trained on over the epochs.  Each rank then cuts its list into batches
and drops the last partial batch, so every rank takes ``(n // world) // batch`` steps.

Evaluation takes the strided shard ``rank::world`` in order and keeps the last partial
batch: every held-out sample is scored exactly once per pass, with no padding.

The torch tensor and folder loaders, the cached folder loader and both DALI paths (file
reader and external source) all take their batches from :func:`rank_batches`.
"""

from __future__ import annotations

import numpy as np
import torch


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
    """Batches of sample indices for one rank and epoch (see the module docstring)."""
    if train:
        mine = epoch_indices(n, rank, world, seed, epoch)
        steps = len(mine) // batch  # drop the last partial batch
    else:
        mine = eval_indices(n, rank, world)
        steps = -(-len(mine) // batch)
    return [mine[i * batch : (i + 1) * batch] for i in range(steps)]


def worker_affine(batches: list[np.ndarray], parts: int) -> list[np.ndarray]:
    """The same training batches' samples re-dealt for ``parts`` DataLoader workers.

    DataLoader sends batch ``k`` to worker ``k % parts``, and each worker keeps its own
    memory cache level.  Sample ``i`` is given a home worker ``i % parts`` and goes into
    one of that worker's batches when there is room (the few that do not fit fill the
    other workers' batches), so a worker reads the same files epoch after epoch and its
    memory level hits.  The epoch's samples, the number of batches and their sizes are
    the rule's; only which batch holds which sample changes.
    """
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


class EpochSampler(torch.utils.data.Sampler):
    """:func:`epoch_indices` (training) or :func:`eval_indices` as a torch Sampler."""

    def __init__(self, n: int, rank: int, world: int, seed: int, train: bool) -> None:
        self.n, self.rank, self.world, self.seed, self.train = n, rank, world, seed, train
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _indices(self) -> np.ndarray:
        if self.train:
            return epoch_indices(self.n, self.rank, self.world, self.seed, self.epoch)
        return eval_indices(self.n, self.rank, self.world)

    def __iter__(self):
        return iter(self._indices().tolist())

    def __len__(self) -> int:
        return self.n // self.world if self.train else len(range(self.rank, self.n, self.world))
