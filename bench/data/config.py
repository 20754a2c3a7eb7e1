"""Schema of the ``data`` and ``cache`` config groups (conf/data, conf/cache)."""

from dataclasses import dataclass


@dataclass
class DataConfig:
    name: str = "digits"  # registry key in bench.data
    root: str = ""  # data set directory (cifar10, imagefolder, imagenet); "" = none
    batch_size: int = 128  # GLOBAL training batch, split evenly over the workers
    eval_batch_size: int = 256  # global evaluation batch
    image_size: int = 32  # training resolution (pixels, square)
    eval_image_size: int = 32  # evaluation resolution (center crop)
    num_classes: int = 10
    channels: int = 3
    num_workers: int = 0  # DataLoader worker processes per training process
    loader: str = "torch"  # torch | dali
    train_dir: str = "train"  # imagefolder/imagenet: sub-folder with the training classes
    val_dir: str = "val"  # imagefolder/imagenet: sub-folder with the held-out classes
    synthetic_size: int = 4096  # synthetic: samples per epoch (global)
    pad: int = 4  # random-crop padding (pixels) for the 32x32 data sets
    flip: bool = False  # random horizontal flip (off for digits: mirrored digits are other glyphs)
    test_fraction: float = 0.2  # digits: held-out fraction (fixed stratified split)
    split_seed: int = 0  # digits: seed of the fixed split
    strict: bool = False  # stop at the first corrupt image instead of skipping it


@dataclass
class CacheConfig:
    name: str = "none"  # none | disk | memory | multilevel
