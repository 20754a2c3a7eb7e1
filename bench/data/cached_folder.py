"""Image folders (``data=imagefolder|imagenet``) read through the data cache: the torch
loader (a DataLoader over a :class:`~bench.data.cache.CachedReader`, batches normalised on
the device) or DALI's (``data.loader=dali``)."""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from functools import partial
from typing import Any

import torch
import torch.utils.data._utils as du
from torch.utils.data import DataLoader

from bench.data.cache import CachedReader, build_reader, levels, merge_stats, zero_stats
from bench.data.config import CacheConfig, DataConfig, train_size_at, train_sizes
from bench.data.dali import DaliFolderLoader
from bench.data.folder import IMAGENET_MEAN, IMAGENET_STD
from bench.data.jpegs import CorruptImage, decode_capped, warn_corrupt
from bench.data.loaders import (
    SAMPLES,
    DataBundle,
    PlanSampler,
    RankLoader,
    check_classes,
    per_rank,
    worker_affine,
)
from bench.data.storage import Storage, list_folder, open_storage


class FolderDataset:
    """Map-style data set over a folder listing, read through a :class:`CachedReader`; keys
    ``(index, size)``, items uint8 CHW tensors (normalised later on the device)."""

    def __init__(
        self,
        store: Storage,
        listing: Any,
        cache_cfg: CacheConfig,
        namespace: str,
        train: bool,
        flip: bool,
        predecode_size: int,
        memory_share: int,
    ) -> None:
        self.store, self.listing, self.cache_cfg = store, listing, cache_cfg
        self.namespace, self.train, self.flip = namespace, train, flip
        self.predecode_size = predecode_size if levels(cache_cfg.name).decoded else 0
        self.memory_share = memory_share
        self._reader: CachedReader | None = None
        import torchvision.transforms.functional  # noqa: F401  (import once, before workers fork)

    @property
    def reader(self) -> CachedReader:
        if self._reader is None:
            self._reader = build_reader(
                self.store, self.cache_cfg, self.namespace, self.memory_share
            )
        return self._reader

    def __len__(self) -> int:
        return len(self.listing)

    def __getitem__(self, key: tuple[int, int]) -> tuple[Any, int, int, str | None]:
        # deferred: torchvision is slow to load, and only this path needs it
        from torchvision.transforms import RandomResizedCrop
        from torchvision.transforms import functional as F

        i, size = key
        msg = None
        try:
            img = self._image(i)
        except CorruptImage as e:
            if not self.train:  # evaluation drops it: no held-out image is scored twice
                return None, self.listing.labels[i], i, str(e)
            # training: the next decodable image stands in, so that every rank keeps full
            # batches and its number of steps (a batch of damaged files only would end
            # the epoch early); counted and warned about as skipped all the same
            msg, i, img = str(e), *self._substitute(i)
        if self.train:
            top, left, h, w = RandomResizedCrop.get_params(
                img, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)
            )
            img = F.resized_crop(img, top, left, h, w, [size, size], antialias=True)
            if self.flip and torch.rand(()) < 0.5:
                img = F.hflip(img)
        else:
            img = F.center_crop(F.resize(img, round(size / 0.875), antialias=True), [size, size])
        img = F.pil_to_tensor(img)
        return img, self.listing.labels[i], i, msg

    def _image(self, i: int) -> Any:
        """The PIL image of file ``i``; CorruptImage when it does not decode."""
        from PIL import Image

        rel = self.listing.files[i]
        if self.predecode_size:
            pixels = self.reader.get_decoded(rel, self.predecode_size)
        else:
            pixels = decode_capped(self.reader.get(rel), 0, rel)
        # PIL's crop + resize on uint8 is several times faster than torchvision's tensor
        # path (which resamples in float); the copy is ~0.3 MB at 256 pixels
        return Image.fromarray(pixels)

    def _substitute(self, i: int) -> tuple[int, Any]:
        """The first file after ``i`` (wrapping around) that decodes, and its image."""
        n = len(self.listing)
        for k in range(1, n):
            try:
                return (i + k) % n, self._image((i + k) % n)
            except CorruptImage:
                continue
        raise CorruptImage(f"{self.namespace}: not one image of the split decodes")

    def collate(self, items: list) -> tuple[Any, Any, Any, dict]:
        """Stack the good items; the worker's cache counters ride along with the batch."""
        good = [it for it in items if it[0] is not None]
        stats: dict[str, Any] = self.reader.stats.take() if (self._reader or good) else {}
        bad = [it[3] for it in items if it[3] is not None]  # dropped or stood in for
        if bad:
            stats["data/corrupt"] = len(bad)
            stats["_corrupt"] = bad
        if not good:
            none = torch.empty(0, dtype=torch.long)
            return torch.empty(0), none, none, stats
        x = torch.stack([it[0] for it in good])
        y = torch.tensor([it[1] for it in good], dtype=torch.long)
        idx = torch.tensor([it[2] for it in good], dtype=torch.long)
        return x, y, idx, stats


