"""The JPEG helpers the loaders share (decoding that names a damaged file, and the warning
or error it gives), and generated ImageNet-like JPEG folders for tests and benchmarks
(see docs/internals/data.md)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
import warnings
from concurrent.futures import ProcessPoolExecutor

import numpy as np


class CorruptImage(ValueError):
    """An image file that cannot be decoded; the message names the file."""


def warn_corrupt(names: list[str], seen: set[str], strict: bool) -> None:
    """Warn once per damaged file (``names``: messages naming them), or raise the first as
    :class:`CorruptImage` when ``strict`` (``data.strict=true``)."""
    for msg in names:
        if strict:
            raise CorruptImage(f"corrupt image (data.strict=true): {msg}")
        if msg not in seen:
            seen.add(msg)
            warnings.warn(f"skipping corrupt image {msg}", stacklevel=3)


def decode_capped(data: bytes, max_short_side: int, name: str) -> np.ndarray:
    """Decode fully (uint8 HWC; PIL is lazy); when the shorter side exceeds ``max_short_side``
    > 0, shrink it to that by PIL's JPEG draft mode where it can (never upsamples)."""
    # deferred: Pillow only where images are decoded
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(io.BytesIO(data))  # the header only, until loaded
        w, h = img.size
        if max_short_side <= 0 or min(w, h) <= max_short_side:
            img.load()  # decode now: PIL is lazy, and a truncated file fails only here
            return np.array(img.convert("RGB"), dtype=np.uint8)
        scale = max_short_side / min(w, h)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        img.draft("RGB", size)
        img = img.convert("RGB")
        if img.size != size:
            img = img.resize(size, Image.BILINEAR, reducing_gap=None)
        return np.array(img, dtype=np.uint8)  # a writable copy (torch.from_numpy wants one)
    except (OSError, UnidentifiedImageError, SyntaxError, ValueError) as e:
        raise CorruptImage(f"{name}: cannot decode image ({e})") from None


def jpeg_looks_complete(data: bytes) -> bool:
    """A JPEG starts with SOI (FFD8) and ends with EOI (FFD9); PNG files pass."""
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return True
    return len(data) > 4 and data[:2] == b"\xff\xd8" and b"\xff\xd9" in data[-64:]


def _write_class(args: tuple) -> int:
    """Write one class folder; returns its bytes.  Each image: a bicubic-upsampled 6x6 colour
    grid plus Gaussian noise, whose sigma sets the file size (measured at ~450x350, quality
    90: sigma 9 -> 54 KB ... 35 -> 110 KB)."""
    # deferred: Pillow only where images are decoded
    from PIL import Image

    root, split, cls, n, seed, target_kb, quality, small = args
    d = os.path.join(root, split, cls)
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(seed)
    kb, sigma = [54.0, 64.0, 73.0, 81.0, 90.0, 110.0], [9.0, 12.0, 15.0, 18.0, 22.0, 35.0]
    noise = 0.5 if small else float(np.interp(target_kb, kb, sigma, left=2.0, right=50.0))
    total = 0
    for i in range(n):
        if small:  # tiny images for unit tests
            w, h = int(rng.integers(40, 72)), int(rng.integers(32, 64))
        else:  # ImageNet-like sizes and aspect ratios
            w, h = int(rng.integers(400, 520)), int(rng.integers(300, 400))
            if rng.random() < 0.25:
                w, h = h, w
        grid = rng.integers(0, 256, size=(6, 6, 3), dtype=np.uint8)
        img = np.asarray(Image.fromarray(grid).resize((w, h), Image.BICUBIC), dtype=np.float32)
        img += rng.normal(0.0, noise, size=img.shape).astype(np.float32)
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(
            buf, format="JPEG", quality=quality
        )
        with open(os.path.join(d, f"{cls}_{i:05d}.jpg"), "wb") as f:
            f.write(buf.getvalue())
        total += len(buf.getvalue())
    return total


def make_jpeg_folder(
    root: str,
    images: int,
    classes: int = 10,
    split: str = "train",
    *,
    target_kb: float = 110.0,
    quality: int = 90,
    small: bool = False,
    seed: int = 0,
    workers: int = 1,
) -> dict:
    """Write ``images`` JPEGs spread over ``classes`` folders under ``root/split`` (tiny ones
    with ``small=True``); returns the number of images and the mean file size in KB."""
    per = [images // classes + (1 if c < images % classes else 0) for c in range(classes)]
    jobs = [
        (root, split, f"c{c:04d}", per[c], seed * 1_000_003 + c, target_kb, quality, small)
        for c in range(classes)
    ]
    if workers > 1:
        with ProcessPoolExecutor(workers) as ex:
            sizes = list(ex.map(_write_class, jobs))
    else:
        sizes = [_write_class(j) for j in jobs]
    return {"images": images, "classes": classes, "mean_kb": sum(sizes) / max(1, images) / 1e3}


def cached_jpeg_folder(
    images: int,
    classes: int,
    *,
    val_images: int = 0,
    base: str | None = None,
    target_kb: float = 110.0,
    seed: int = 0,
    workers: int = 2,
    small: bool = False,
) -> str:
    """A generated ``train`` (and ``val`` when ``val_images``) folder under ``base`` (default:
    the temp dir), made once (named by a hash of the parameters) and reused."""
    base = base or os.path.join(tempfile.gettempdir(), "topk-dawnbench-jpegs")
    params = dict(
        images=images, classes=classes, val=val_images, kb=target_kb, seed=seed, small=small, v=1
    )
    key = hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
    root = os.path.join(base, f"{images}x{classes}-{key}")
    if os.path.exists(os.path.join(root, "done.json")):
        return root
    os.makedirs(base, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".gen-", dir=base)
    summary = {}
    for k, (split, n) in enumerate([("train", images), ("val", val_images)]):
        if n:
            kw = dict(target_kb=target_kb, seed=seed + k, workers=workers, small=small)
            summary[split] = make_jpeg_folder(tmp, n, classes, split, **kw)
    with open(os.path.join(tmp, "done.json"), "w") as f:
        json.dump({**params, "summary": summary}, f)
    try:
        os.rename(tmp, root)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return root
