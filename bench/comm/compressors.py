"""Compressors and error-feedback memory, two of GRACE's (Xu et al., ICDCS 2021) three
pieces: a compressor makes what goes on the wire, a memory what is added before and kept
after.  :class:`ResidualMemory`: old residual + gradient == sent + new residual, every call.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from bench.comm.config import HookOptions, ValueDtype, parse
from bench.comm.cost import k_for
from bench.comm.selection import SELECTORS
from bench.comm.wire import to_wire, widened
from bench.registry import ConfigError, Registry

COMPRESSORS: Registry[type[Compressor]] = Registry("compressor")


def torch_dtype(value_dtype: ValueDtype | str) -> torch.dtype:
    return getattr(torch, parse(ValueDtype, value_dtype, "value dtype").value)


@dataclass
class Compressed:
    """One worker's bucket: ``values`` at flat positions ``indices`` (None: all of them)."""

    values: torch.Tensor
    indices: torch.Tensor | None
    numel: int
    dtype: torch.dtype  # dtype of the uncompressed tensor

    @property
    def sparse(self) -> bool:
        return self.indices is not None


class Compressor:
    sparse: bool = False  # sends (index, value) pairs: needs a sparse communicator

    @classmethod
    def build(cls, opts: HookOptions) -> Compressor:  # each class takes the options it uses
        return cls()

    def compress(self, x: torch.Tensor, density: float) -> Compressed:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:  # its generators' states (most keep nothing)
        return {}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        pass


@COMPRESSORS.register("dense")
class NoCompressor(Compressor):
    """The control: the gradient as it is."""

    def compress(self, x: torch.Tensor, density: float) -> Compressed:
        return Compressed(x, None, x.numel(), x.dtype)


class _CastCompressor(Compressor):
    target: torch.dtype

    def compress(self, x: torch.Tensor, density: float) -> Compressed:
        return Compressed(to_wire(x, self.target), None, x.numel(), x.dtype)


@COMPRESSORS.register("fp16")
class FP16Compressor(_CastCompressor):
    """Half-precision values (what ``default_hooks.fp16_compress_hook`` does)."""

    target = torch.float16


@COMPRESSORS.register("bf16")
class BF16Compressor(_CastCompressor):
    """bfloat16 values: fp32's range, 8 mantissa bits."""

    target = torch.bfloat16


class _SparseCompressor(Compressor):
    sparse = True
    selector = "topk"

    def __init__(self, value_dtype: ValueDtype | str = "float32", **select_options: Any) -> None:
        allowed = self.allowed_options()
        for name in select_options:
            if name not in allowed:
                raise ConfigError(
                    f"unknown option {name!r} of compressor {self.selector!r}; "
                    f"allowed: {', '.join(allowed) or 'none'}"
                )
        self.vdtype = torch_dtype(value_dtype)
        self.options = select_options

    @classmethod
    def allowed_options(cls) -> list[str]:  # the selector's public keywords after (x, k)
        params = list(inspect.signature(SELECTORS[cls.selector]).parameters.values())
        return [p.name for p in params[2:] if not p.name.startswith("_")]

    @classmethod
    def build(cls, opts: HookOptions) -> Compressor:
        return cls(opts.value_dtype)

    def select_options(self, x: torch.Tensor) -> dict[str, Any]:
        return self.options

    def compress(self, x: torch.Tensor, density: float) -> Compressed:
        k = k_for(x.numel(), density)
        vals, idx = SELECTORS[self.selector](x, k, **self.select_options(x))
        # wire values for every gradient dtype: the memory keeps the cast's error
        return Compressed(to_wire(vals, self.vdtype), idx, x.numel(), x.dtype)


@COMPRESSORS.register("topk")
class TopKCompressor(_SparseCompressor):
    """Exact top-k by magnitude (``torch.topk``): the baseline of every top-k paper."""

    selector = "topk"


@COMPRESSORS.register("mstopk")
class MSTopKCompressor(_SparseCompressor):
    """MSTopK threshold-search selection (:func:`bench.comm.selection.mstopk`)."""

    selector = "mstopk"

    @classmethod
    def build(cls, opts: HookOptions) -> Compressor:
        return cls(opts.value_dtype, method=opts.mstopk_method)


