"""Damaged images in the plain torchvision folder path: skipped and counted, or one error.

The rule every image loader applies (the cached torch path and DALI report through
:func:`bench.data.cached_folder.warn_corrupt` too): with ``data.strict=false`` a file
that does not decode (not an image, truncated) is skipped with one warning per file and
counted in the epoch's ``data/corrupt``; with ``data.strict=true`` the first one stops
the run with :class:`bench.data.jpegs.CorruptImage` naming the file.

Training replaces a damaged image by the next decodable one of the split (wrapping
around): every rank keeps the same number of full batches, so no rank's epoch ends
early and the ranks' collectives stay matched, even for a batch of damaged files only.
Evaluation drops it (no held-out image is scored twice).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset

from bench.data.cached_folder import warn_corrupt
from bench.data.jpegs import CorruptImage, decode_rgb
from bench.data.loaders import Batch, DeviceLoader

CORRUPT = "data/corrupt"  # the loaders' per-epoch count of damaged images met


def load_rgb(path: str) -> Any:
    """ImageFolder's loader, decoding fully (PIL is lazy): :class:`CorruptImage` names a
    file that is not a whole image."""
    with open(path, "rb") as f:
        return decode_rgb(f.read(), path)


class SkipDamaged(Dataset):
    """Items ``(image or None, label, [messages of the damaged files met])`` of an
    ImageFolder built with :func:`load_rgb`."""

    def __init__(self, folder: Any, *, substitute: bool) -> None:
        self.folder, self.substitute = folder, substitute

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, i: int) -> tuple[Any, int, list[str]]:
        bad: list[str] = []  # this index's file only: a substitute's is counted at its own
        n = len(self.folder)
        for k in range(n if self.substitute else 1):
            try:
                x, y = self.folder[(i + k) % n]
                return x, y, bad
            except CorruptImage as e:
                if k == 0:
                    bad.append(str(e))
        if self.substitute:
            raise CorruptImage(f"{self.folder.root}: not one image of the split decodes")
        return None, self.folder.targets[i], bad


def collate(items: list[tuple[Any, int, list[str]]]) -> tuple[Any, Any, list[str]]:
    good = [(x, y) for x, y, _ in items if x is not None]
    bad = [m for _, _, msgs in items for m in msgs]
    if not good:
        return None, None, bad
    return torch.stack([x for x, _ in good]), torch.tensor([y for _, y in good]), bad


class SkippingLoader(DeviceLoader):
    """:class:`DeviceLoader` over a :class:`SkipDamaged` set: warns once per damaged file
    (or raises, ``strict``) and counts them in ``epoch_stats()['data/corrupt']``."""

    def __init__(self, dataset: SkipDamaged, *, strict: bool, **kw: Any) -> None:
        super().__init__(dataset, collate_fn=collate, **kw)
        self.strict = strict
        self._corrupt = 0
        self._seen: set[str] = set()

    def epoch_stats(self) -> dict[str, Any]:
        out = {**super().epoch_stats(), CORRUPT: self._corrupt}
        self._corrupt = 0
        return out

    def __iter__(self) -> Iterator[Batch]:
        nb = self.device.type == "cuda"
        for x, y, bad in self.loader:
            if bad:
                self._corrupt += len(bad)
                warn_corrupt(bad, self._seen, self.strict)
            if y is None:  # evaluation: every image of the batch was damaged
                continue
            self._samples += len(y)
            yield x.to(self.device, non_blocking=nb), y.to(self.device, non_blocking=nb)


__all__ = ["CORRUPT", "SkipDamaged", "SkippingLoader", "collate", "load_rgb"]
