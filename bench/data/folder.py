"""ImageNet-style class folders: the checks made before any worker starts, the ImageNet
normalisation, and torchvision's transforms of the standard ImageNet protocol
(RandomResizedCrop + flip; resize to size / 0.875 + centre crop), the input benchmarks'
baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.data.storage import IMAGE_EXTENSIONS, is_url
from bench.registry import ConfigError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


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
        if not any(f.name.endswith(IMAGE_EXTENSIONS) for f in d.iterdir() if f.is_file()):
            raise ConfigError(f"class folder {d} contains no images")
    return split


def check(cfg: Any) -> None:
    """Refuse, before any worker starts, a split that cannot be read, a class folder in one
    split only (the labels would differ) and a global batch larger than the training split
    (epochs of no step); remote (fsspec) roots are listed when the loaders are built."""
    if is_url(cfg.root):
        return
    train, val = check_split(cfg.root, cfg.train_dir), check_split(cfg.root, cfg.val_dir)
    a = {d.name for d in train.iterdir() if d.is_dir()}
    b = {d.name for d in val.iterdir() if d.is_dir()}
    if a != b:
        only = [f"{n} (only in {train.name})" for n in sorted(a - b)]
        only += [f"{n} (only in {val.name})" for n in sorted(b - a)]
        raise ConfigError(f"train and val class folders differ: {', '.join(only[:5])}")
    n = sum(
        1 for d in train.iterdir() if d.is_dir()
        for f in d.iterdir() if f.name.endswith(IMAGE_EXTENSIONS)
    )  # fmt: skip
    if cfg.batch_size > n:
        raise ConfigError(
            f"data.batch_size={cfg.batch_size} is larger than the {n} training images of {train}"
        )


def build_transforms(image_size: int, eval_image_size: int, flip: bool):
    # deferred: torchvision is slow to load, and only this path needs it
    from torchvision import transforms as T

    norm = T.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    flips = [T.RandomHorizontalFlip()] if flip else []
    train = T.Compose([T.RandomResizedCrop(image_size, antialias=True), *flips, T.ToTensor(), norm])
    resize = T.Resize(int(round(eval_image_size / 0.875)), antialias=True)
    return train, T.Compose([resize, T.CenterCrop(eval_image_size), T.ToTensor(), norm])
