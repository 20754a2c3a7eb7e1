"""In-memory image arrays (CIFAR-10, the embedded digits) through DALI (``data.loader=dali``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from bench.data.dali_common import (
    ExternalEpochs,
    KeepAlive,
    dali_device_id,
    require_dali,
    to_device,
    to_torch,
    zero_copy,
)
from bench.data.sampling import rank_batches, steps_per_epoch
from bench.data.types import SAMPLES


class DaliArrayLoader:
    """In-memory image arrays (CIFAR-10, the embedded digits) through ``fn.external_source``.

    Training: random crop with ``pad`` pixels of padding (the padding is filled with the
    mean colour, which normalises to zero like the torch path's zero padding of normalised
    images) + optional flip + normalise, by ``crop_mirror_normalize``; evaluation:
    normalise only.  Batches: :func:`bench.data.sampling.rank_batches`, the rule of every
    loader.
    """

    def __init__(
        self,
        images: Any,
        labels: Any,
        *,
        batch_size: int,
        rank: int,
        world_size: int,
        device: Any,
        mean: Any,
        std: Any,
        train: bool,
        seed: int = 0,
        pad: int = 0,
        flip: bool = False,
        threads: int = 1,
        prefetch: int = 2,
        dali_device: str = "auto",
    ) -> None:
        require_dali()
        x = np.ascontiguousarray(images.numpy().transpose(0, 2, 3, 1))  # NHWC, as DALI wants
        self.h, self.w = x.shape[1:3]
        self.mean = [float(m) for m in mean]
        self.std = [float(s) for s in std]
        if train and pad:
            padded = np.empty(
                (x.shape[0], self.h + 2 * pad, self.w + 2 * pad, x.shape[3]), dtype=x.dtype
            )
            padded[...] = np.asarray(self.mean, dtype=np.float64).astype(x.dtype)
            padded[:, pad : pad + self.h, pad : pad + self.w] = x
            x = padded
        self.x, self.labels = x, labels.numpy().astype(np.int64)
        self.batch_size, self.rank, self.world, self.device = batch_size, rank, world_size, device
        self.train, self.seed, self.pad, self.flip = train, seed, pad, flip
        self.threads, self.prefetch = max(1, threads), max(1, prefetch)
        self.device_id = dali_device_id(device, dali_device)
        self.epoch = 0
        n = len(self.labels)
        self.num_samples = (
            n // world_size if train else len(range(rank, n, world_size))
        )  # this rank's
        self._batches: list[np.ndarray] = []
        self._pipe = None
        self._epochs = ExternalEpochs()
        self._samples = 0  # yielded since the last epoch_stats()

    def set_epoch(self, epoch: int) -> None:
        self._epochs.finish(self._stop)
        self.epoch = epoch

    def _plan(self) -> list[np.ndarray]:
        n = len(self.labels)
        return rank_batches(
            n, self.rank, self.world, self.batch_size, self.train, self.seed, self.epoch
        )

    def __len__(self) -> int:
        n = len(self.labels)
        return steps_per_epoch(n, self.world, self.batch_size, self.train, self.rank)

    def epoch_stats(self) -> dict[str, float]:
        out, self._samples = {SAMPLES: self._samples}, 0
        return out

    def _stop(self) -> None:
        self._batches = []

    def _next(self):
        if not self._batches:
            raise StopIteration
        b = self._batches.pop(0)
        return [self.x[i] for i in b], [np.array(i, dtype=np.int64) for i in b]

    def _build(self):
        fn, pipeline_def, types = require_dali()
        gpu = self.device_id is not None
        dtype = types.UINT8 if self.x.dtype == np.uint8 else types.FLOAT

        keep = KeepAlive(2 * self.prefetch + 4)

        @pipeline_def
        def pipe():
            # no_copy: DALI reads the images in place (views of the array); ``keep`` holds
            # the batch's index arrays until the pipeline is done with them
            images, index = fn.external_source(
                source=lambda: keep(self._next()),
                num_outputs=2,
                batch=True,
                dtype=[dtype, types.INT64],
                layout=["HWC", ""],
                no_copy=True,
            )
            if gpu:
                images = images.gpu()
            kw: dict[str, Any] = {}
            if self.train:
                kw = dict(
                    crop=(self.h, self.w),
                    crop_pos_x=fn.random.uniform(range=(0.0, 1.0)),
                    crop_pos_y=fn.random.uniform(range=(0.0, 1.0)),
                    mirror=fn.random.coin_flip(probability=0.5) if self.flip else 0,
                )
            images = fn.crop_mirror_normalize(
                images, dtype=types.FLOAT, output_layout="CHW", mean=self.mean, std=self.std, **kw
            )
            return images, index

        p = pipe(
            batch_size=self.batch_size,
            num_threads=self.threads,
            device_id=self.device_id,
            prefetch_queue_depth=self.prefetch,
            seed=self.seed + self.rank,
        )
        p.build()
        return p

    def __iter__(self) -> Iterator[tuple[Any, Any]]:

        if self._pipe is None:
            self._pipe = self._build()
        self._epochs.finish(self._stop)  # an epoch the training loop cut short
        self._batches = self._plan()
        wrap = zero_copy(self._pipe)
        for images, index in self._epochs.run(self._pipe, lambda run: run()):
            idx = to_torch(index, torch.device("cpu")).view(-1).numpy()  # a copy
            self._samples += len(idx)
            yield (
                to_torch(images, self.device, wrap=wrap),
                to_device(torch.from_numpy(self.labels[idx]), self.device),
            )
