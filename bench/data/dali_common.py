"""Pieces shared by the DALI loaders: the import check, the device choice, the augmentation
graph and the copy of DALI outputs into torch tensors.

Augmentation: training = decode + random-resized-crop (fused as
``decoders.image_random_crop``, which decodes only the crop window) + flip + normalise;
evaluation = resize (shorter side = size / 0.875) + centre crop + normalise.  With CUDA
the decoder is ``mixed`` (nvJPEG) and the rest runs on the GPU; without it everything runs
on the CPU (``device_id=None``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bench.data.folder import IMAGENET_MEAN, IMAGENET_STD
from bench.registry import ConfigError


def require_dali():
    """Import DALI or fail with one sentence."""
    try:
        import nvidia.dali as dali  # noqa: F401
        from nvidia.dali import fn, pipeline_def, types
    except ImportError:
        raise ConfigError(
            "data.loader=dali needs NVIDIA DALI: pip install nvidia-dali-cuda120 "
            "(or the 'dali' extra), or use data.loader=torch"
        ) from None
    return fn, pipeline_def, types


def dali_device_id(device: Any, dali_device: str) -> int | None:
    """The CUDA device for GPU operators, or None for a CPU-only pipeline."""
    use_gpu = getattr(device, "type", str(device)) == "cuda"
    if dali_device == "cpu" or not use_gpu:
        if dali_device == "gpu":
            raise ConfigError("data.dali_device=gpu needs a CUDA training device")
        return None
    return device.index if device.index is not None else 0


def augment(
    fn,
    types,
    images,
    *,
    train: bool,
    size: int,
    decoded_input: bool,
    gpu: bool,
    flip: bool,
    encoded: bool = True,
):
    """The shared DALI augmentation graph (see the module docstring)."""
    dec = "mixed" if gpu else "cpu"
    mirror = fn.random.coin_flip(probability=0.5) if (train and flip) else 0
    if train:
        if decoded_input:
            images = images.gpu() if gpu else images
            images = fn.random_resized_crop(
                images,
                size=[size, size],
                random_area=[0.08, 1.0],
                random_aspect_ratio=[3 / 4, 4 / 3],
            )
        else:
            images = fn.decoders.image_random_crop(
                images,
                device=dec,
                output_type=types.RGB,
                random_area=[0.08, 1.0],
                random_aspect_ratio=[3 / 4, 4 / 3],
            )
            images = fn.resize(images, resize_x=size, resize_y=size)
        crop = None
    else:
        if not decoded_input:
            images = fn.decoders.image(images, device=dec, output_type=types.RGB)
        elif gpu:
            images = images.gpu()
        images = fn.resize(images, resize_shorter=round(size / 0.875))
        crop = (size, size)
    return fn.crop_mirror_normalize(
        images,
        crop=crop,
        mirror=mirror,
        dtype=types.FLOAT,
        output_layout="CHW",
        mean=[m * 255 for m in IMAGENET_MEAN],
        std=[s * 255 for s in IMAGENET_STD],
    )


def to_torch(out: Any, device: Any):
    """A DALI TensorList (CPU or GPU) as a torch tensor on ``device``."""
    import torch

    if type(out).__name__ == "TensorListGPU":
        from nvidia.dali.plugin.pytorch import feed_ndarray

        t = out.as_tensor()
        dst = torch.empty(
            t.shape(),
            dtype=torch.float32 if "FLOAT" in str(t.dtype) else torch.int64,
            device=device,
        )
        feed_ndarray(t, dst, cuda_stream=torch.cuda.current_stream(device))
        return dst
    return torch.from_numpy(out.as_array())


class ExternalEpochs:
    """Runs an ``fn.external_source`` pipeline one epoch at a time.

    DALI calls the source ahead of ``run()`` (``prefetch_queue_depth`` batches) and, once
    the source has raised StopIteration, raises it from ``run()`` until ``reset()``.  The
    training loop takes ``len(loader)`` or fewer batches and drops the iterator, so an
    epoch may end before DALI has reported its end.  :meth:`finish` closes such an epoch:
    the source is stopped, the batches DALI had prefetched are run out and dropped, and
    the pipeline is reset, so the next epoch starts with its own first batch.
    """

    def __init__(self) -> None:
        self.open: Any = None  # the pipeline whose epoch has not reached StopIteration

    def finish(self, stop_source: Any) -> None:
        pipe, self.open = self.open, None
        if pipe is None:
            return
        stop_source()
        while True:
            try:
                pipe.run()
            except StopIteration:
                break
        pipe.reset()

    def run(self, pipe: Any, call: Any) -> Iterator[Any]:
        """``call(pipe.run)`` once per batch until the source's StopIteration."""
        self.open = pipe
        while True:
            try:
                out = call(pipe.run)
            except StopIteration:
                pipe.reset()
                self.open = None
                return
            yield out
