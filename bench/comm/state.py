"""The public state of a communication hook: made before the process group, saved and
restored by parameter name.

:func:`bench.comm.make_hook` returns a :class:`CommHookState` and :func:`comm_hook`::

    state, hook = make_hook("hitopk", density=0.01, model=model)  # before or after
    ddp = DDP(model); ddp.register_comm_hook(state, hook)           # init_process_group
    torch.save({"hook": state.state_dict(), ...}, f"ckpt-rank{rank}.pt")
    ...
    state.load_state_dict(torch.load(f"ckpt-rank{rank}.pt")["hook"])

**Binding.**  Made before ``init_process_group``, the state holds only its options; it
binds to the process group on the hook's first call, or on :meth:`CommHookState.bind`
(the topology of ``hitopk`` is ``procs_per_node`` or read from torchrun's environment
then).  Every rank must bind in the same order, as every rank calls the hook.

**What is saved** (:meth:`CommHookState.state_dict`, this rank's; every rank saves and
loads its own): the step counter, density and dense flag (the schedule position), the
error-feedback residuals, randomk's generator, PowerSGD's state (its error, P and Q
memories, iteration and generator) and the bucket layout they belong to, each bucket as
parameter names, offsets and shapes.  Everything is a tensor, number, string, list or
dict: ``torch.load(weights_only=True)`` reads it.  Pickling saves the same (and the
options); an unpickled state binds like a new one and needs :meth:`set_model` before it
reduces.

**Loading into another layout.**  DDP's first step after a restart reduces buckets in
parameter order, before it rebuilds them; a bucket size or model wrapping may differ too.
The loaded state is not matched against those buckets: the hook regroups DDP's gradients
into the saved buckets and reduces those (:class:`bench.comm.layout.Replay`), so a resume
continues bit for bit like the uninterrupted run, and once DDP's own buckets are the
saved ones, they go through as they are.  Under another ``bucket_cap_mb`` they never are:
the hook keeps reducing in the saved layout, at the cost of copying each gradient into it
and back (a state that loads nothing takes DDP's layout).  If the model's trainable
parameters are not the saved ones (names or shapes), the buckets cannot be rebuilt: the
saved residuals are discarded, counted in ``state.discarded`` with a warning, never
dropped silently.

**Another world size.**  Residuals and PowerSGD's error are each rank's own unsent
gradient: a rank loads its own and goes on (ranks beyond the saved world start from
zero; the residuals of saved ranks beyond the new world are lost with their files, which
the caller chooses not to load).  ``hitopk`` keeps each residual in the shard of a node
sum, whose size depends on the workers per node: with another ``procs_per_node`` those
residuals are discarded (counted, warned about).
"""

import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist

from bench.comm import state_io
from bench.comm.compressors import ResidualMemory
from bench.comm.layout import BucketLayout, Layout, Replay, describe

__all__ = ["CommHookState", "comm_hook"]

VERSION = 1
#: attributes of the state itself; any other goes to the bound hook's state
_OWN = frozenset({"name", "options", "build", "process_group", "inner", "hook"})
#: (name, options, process group) -> the bound hook's (state, hook): ``hooks.build``
Build = Callable[[str, Any, Any], tuple[Any, Callable]]


def _base(model: torch.nn.Module) -> torch.nn.Module:
    """The wrapped module of a DDP (or similar) wrapper: its names have no ``module.``."""
    while isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    return model


