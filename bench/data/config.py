"""Schema of the ``data`` and ``cache`` config groups (conf/data, conf/cache)."""

from dataclasses import dataclass, field

from bench.registry import Choice


class Loader(Choice):
    """The input pipeline: torch (DataLoader / batched tensor ops) or NVIDIA DALI."""

    torch = "torch"
    dali = "dali"


class DaliDevice(Choice):
    """Where DALI runs: auto (mixed decode + GPU ops when training on CUDA), cpu, gpu."""

    auto = "auto"
    cpu = "cpu"
    gpu = "gpu"


class Verify(Choice):
    """The check of a level 1 cache file before it is trusted."""

    crc32 = "crc32"  # length and CRC-32 of the payload
    size = "size"  # length only (cheaper, misses flipped bytes)


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
    loader: Loader = Loader.torch
    train_dir: str = "train"  # imagefolder/imagenet: sub-folder with the training classes
    val_dir: str = "val"  # imagefolder/imagenet: sub-folder with the held-out classes
    synthetic_size: int = 4096  # synthetic: samples per epoch (global)
    pad: int = 4  # random-crop padding (pixels) for the 32x32 data sets
    flip: bool = False  # random horizontal flip (off for digits: mirrored digits are other glyphs)
    test_fraction: float = 0.2  # digits: held-out fraction (fixed stratified split)
    split_seed: int = 0  # digits: seed of the fixed split
    strict: bool = False  # stop at the first corrupt image instead of skipping it
    # --- input pipeline: DALI, cache, slow storage ---
    dali_threads: int = 0  # DALI CPU threads (and level-0 fetch threads); 0 = max(1, num_workers)
    dali_device: DaliDevice = DaliDevice.auto
    prefetch: int = 2  # batches prepared ahead (DALI prefetch_queue_depth, fetch queue)
    # progressive resizing: [[epoch, size], ...], e.g. [[0, 128], [10, 224], [20, 288]];
    # the training size from each epoch on (empty = always image_size)
    progressive: list[list[int]] = field(default_factory=list)
    throttle_mbps: float = 0.0  # slow-storage emulator on level 0: bandwidth MB/s (0 = off)
    throttle_ms: float = 0.0  # slow-storage emulator: latency per file, ms (0 = off)
    # --- translation (data=translation): parallel text <root>/<split>.<src|tgt> ---
    src: str = "en"  # source language suffix of the files
    tgt: str = "sym"  # target language suffix
    max_tokens: int = 4096  # per worker and step: padded source + target tokens of a batch
    max_len: int = 256  # tokens; longer training pairs are skipped (counted, reported)
    vocab_size: int = 8000  # sentencepiece vocabulary, a soft limit (a small corpus gets less)
    spm_model: str = ""  # a sentencepiece model file; "" = train one on train.<src>+<tgt>
    eval_split: str = "valid"  # held-out split scored each evaluation: valid | test
    beam_size: int = 1  # evaluation decoding: 1 = greedy, > 1 = beam search
    corpus_size: int = 20000  # data.root="": training pairs of the generated corpus


@dataclass
class CacheConfig:
    """Levels of the data cache (bench/data/cache.py); the name is stored in every record."""

    name: str = "none"  # a key of bench.data.cache.CACHES
    # level 1 directory, kept across runs; "" = $BENCH_CACHE_DIR or ~/.cache/topk-dawnbench/data
    dir: str = ""
    disk_gb: float = 100.0  # level 1 size cap (1e9 bytes), LRU eviction above it
    # level 2 byte cap (1e9 bytes) per loader (train, eval) of a training process, split
    # over its workers
    memory_gb: float = 4.0
    # predecoded: cap (pixels) on the shorter side of the stored uint8 images; 0 = the
    # original resolution (never upsampled)
    predecode_size: int = 0
    verify: Verify = Verify.crc32


def train_size_at(data_cfg: DataConfig, epoch: int) -> int:
    """Training image size (pixels) in ``epoch`` under ``data.progressive``."""
    size = data_cfg.image_size
    for start, s in sorted((int(a), int(b)) for a, b in data_cfg.progressive):
        if epoch >= start:
            size = s
    return size


def train_sizes(data_cfg: DataConfig) -> list[int]:
    """Every training size the run will use (pre-decoding stores the largest)."""
    sizes = {int(b) for _, b in data_cfg.progressive}
    if not data_cfg.progressive or min(int(a) for a, _ in data_cfg.progressive) > 0:
        sizes.add(data_cfg.image_size)
    return sorted(sizes)
