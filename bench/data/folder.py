"""ImageNet-style class folders read with torchvision, the baseline input path:
RandomResizedCrop + flip for training, resize to size / 0.875 + centre crop for evaluation
(the standard ImageNet protocol)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from bench.data.jpegs import CorruptImage, decode_rgb
from bench.data.loaders import DataBundle, DeviceLoader, check_classes, per_rank
from bench.registry import ConfigError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def check_split(root: str, sub: str) -> Path:
    """The split folder, refusing a missing root/split or an empty class folder."""
    base = Path(root).expanduser()
    if not root or not base.is_dir():
        raise ConfigError(f"data.root={root!r} is not a directory")
    split = base / sub
    if not split.is_dir():
        raise ConfigError(f"data.root={root!r} has no '{sub}' folder of class folders")
    classes = sorted(d for d in split.iterdir() if d.is_dir())
    if not classes:
        raise ConfigError(f"{split} contains no class folders")
    for d in classes:
        if not any(f.suffix.lower() in IMAGE_EXTENSIONS for f in d.iterdir() if f.is_file()):
            raise ConfigError(f"class folder {d} contains no images")
    return split


def check_pair(train: Path, val: Path, batch_size: int) -> None:
    """Refuse, before any worker starts, a class folder in one split only (the labels would
    differ) and a global batch larger than the training split (epochs of no step)."""
    a = {d.name for d in train.iterdir() if d.is_dir()}
    b = {d.name for d in val.iterdir() if d.is_dir()}
    if a != b:
        only = [f"{n} (only in {train.name})" for n in sorted(a - b)]
        only += [f"{n} (only in {val.name})" for n in sorted(b - a)]
        raise ConfigError(f"train and val class folders differ: {', '.join(only[:5])}")
    n = sum(
        1 for d in train.iterdir() if d.is_dir()
        for f in d.iterdir() if f.suffix.lower() in IMAGE_EXTENSIONS
    )  # fmt: skip
    if batch_size > n:
        raise ConfigError(
            f"data.batch_size={batch_size} is larger than the {n} training images of {train}"
        )


def build_transforms(image_size: int, eval_image_size: int, flip: bool):
    # deferred: torchvision is slow to load, and only this path needs it
    from torchvision import transforms as T

    norm = T.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    flips = [T.RandomHorizontalFlip()] if flip else []
    train = T.Compose([T.RandomResizedCrop(image_size, antialias=True), *flips, T.ToTensor(), norm])
    resize = T.Resize(int(round(eval_image_size / 0.875)), antialias=True)
    return train, T.Compose([resize, T.CenterCrop(eval_image_size), T.ToTensor(), norm])


def build(cfg: Any, rank: int, world: int, device: torch.device, seed: int) -> DataBundle:
    """The loaders of torchvision's ImageFolder (the class index of the training split);
    damaged files are skipped and counted, or one error (``data.strict``)."""
    # deferred: torchvision is slow to load, and only this path needs it
    from torchvision.datasets import ImageFolder

    tr_t, ev_t = build_transforms(cfg.image_size, cfg.eval_image_size, cfg.flip)
    tr = ImageFolder(str(check_split(cfg.root, cfg.train_dir)), transform=tr_t, loader=load_rgb)
    va = ImageFolder(str(check_split(cfg.root, cfg.val_dir)), transform=ev_t, loader=load_rgb)
    if va.class_to_idx != tr.class_to_idx:
        missing = sorted(set(tr.classes) ^ set(va.classes))[:5]
        raise ConfigError(f"train and val class folders differ (e.g. {', '.join(missing)})")
    n_classes = check_classes(cfg, len(tr.classes))
    common = dict(rank=rank, world_size=world, device=device, num_workers=cfg.num_workers)
    common.update(seed=seed, strict=cfg.strict, collate_fn=collate)
    b = per_rank(cfg.batch_size, world, "data.batch_size")
    train = DeviceLoader(SkipDamaged(tr, substitute=True), batch_size=b, train=True, **common)
    eb = max(1, cfg.eval_batch_size // world)
    ev = DeviceLoader(SkipDamaged(va, substitute=False), batch_size=eb, train=False, **common)
    return DataBundle(train, ev, n_classes, len(train) * cfg.batch_size)


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
    """A batch of the good items, and the messages of the damaged files met."""
    good = [(x, y) for x, y, _ in items if x is not None]
    bad = [m for _, _, msgs in items for m in msgs]
    if not good:
        return None, None, bad
    return torch.stack([x for x, _ in good]), torch.tensor([y for _, y in good]), bad