class CommHookState:
    """The state of :func:`comm_hook` (module docstring).  Attributes of the bound hook's
    state (``density``, ``force_dense``, ``step``, ``stats``, ``nan_check``, ...) read and
    write through; those set before binding are applied when it binds."""

    def __init__(
        self,
        name: str,
        options: Any,
        build: Build,
        process_group: Any = None,
        model: torch.nn.Module | None = None,
    ) -> None:
        # ``options`` (hooks.HookOptions) and ``build`` come from make_hook: this module
        # does not import hooks.py, which imports it
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "options", options)
        object.__setattr__(self, "build", build)
        object.__setattr__(self, "process_group", process_group)
        object.__setattr__(self, "inner", None)  # the bound hook's own state
        object.__setattr__(self, "hook", None)  # the bound hook's own function
        self._params: dict[str, torch.Tensor] | None = None
        self._preset: dict[str, Any] = {}  # attributes set before binding
        self._loaded: Mapping[str, Any] | None = None  # state loaded before binding
        self._replay: Replay | None = None
        self._cache: dict[tuple, BucketLayout] = {}
        self._step_layout: Layout = []  # buckets reduced so far in this step
        self._layout: Layout = []  # the buckets of the last whole step
        self._discarded = 0  # elements discarded outside the memory (load mismatches)
        if model is not None:
            self.set_model(model)

    # ---------------------------------------------------------------------------------
    # binding

    @property
    def bound(self) -> bool:
        return self.inner is not None

    def bind(self, process_group: Any = None) -> "CommHookState":
        """Bind to ``process_group`` (default: the one given to ``make_hook``, else the
        world) now; call on every rank after ``init_process_group``.  A no-op when bound."""
        if self.inner is not None:
            return self
        if not dist.is_initialized():
            raise RuntimeError("bind() needs torch.distributed.init_process_group first")
        pg = process_group if process_group is not None else self.process_group
        inner, fn = self.build(self.name, self.options, pg)
        object.__setattr__(self, "process_group", pg)
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "hook", fn)
        preset, self._preset = self._preset, {}
        if self._loaded is not None:
            loaded, self._loaded = self._loaded, None
            self.load_state_dict(loaded)
        for k, v in preset.items():  # set after the load: they win over the loaded ones
            setattr(inner, k, v)
        return self

    def set_model(self, model: torch.nn.Module) -> None:
        """The model (or its DDP module) whose parameter names key the saved state."""
        self._params = dict(_base(model).named_parameters())
        self._cache = {}

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):  # not set yet (unpickling): no lookup through the proxy
            raise AttributeError(key)
        inner = self.__dict__.get("inner")
        if inner is not None:
            return getattr(inner, key)
        preset = self.__dict__.get("_preset", {})
        if key in preset:
            return preset[key]
        scalars = self._scalars(self.__dict__.get("_loaded") or {})
        if key in scalars:
            return scalars[key]
        raise AttributeError(f"{key!r}: the hook state is not bound yet (bind())")

    def __setattr__(self, key: str, value: Any) -> None:
        if key.startswith("_") or key in _OWN:
            object.__setattr__(self, key, value)
        elif self.inner is not None:
            setattr(self.inner, key, value)
        else:
            self._preset[key] = value

    # ---------------------------------------------------------------------------------
    # the hook

    def __call__(self, bucket: Any) -> torch.futures.Future:
        if self.inner is None:
            self.bind()
        if self._replay is not None:
            fut = self._replay(bucket)
            if bucket.is_last() and self._replay.matched:
                self._replay = None  # DDP's buckets are the saved ones now
            return fut
        return self._reduce(bucket)

    def _reduce(self, bucket: Any) -> torch.futures.Future:
        """The bound hook on one bucket (DDP's or a replayed one), its layout noted."""
        lay = getattr(bucket, "lay", None)
        if lay is None and self._params is not None:
            lay = self._describe(bucket)
        if lay is not None:
            self._step_layout.append(lay)
            if bucket.is_last():
                self._layout, self._step_layout = self._step_layout, []
        return self.hook(self.inner, bucket)

    def _describe(self, bucket: Any) -> BucketLayout:
        params = bucket.parameters()
        key = (bucket.index(), bucket.buffer().numel(), *(id(p) for p in params[:1] + params[-1:]))
        lay = self._cache.get(key)
        if lay is None:
            assert self._params is not None
            names = {id(p): n for n, p in self._params.items()}
            lay = self._cache[key] = describe(bucket, names)
        return lay

    @property
    def discarded(self) -> int:
        """Residual elements given up (each with a warning), since this state was made."""
        mem = getattr(getattr(self.inner, "comm", None), "memory", None)
        return self._discarded + (mem.discarded if isinstance(mem, ResidualMemory) else 0)

    def _discard(self, numel: int, why: str) -> None:
        if numel:
            self._discarded += numel
            warnings.warn(
                f"hook state: discarded {numel} saved elements ({why})", RuntimeWarning, 3
            )

    # ---------------------------------------------------------------------------------
    # saving and loading

    def state_dict(self) -> dict[str, Any]:
        """This rank's state, keyed by parameter names (module docstring)."""
        if self.inner is None:  # what was loaded, and the attributes set since
            out = dict(self._loaded or {"version": VERSION, "hook": self.name})
            return {**out, **self._scalars({**out, **self._preset})}
        return state_io.save(self)

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (before binding: applied when it binds)."""
        if sd.get("hook") != self.name:
            raise ValueError(f"hook state of {sd.get('hook')!r} loaded into a {self.name!r} hook")
        if int(sd.get("version", 0)) != VERSION:
            raise ValueError(f"hook state version {sd.get('version')}, this code reads {VERSION}")
        if self.inner is None:
            self._loaded = sd
            return
        state_io.load(self, sd)

    def _scalars(self, src: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "step": int(src.get("step", 0)),
            "density": float(src.get("density", self.options.density)),
            "force_dense": bool(src.get("force_dense", False)),
        }

    def __getstate__(self) -> dict[str, Any]:
        # the options and the builder pickle by reference to their module-level classes
        return {
            "name": self.name,
            "options": self.options,
            "build": self.build,
            "state": self.state_dict(),
        }

    def __setstate__(self, d: Mapping[str, Any]) -> None:
        self.__init__(d["name"], d["options"], d["build"])
        self.load_state_dict(d["state"])

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in asdict(self.options).items())
        return f"CommHookState({self.name!r}, {opts}, bound={self.bound})"


def comm_hook(state: CommHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP communication hook of every name: binds ``state`` on its first call, then
    reduces the bucket with the hook of ``state.name`` (in the saved layout after a load)."""
    return state(bucket)
