"""The public state of a communication hook, made before the process group (it binds on
the hook's first call) and saved with its per-bucket tensors keyed by parameter names and
the bucket layout, so a resume continues bit for bit; and :class:`Stateful`.
"""

import warnings
from collections.abc import Callable, Hashable, Mapping
from dataclasses import asdict
from typing import Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist

from bench.comm.layout import BucketLayout, Layout, Replay, describe
from bench.registry import ConfigError

VERSION = 2  # 2: the hook's own state_dict, its per-bucket tensors under ``buckets``


@runtime_checkable
class Stateful(Protocol):
    """All a checkpoint calls: torch's ``Stateful`` (whose package takes a second to
    import).  An object without it is refused where it is attached (:func:`stateful`)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def stateful(obj: Any, what: str) -> Any:
    """``obj``, or ConfigError in one line if it is not :class:`Stateful`."""
    if not isinstance(obj, Stateful):
        raise ConfigError(
            f"{what} {type(obj).__name__} has no state_dict()/load_state_dict(): a checkpoint "
            "could not save it, so it is refused"
        )
    return obj


#: attributes of the state itself; any other goes to the bound hook's state
_OWN = frozenset({"name", "options", "build", "process_group", "inner", "hook"})
#: (name, options, process group) -> the bound hook's (state, hook)
Build = Callable[[str, Any, Any], tuple[Any, Callable]]


class CommHookState:
    """The state of :func:`comm_hook`.  The bound hook's state's attributes (``density``,
    ``step``, ``stats``...) read and write through; those set before binding wait for it."""

    def __init__(
        self,
        name: str,
        options: Any,
        build: Build,
        process_group: Any = None,
        model: torch.nn.Module | None = None,
    ) -> None:
        # ``options`` and ``build`` come from make_hook: hooks.py imports this module
        self.name, self.options, self.build = name, options, build
        self.process_group = process_group
        self.inner: Any = None  # the bound hook's own state
        self.hook: Callable | None = None  # the bound hook's own function
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

    @property
    def bound(self) -> bool:
        return self.inner is not None

    def bind(self, process_group: Any = None) -> "CommHookState":
        """Bind to ``process_group`` (make_hook's, else the world) now, on every rank."""
        if self.inner is not None:
            return self
        if not dist.is_initialized():
            raise RuntimeError("bind() needs torch.distributed.init_process_group first")
        pg = process_group if process_group is not None else self.process_group
        inner, fn = self.build(self.name, self.options, pg)
        stateful(inner, f"comm={self.name}: its hook state")
        self.process_group, self.inner, self.hook = pg, inner, fn
        preset, self._preset = self._preset, {}
        if self._loaded is not None:
            loaded, self._loaded = self._loaded, None
            self.load_state_dict(loaded)
        for k, v in preset.items():  # set after the load: they win over the loaded ones
            setattr(inner, k, v)
        return self

    def set_model(self, model: torch.nn.Module) -> None:
        """The model (or its DDP module) whose parameter names key the saved state."""
        while isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module  # its names have no ``module.``
        self._params = dict(model.named_parameters())
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
        """Residual elements given up (each with a warning) since this state was made."""
        return self._discarded + (int(self.inner.discarded) if self.inner is not None else 0)

    def state_dict(self) -> dict[str, Any]:
        if self.inner is None:  # what was loaded, and the attributes set since
            out = dict(self._loaded or {"version": VERSION, "hook": self.name})
            return {**out, **self._scalars({**out, **self._preset})}
        return _save(self)

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (before binding: applied when it binds)."""
        if sd.get("hook") != self.name:
            raise ValueError(f"hook state of {sd.get('hook')!r} loaded into a {self.name!r} hook")
        if int(sd.get("version", 0)) != VERSION:
            raise ValueError(f"hook state version {sd.get('version')}, this code reads {VERSION}")
        if self.inner is None:
            self._loaded = sd
            return
        _load(self, sd)

    def _scalars(self, src: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "step": int(src.get("step", 0)),
            "density": float(src.get("density", self.options.density)),
            "force_dense": bool(src.get("force_dense", False)),
        }

    def __getstate__(self) -> dict[str, Any]:
        # the options and the builder pickle by reference to their module-level classes
        return dict(name=self.name, options=self.options, build=self.build, state=self.state_dict())

    def __setstate__(self, d: Mapping[str, Any]) -> None:
        self.__init__(d["name"], d["options"], d["build"])
        self.load_state_dict(d["state"])

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in asdict(self.options).items())
        return f"CommHookState({self.name!r}, {opts}, bound={self.bound})"


def _named_key(key: Hashable, names: Mapping[int, str]) -> dict[str, Any]:
    """A bucket key (a hitopk shard's, PowerSGD's bare index) by parameter names."""
    if isinstance(key, int):
        return {"index": key}
    shard = isinstance(key, tuple) and len(key) == 2 and key[1] == "shard"
    index, numel, first, last = key[0] if shard else key  # type: ignore[index,misc]
    first, last = names.get(first, ""), names.get(last, "")  # "": no parameters (id 0)
    return dict(index=int(index), numel=int(numel), first=first, last=last, shard=shard)


def _local_key(d: Mapping[str, Any], params: Mapping[str, torch.Tensor]) -> Hashable:
    if "numel" not in d:
        return int(d["index"])

    def pid(name: str) -> int:
        return id(params[name]) if name else 0

    key = (d["index"], d["numel"], pid(d["first"]), pid(d["last"]))
    return (key, "shard") if d["shard"] else key


def _names(st: CommHookState, what: str) -> dict[int, str]:
    if st._params is None:
        raise ValueError(
            f"{what} needs the model's parameter names: make_hook(..., model=model) or "
            "state.set_model(model)"
        )
    return {id(p): n for n, p in st._params.items()}


def _save(st: CommHookState) -> dict[str, Any]:
    """The bound hook's ``state_dict``, its ``buckets`` ({kind: {key: tensor}}) keyed by
    parameter names, with the hook's name, rank and the bucket layout."""
    pg = st.process_group
    layout = st._replay.layout if st._replay is not None else st._layout
    own = dict(st.inner.state_dict())
    buckets = own.pop("buckets", {})
    names = _names(st, "saving per-bucket state") if any(buckets.values()) else {}
    return {
        "version": VERSION,
        "hook": st.name,
        "world_size": dist.get_world_size(pg),
        "rank": dist.get_rank(pg),
        "layout": [b.to_dict() for b in layout],
        **own,
        "buckets": {
            kind: [{**_named_key(k, names), "value": t.detach().clone()} for k, t in m.items()]
            for kind, m in buckets.items()
        },
    }


def _fits(layout: Layout, params: Mapping[str, torch.Tensor]) -> str | None:
    """Why the saved buckets cannot be rebuilt from this model's parameters (None: they can)."""
    saved = {n: s for b in layout for n, s in zip(b.names, b.shapes, strict=True)}
    trainable = {n: tuple(p.shape) for n, p in params.items() if p.requires_grad}
    if set(saved) != set(trainable):
        diff = sorted(set(saved) ^ set(trainable))
        return f"the model's trainable parameters are not the saved ones ({diff[:4]} ...)"
    bad = [n for n, s in saved.items() if s != trainable[n]]
    return f"parameters of another shape ({bad[:4]} ...)" if bad else None


def _load(st: CommHookState, sd: Mapping[str, Any]) -> None:
    """The inverse of :func:`_save`: the saved buckets are replayed until DDP's are those,
    or their tensors dropped with a warning when they cannot be rebuilt."""
    layout = [BucketLayout.from_dict(b) for b in sd["layout"]]
    st._layout, st._step_layout, st._replay = [], [], None
    saved = {kind: list(entries) for kind, entries in sd["buckets"].items()}
    numel = sum(e["value"].numel() for entries in saved.values() for e in entries)
    if numel:
        _names(st, "loading per-bucket state")
    params = st._params or {}
    why = _fits(layout, params) if layout else "no bucket layout was saved"
    if why is not None and numel:
        st._discarded += numel
        msg = f"hook state: discarded {numel} saved elements ({why}: its buckets cannot be rebuilt)"
        warnings.warn(msg, RuntimeWarning, 2)
        saved = {kind: [] for kind in saved}
    elif why is None:
        st._replay = Replay(layout, params, st._reduce)

    def value(e: Mapping[str, Any]) -> torch.Tensor:
        at = e.get("first") or e.get("last")
        return e["value"].to(params[at].device) if at else e["value"]

    buckets = {k: {_local_key(e, params): value(e) for e in v} for k, v in saved.items()}
    st.inner.load_state_dict({**sd, "buckets": buckets})


def comm_hook(state: CommHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP communication hook of every name: binds ``state`` on its first call."""
    return state(bucket)
