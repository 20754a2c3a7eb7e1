"""Pieces shared by the DALI loaders: the import check, the device choice, the augmentation
graph and the copy of DALI outputs into torch tensors.

Augmentation: training = decode + random-resized-crop (fused as
``decoders.image_random_crop``, which decodes only the crop window) + flip + normalise;
evaluation = resize (shorter side = size / 0.875) + centre crop + normalise.  With CUDA
(``data.dali_device=auto`` or ``gpu``) the decoder is ``mixed`` (nvJPEG: Huffman decoding
on the CPU or the hardware JPEG decoder, the rest on the GPU) and every later operator
runs on the GPU; pre-decoded pixels are moved to the GPU right after the external
source.  Without CUDA everything runs on the CPU (``device_id=None``).

Hand-over to torch (:func:`to_torch`): with DALI's dynamic executor (the default since
DALI 2.0) a pipeline's outputs belong to the caller, so they are wrapped by DLPack with no
copy (on the GPU, DALI makes torch's current stream wait for the batch); with the older
executor, whose output buffers are reused, GPU batches are copied device to device on
torch's current stream (``feed_ndarray``) and CPU batches once to host memory.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

import torch

from bench.data.folder import IMAGENET_MEAN, IMAGENET_STD
from bench.registry import ConfigError


def require_dali():
    """Import DALI or fail with one sentence."""
    try:
        import nvidia.dali as dali  # noqa: F401

        # deferred: DALI is optional (GPU machines), loaded only when asked for
        from nvidia.dali import fn, pipeline_def, types
    except ImportError:
        raise ConfigError(
            "data.loader=dali needs NVIDIA DALI: pip install nvidia-dali-cuda120 "
            "(or the 'dali' extra), or use data.loader=torch"
        ) from None
    return fn, pipeline_def, types


def dali_device_id(device: Any, dali_device: str) -> int | None:
    """The CUDA device for GPU operators, or None for a CPU-only pipeline.

    ``auto``: the training device's GPU when training on CUDA, else the CPU; ``cpu``: always
    the CPU; ``gpu``: the training device's GPU, an error when training on the CPU.
    """

    device = torch.device(device)
    if str(dali_device) not in ("auto", "cpu", "gpu"):
        raise ConfigError(f"data.dali_device must be auto, cpu or gpu, got {dali_device!r}")
    if dali_device == "cpu" or device.type != "cuda":
        if dali_device == "gpu":
            raise ConfigError("data.dali_device=gpu needs a CUDA training device")
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


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
    # mixed: the decoder's host threads are not pinned to cores (affine=False), since
    # several training processes of a node may each run a pipeline on their own GPU
    dec_kw: dict[str, Any] = {"device": dec, "output_type": types.RGB}
    if gpu:
        dec_kw["affine"] = False
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
                **dec_kw,
                random_area=[0.08, 1.0],
                random_aspect_ratio=[3 / 4, 4 / 3],
            )
            images = fn.resize(images, resize_x=size, resize_y=size)
        crop = None
    else:
        if not decoded_input:
            images = fn.decoders.image(images, **dec_kw)
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


def zero_copy(pipe: Any) -> bool:
    """Whether ``pipe``'s outputs belong to the caller (DALI's dynamic executor), so that
    they can be wrapped by DLPack instead of copied."""
    return bool(getattr(pipe, "exec_dynamic", False))


def to_torch(out: Any, device: Any, *, wrap: bool = False):
    """A dense DALI TensorList (CPU or GPU) as a torch tensor on ``device``.

    ``wrap`` (outputs owned by the caller, see :func:`zero_copy`): DLPack, no copy; for a
    GPU batch ``torch.from_dlpack`` passes torch's current stream, on which DALI inserts a
    wait for the batch.  Otherwise GPU batches are copied on torch's current stream into
    a new CUDA tensor (``feed_ndarray``, as DALI's own iterator does) and CPU batches are
    copied to host memory.  A GPU batch asked for on the CPU is copied to the host.
    """

    device = torch.device(device)
    gpu = type(out).__name__ == "TensorListGPU"
    if gpu and device.type != "cuda":
        out, gpu = out.as_cpu(), False
    t = out.as_tensor()
    if wrap:
        x = torch.from_dlpack(t)
    elif gpu:
        # deferred: DALI is optional (GPU machines), loaded only when asked for
        from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

        cuda = torch.device("cuda", out.device_id())
        x = torch.empty(t.shape(), dtype=to_torch_type[t.dtype], device=cuda)
        feed_ndarray(t, x, cuda_stream=torch.cuda.current_stream(cuda))
    else:
        x = torch.from_numpy(out.as_array())
    return to_device(x, device)


def to_device(x: Any, device: Any):
    """``x`` on ``device``; host to GPU without waiting for the GPU's queued work.

    A blocking copy to the GPU waits for everything queued on torch's stream (the previous
    training step), which would stall the loop.  From pageable host memory an asynchronous
    copy is staged before it returns, so the source may be dropped at once; from pinned
    memory that torch did not allocate (DALI's) it would not be, so that one is blocking.
    """

    device = torch.device(device)
    if device.type == "cuda" and not x.is_cuda:
        return x.to(device, non_blocking=not x.is_pinned())
    return x.to(device)


class KeepAlive:
    """References to the last batches given to a ``no_copy`` external source.

    With ``no_copy=True`` DALI reads the source's arrays in place (no host copy) until the
    pipeline has consumed them, up to ``prefetch_queue_depth`` iterations later; holding
    the latest ``depth`` batches keeps their memory valid that long (for pre-decoded
    images the cache may drop its own reference meanwhile).
    """

    def __init__(self, depth: int) -> None:

        self.ring: deque = deque(maxlen=max(2, depth))

    def __call__(self, batch: Any) -> Any:
        self.ring.append(batch)
        return batch


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