@COMPRESSORS.register("randomk")
class RandomKCompressor(_SparseCompressor):
    """``k`` uniformly random positions: the magnitude-blind control."""

    selector = "randomk"

    def __init__(
        self, value_dtype: ValueDtype | str = "float32", seed: int | None = None, **options: Any
    ) -> None:
        super().__init__(value_dtype, **options)  # refuses any option but seed
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    @classmethod
    def allowed_options(cls) -> list[str]:
        return ["seed"]  # the generator is made from it, on the bucket's device

    def select_options(self, x: torch.Tensor) -> dict[str, Any]:
        if self.seed is None:
            return {}
        gen = self._generators.get(x.device)
        if gen is None:  # randperm draws on the device of its generator
            gen = torch.Generator(device=x.device).manual_seed(self.seed)
            self._generators[x.device] = gen
        return {"generator": gen}

    @classmethod
    def build(cls, opts: HookOptions) -> Compressor:
        return cls(opts.value_dtype, seed=opts.seed)

    def state_dict(self) -> dict[str, Any]:
        return {str(dev): g.get_state() for dev, g in self._generators.items()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if self.seed is not None:
            for dev, st in sd.items():
                gen = torch.Generator(device=torch.device(dev)).manual_seed(self.seed)
                gen.set_state(st.cpu())
                self._generators[torch.device(dev)] = gen


class Memory:
    """``compensate`` before compression, ``update`` after it; keyed per bucket."""

    discarded = 0  # elements given up unsent (each with a warning)

    def compensate(self, x: torch.Tensor, key: Hashable) -> torch.Tensor:
        return x

    def update(self, key: Hashable, compensated: torch.Tensor, c: Compressed) -> None:
        pass

    def sweep(self) -> None:  # between steps: forget the buckets the last step did not use
        pass

    def state_dict(self) -> dict[str, dict[Hashable, torch.Tensor]]:  # {kind: {key: tensor}}
        return {}

    def load_state_dict(self, sd: Mapping[str, Mapping[Hashable, torch.Tensor]]) -> None:
        if any(sd.values()):
            warnings.warn(
                "saved residuals discarded: this hook keeps no error feedback", stacklevel=2
            )


class NoMemory(Memory):
    """No error feedback: whatever is not sent is lost."""


@dataclass
class ResidualMemory(Memory):
    """Error feedback (Seide et al. 2014; Karimireddy et al. 2019): a residual per bucket
    key (float32 for 16-bit buckets) that ``compensate`` adds the gradient into and
    ``update`` takes the sent wire values off: exactly what was not sent."""

    buffers: dict[Hashable, torch.Tensor] = field(default_factory=dict)
    used: set[Hashable] = field(default_factory=set)  # keys compensated since the last sweep
    discarded: int = 0  # residual elements freed unsent, with a warning
    # DDP lays its buckets out anew after the first step: a residual whose bucket is gone
    # goes on by parameter.  ``pieces``: key -> the parameters' pieces its residual holds
    # (parameter id, offset in the residual, offset in the parameter, elements);
    # ``pending``: parameter id -> (offset in it, values) not yet added to its new bucket;
    # ``places``: bucket key -> its parameters (id, offset in the bucket, elements)
    pieces: dict[Hashable, list[tuple[int, int, int, int]]] = field(
        default_factory=dict, repr=False
    )
    places: dict[Hashable, list[tuple[int, int, int]]] = field(default_factory=dict, repr=False)
    pending: dict[int, list[tuple[int, torch.Tensor]]] = field(default_factory=dict, repr=False)

    def compensate(self, x: torch.Tensor, key: Hashable) -> torch.Tensor:
        buf = self.buffers.get(key)
        dtype = widened(x.dtype)  # float16/bfloat16 buckets: a float32 residual
        if buf is None or buf.shape != x.shape or buf.device != x.device or buf.dtype != dtype:
            if buf is not None:
                self.discard(buf.numel(), "a bucket changed its size, dtype or device")
            buf = torch.zeros_like(x, dtype=dtype)  # new bucket (or rebuilt buckets): no history
            self.buffers[key] = buf
        self.used.add(key)
        return buf.add_(x)

    def sweep(self) -> None:
        """Residuals of keys unused since the last sweep (none if nothing was: warm-up
        steps keep them) go by parameter into :attr:`pending`, else are discarded."""
        if self.used:
            lost = [0, 0]  # buckets, elements
            for k in [k for k in self.buffers if k not in self.used]:
                buf = self.buffers.pop(k)
                if k not in self.pieces:
                    lost[0], lost[1] = lost[0] + 1, lost[1] + buf.numel()
                for pid, off, at, n in self.pieces.pop(k, ()):
                    self.pending.setdefault(pid, []).append((at, buf[off : off + n]))
            if lost[0]:
                self.discard(lost[1], f"{lost[0]} bucket(s) the last step did not reduce")
        self.used = set()

    def carry(self, flat: torch.Tensor, places: list[tuple[int, int, int]]) -> None:
        """Add the pending residuals of a bucket's parameters into ``flat``."""
        for pid, off, _ in places:
            for at, v in self.pending.pop(pid, ()):
                flat[off + at : off + at + v.numel()].add_(v.to(flat.dtype))

    def discard(self, numel: int, why: str) -> None:
        """Count ``numel`` residual elements given up, with a warning: unsent gradient lost
        (as when DDP rebuilds its buckets after a sparse first step; warmup_steps >= 1)."""
        self.discarded += numel
        warnings.warn(
            f"error feedback: discarded {numel} residual elements ({why}); {self.discarded} in all",
            RuntimeWarning,
            stacklevel=3,
        )

    def update(self, key: Hashable, compensated: torch.Tensor, c: Compressed) -> None:
        buf = self.buffers[key]
        if c.indices is None:
            buf.sub_(c.values.to(buf.dtype))
        else:
            # buf[idx] -= sent; equals 0 for float32 values, the rounding error for fp16
            buf.index_put_((c.indices,), -c.values.to(buf.dtype), accumulate=True)

    def state_dict(self) -> dict[str, dict[Hashable, torch.Tensor]]:
        return {"residuals": self.buffers}

    def load_state_dict(self, sd: Mapping[str, Mapping[Hashable, torch.Tensor]]) -> None:
        """Residuals by this process's bucket keys (a bucket that no longer matches starts
        from zero); ``used`` is cleared: the next sweep must not free them."""
        self.buffers = {k: b.clone() for k, b in sd.get("residuals", {}).items()}
        self.used = set()
        self.pending.clear()  # what the state before the load carried over is not this one's