class CachedFolderLoader(RankLoader):
    """A DataLoader over a :class:`FolderDataset`; ``iter_indexed()`` adds sample indices."""

    def __init__(
        self,
        dataset: FolderDataset,
        *,
        batch_size: int,
        rank: int,
        world_size: int,
        device: Any,
        num_workers: int,
        seed: int,
        size_at: Any,
        strict: bool,
        prefetch: int = 2,
    ) -> None:
        self.ds, self.batch_size, self.rank, self.world = dataset, batch_size, rank, world_size
        self.device, self.seed, self.size_at, self.strict = device, seed, size_at, strict
        self.n, self.train = len(dataset), dataset.train
        self.parts = max(1, num_workers)  # DataLoader sends batch k to worker k % parts
        self._stats: dict[str, float] = zero_stats()
        self._seen_corrupt: set[str] = set()
        self.loader = DataLoader(
            dataset,  # type: ignore[arg-type]
            batch_sampler=PlanSampler(self),  # type: ignore[arg-type]
            num_workers=num_workers,
            collate_fn=dataset.collate,
            pin_memory=getattr(device, "type", "cpu") == "cuda",
            persistent_workers=num_workers > 0,
            prefetch_factor=prefetch if num_workers > 0 else None,
            worker_init_fn=_worker_init,
            multiprocessing_context=_worker_context() if num_workers > 0 else None,
        )

    def _plan(self) -> list:
        # training: each worker's memory level sees the same files every epoch; evaluation
        # passes repeat one plan, so batch k already goes to the same worker every pass
        plan = super()._plan()
        return worker_affine(plan, self.parts) if self.train else plan

    def _batches(self):
        size = self.size_at(self.epoch)
        for b in self._plan():
            yield [(int(i), size) for i in b]

    def epoch_stats(self) -> dict[str, float]:
        out, self._stats = self._stats, zero_stats()
        return out

    def close(self) -> None:
        """Stop the persistent workers now (instead of whenever the loader is collected)."""
        it = getattr(self.loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self.loader._iterator = None

    def iter_indexed(self):
        mean = torch.tensor(IMAGENET_MEAN, device=self.device).view(1, 3, 1, 1) * 255
        std = torch.tensor(IMAGENET_STD, device=self.device).view(1, 3, 1, 1) * 255
        nb = getattr(self.device, "type", "cpu") == "cuda"
        t0 = time.perf_counter()
        for x, y, idx, stats in self.loader:
            merge_stats(self._stats, {"data/wait_s": time.perf_counter() - t0})
            warn_corrupt(stats.pop("_corrupt", []), self._seen_corrupt, self.strict)
            merge_stats(self._stats, stats)
            if len(y):
                x = (x.to(self.device, non_blocking=nb).float() - mean) / std
                self._stats[SAMPLES] += len(y)
                yield x, y.to(self.device, non_blocking=nb), idx
            t0 = time.perf_counter()


def _worker_context():
    """fork (fast start), unless DALI is loaded in this process: then forkserver (a fork
    of a process whose DALI threads hold a lock deadlocks on it)."""
    if "nvidia.dali" not in sys.modules:
        return None
    ctx = mp.get_context("forkserver")
    # the server imports these once; every worker forked from it starts with them loaded
    ctx.set_forkserver_preload(
        ["torch", "torchvision.transforms.functional", "bench.data.cached_folder"]
    )
    return ctx


def _worker_init(worker_id: int) -> None:
    # a worker forked while another loader's persistent iterator exists inherits it; this
    # flag keeps its __del__ from joining processes that are not its children at exit
    du.python_exit_status = True


def build_folder(
    data_cfg: DataConfig, cache_cfg: CacheConfig, rank: int, world_size: int, device: Any, seed: int
) -> DataBundle:
    """The loaders of an ImageNet-style folder read through the cache: torch's or DALI's."""
    store = open_storage(data_cfg.root, data_cfg.throttle_mbps, data_cfg.throttle_ms)
    tr = list_folder(store, data_cfg.train_dir)
    va = list_folder(store, data_cfg.val_dir, tr.classes)
    n_classes = check_classes(data_cfg, len(tr.classes))
    b = per_rank(data_cfg.batch_size, world_size, "data.batch_size")
    eb = max(1, data_cfg.eval_batch_size // world_size)
    ts, es = partial(train_size_at, data_cfg), lambda epoch: data_cfg.eval_image_size  # pixels
    pre = 0  # non-zero when the cache level holds decoded pixels (cache.predecode_size's)
    if levels(cache_cfg.name).decoded:
        pre = max(train_sizes(data_cfg) + [data_cfg.eval_image_size])
    common = dict(rank=rank, world_size=world_size, device=device, seed=seed)
    common.update(strict=data_cfg.strict, prefetch=data_cfg.prefetch)
    if data_cfg.loader == "dali":
        common.update(
            threads=data_cfg.dali_threads or max(1, data_cfg.num_workers),
            flip=data_cfg.flip,
            dali_device=data_cfg.dali_device,
            predecode_size=pre,
        )
        # one reader per loader: evaluation reads never count in the training epoch
        read = partial(build_reader, store, cache_cfg, store.root)
        train = DaliFolderLoader(tr, train=True, batch_size=b, size_at=ts, reader=read(), **common)
        ev = DaliFolderLoader(va, train=False, batch_size=eb, size_at=es, reader=read(), **common)
    else:
        workers = data_cfg.num_workers
        share, flip = max(1, workers), data_cfg.flip
        train_ds = FolderDataset(store, tr, cache_cfg, store.root, True, flip, pre, share)
        eval_ds = FolderDataset(store, va, cache_cfg, store.root, False, False, pre, share)
        common["num_workers"] = workers
        train = CachedFolderLoader(train_ds, batch_size=b, size_at=ts, **common)
        ev = CachedFolderLoader(eval_ds, batch_size=eb, size_at=es, **common)
    return DataBundle(train, ev, n_classes, len(train) * data_cfg.batch_size)
