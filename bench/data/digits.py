"""The embedded default data set: scikit-learn's bundled 8x8 handwritten digits.

1,797 grey images of 10 classes ship inside scikit-learn, so a fresh machine can run the
DAWNBench-style recipe with no download.  Images are upsampled to 32x32 (bilinear) and
repeated over 3 channels so that the CIFAR-sized networks apply unchanged; the split is
a fixed stratified one (``data.test_fraction``, ``data.split_seed``).
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=4)
def load_digits_split(
    size: int = 32, test_fraction: float = 0.2, split_seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train_x, train_y, test_x, test_y); x float in [0, 1], shape (N, 3, size, size)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8), pixel 0..16
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = x.clamp_(0, 1).expand(-1, 3, -1, -1).contiguous()
    y = torch.tensor(d.target, dtype=torch.long)
    idx = torch.arange(len(y)).numpy()
    tr, te = train_test_split(
        idx, test_size=test_fraction, stratify=d.target, random_state=split_seed
    )
    tr, te = torch.as_tensor(sorted(tr)), torch.as_tensor(sorted(te))
    return x[tr], y[tr], x[te], y[te]
