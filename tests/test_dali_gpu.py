"""DALI on a CUDA device (``pytest -m gpu``; skipped without CUDA or without NVIDIA DALI).

With ``data.dali_device=auto`` on CUDA the folder loader decodes with ``mixed`` and
augments on the GPU: its batches are CUDA tensors, normalised, with the pixels the CPU
pipeline gives (up to JPEG decoder and resampling differences); the pre-decoded cache
level also comes out on the GPU; epochs run back to back, also after
one cut short (a past bug: every external-source run failed at epoch 2).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bench.data.cache import build_reader
from bench.data.jpegs import make_jpeg_folder
from bench.data.storage import LocalStorage, list_folder

pytestmark = [pytest.mark.gpu]

dali = pytest.importorskip("nvidia.dali")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

GPU = torch.device("cuda", 0)
CPU = torch.device("cpu")
# ImageNet normalisation: pixels 0..255 map into [-2.12, 2.64]
LOW, HIGH = -2.2, 2.7


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("jpegs")
    make_jpeg_folder(str(root), 48, 4, "train", small=True)
    make_jpeg_folder(str(root), 24, 4, "val", small=True, seed=1)
    return root


def loader(folder: Path, tmp: Path, *, split: str, cache: str, device, batch=8):
    from bench.data.dali import DaliFolderLoader

    store = LocalStorage(str(folder))
    cfg = SimpleNamespace(
        name=cache, dir=str(tmp / "c"), disk_gb=1.0, memory_gb=1.0, predecode_size=0,
        verify="crc32",
    )  # fmt: skip
    return DaliFolderLoader(
        list_folder(store, split),
        reader=build_reader(store, cfg, str(folder)),
        train=split == "train",
        batch_size=batch,
        rank=0,
        world_size=1,
        device=device,
        threads=2,
        prefetch=2,
        seed=3,
        size_at=lambda e: 32,
        flip=True,
        strict=True,
        predecode_size=64 if cache == "predecoded" else 0,
    )


def check_batch(x: torch.Tensor, y: torch.Tensor, batch: int) -> None:
    assert x.device.type == "cuda" and y.device.type == "cuda"
    assert x.shape == (batch, 3, 32, 32) and x.dtype == torch.float32 and x.is_contiguous()
    assert y.dtype == torch.int64 and y.shape == (batch,)
    assert LOW <= x.min().item() and x.max().item() <= HIGH
    assert x.std().item() > 0.1  # real images, not zeros


@pytest.mark.parametrize("cache", ["none", "multilevel", "predecoded"])
def test_dali_on_cuda_yields_normalised_cuda_batches_epoch_after_epoch(
    folder: Path, tmp_path: Path, cache: str
) -> None:
    ld = loader(folder, tmp_path, split="train", cache=cache, device=GPU)
    assert ld.device_id == 0  # data.dali_device=auto on CUDA: a GPU pipeline
    for epoch in range(3):
        ld.set_epoch(epoch)
        n = 0
        for x, y, idx in ld.iter_indexed():
            check_batch(x, y, 8)
            assert torch.equal(y.cpu(), torch.from_numpy(ld.labels[idx.numpy()]))
            n += 1
            if epoch == 1 and n == 2:
                break  # cut short, as train.max_steps_per_epoch does
        assert n == (2 if epoch == 1 else len(ld))
    if cache != "none":
        assert ld.epoch_stats()["cache/hits"] > 0  # epoch 3 read the cache
    ld.close()


@pytest.mark.parametrize("cache", ["none", "memory"])
def test_mixed_decoding_matches_cpu_decoding(folder: Path, tmp_path: Path, cache: str) -> None:
    """Evaluation (decode, resize, centre crop, normalise) on the GPU vs on the CPU: the
    same images up to the JPEG decoders' and resamplers' rounding."""
    out = {}
    for dev in (GPU, CPU):
        ld = loader(folder, tmp_path / dev.type, split="val", cache=cache, device=dev)
        xs, ids = [], []
        for x, y, idx in ld.iter_indexed():
            assert x.device.type == dev.type and y.device.type == dev.type
            xs.append(x.cpu())
            ids += idx.tolist()
        out[dev.type] = (torch.cat(xs), ids)
        ld.close()
    (xg, ig), (xc, ic) = out["cuda"], out["cpu"]
    assert ig == ic == list(range(24))
    diff = (xg - xc).abs()
    assert diff.mean().item() < 0.05  # about 2.5 grey levels of 255
    assert diff.quantile(0.99).item() < 0.5


def test_to_torch_copy_and_wrap_agree_on_gpu_outputs() -> None:
    """A GPU batch handed over by DLPack and one copied by feed_ndarray on torch's stream
    hold the same numbers, as CUDA tensors of the right dtype."""
    from nvidia.dali import fn, pipeline_def, types

    from bench.data.dali import to_torch

    @pipeline_def
    def pipe():
        x = fn.random.uniform(shape=[3, 5], range=(0.0, 1.0), dtype=types.FLOAT)
        return x.gpu(), fn.cast(x * 100, dtype=types.UINT8).gpu()

    p = pipe(batch_size=4, num_threads=1, device_id=0, seed=1)
    p.build()
    f, u = p.run()
    for out, dtype in ((f, torch.float32), (u, torch.uint8)):
        a = to_torch(out, GPU, wrap=True)
        b = to_torch(out, GPU, wrap=False)
        c = to_torch(out, CPU)
        assert a.is_cuda and b.is_cuda and not c.is_cuda
        assert a.dtype == b.dtype == c.dtype == dtype and a.shape == (4, 3, 5)
        assert torch.equal(a, b) and torch.equal(a.cpu(), c)
