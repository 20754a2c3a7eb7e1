"""What :meth:`bench.comm.state.CommHookState.state_dict` holds, and loading it back.

Bucket state is keyed by the bucket's index, size and first and last parameter (the
hooks' own key, ``hooks._bucket_key``) with the parameters named: ids differ between
processes, names do not.  The layout of the buckets goes with it, so that a loading hook
can rebuild the buckets exactly (``layout.py``).  Everything here is a tensor, number,
string, list or dict, which ``torch.load(weights_only=True)`` reads.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from bench.comm.compressors import RandomKCompressor, ResidualMemory
from bench.comm.layout import BucketLayout, Layout, Replay

__all__ = ["load", "save"]

#: a bench.comm.state.CommHookState (not imported: that module imports this one)
CommHookState = Any

#: PowerSGDState slots that are neither its process group nor its numpy generator
_PSGD_SKIP = ("process_group", "rng")


def _procs_per_node(inner: Any) -> int:
    groups = getattr(getattr(inner, "comm", None), "groups", None)
    return groups.topo.procs_per_node if groups is not None and groups.intra is not None else 0


def _named_key(key: Hashable, names: Mapping[int, str]) -> dict[str, Any]:
    shard = isinstance(key, tuple) and len(key) == 2 and key[1] == "shard"
    index, numel, first, last = key[0] if shard else key  # type: ignore[index,misc]
    return {
        "index": int(index),
        "numel": int(numel),
        "first": names.get(first, ""),  # "": a bucket without parameters (id 0)
        "last": names.get(last, ""),
        "shard": shard,
    }


def _local_key(d: Mapping[str, Any], params: Mapping[str, torch.Tensor]) -> Hashable:
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


def save(st: CommHookState) -> dict[str, Any]:
    inner, pg = st.inner, st.process_group
    layout = st._replay.layout if st._replay is not None else st._layout
    out: dict[str, Any] = {
        "version": 1,
        "hook": st.name,
        "world_size": dist.get_world_size(pg),
        "rank": dist.get_rank(pg),
        "procs_per_node": _procs_per_node(inner),
        "step": int(inner.step),
        "density": float(inner.density),
        "force_dense": bool(inner.force_dense),
        "layout": [b.to_dict() for b in layout],
        "residuals": [],
        "generators": {},
        "powersgd": None,
    }
    mem = getattr(getattr(inner, "comm", None), "memory", None)
    if isinstance(mem, ResidualMemory) and mem.buffers:
        names = _names(st, "saving residuals")
        out["residuals"] = [
            {**_named_key(k, names), "value": b.detach().clone()} for k, b in mem.buffers.items()
        ]
    comp = getattr(getattr(inner, "comm", None), "compressor", None)
    if comp is not None:
        out["generators"] = randomk_generators(comp)
    ps = getattr(inner, "psgd", None)
    if ps is not None:
        if ps.error_dict or ps.p_memory_dict:
            _names(st, "saving PowerSGD's memories")  # their layout must be known
        d = {s: getattr(ps, s) for s in ps.__slots__ if s not in _PSGD_SKIP}
        for k in ("error_dict", "p_memory_dict", "q_memory_dict"):
            d[k] = {int(i): t.detach().clone() for i, t in d[k].items()}
        d["rng"] = numpy_rng_state(ps.rng)
        out["powersgd"] = d
    return out


def _fits(layout: Layout, params: Mapping[str, torch.Tensor]) -> str | None:
    """Why the saved buckets cannot be rebuilt from this model's parameters (None: they can)."""
    saved = {n: s for b in layout for n, s in zip(b.names, b.shapes, strict=True)}
    trainable = {n: tuple(p.shape) for n, p in params.items() if p.requires_grad}
    if set(saved) != set(trainable):
        diff = sorted(set(saved) ^ set(trainable))
        return f"the model's trainable parameters are not the saved ones ({diff[:4]} ...)"
    bad = [n for n, s in saved.items() if s != trainable[n]]
    return f"parameters of another shape ({bad[:4]} ...)" if bad else None


def _positional(sd: Mapping[str, Any]) -> int:
    """Elements of the saved state that only make sense in the saved buckets."""
    n = sum(r["value"].numel() for r in sd["residuals"])
    ps = sd.get("powersgd") or {}
    return n + sum(t.numel() for t in (ps.get("error_dict") or {}).values())


def load(st: CommHookState, sd: Mapping[str, Any]) -> None:
    inner = st.inner
    for k in ("step", "density", "force_dense"):
        setattr(inner, k, type(getattr(inner, k))(sd[k]))
    if hasattr(inner, "step_started"):
        inner.step_started = False
        inner.finite = []
    layout = [BucketLayout.from_dict(b) for b in sd["layout"]]
    st._layout, st._step_layout, st._replay = [], [], None
    residuals = list(sd["residuals"])
    psgd = sd.get("powersgd")
    if _positional(sd):
        _names(st, "loading bucket state")
    params = st._params or {}
    why = _fits(layout, params) if layout else "no bucket layout was saved"
    if why is not None and _positional(sd):
        st._discard(_positional(sd), f"{why}: its buckets cannot be rebuilt")
        residuals = []
        if psgd is not None:
            psgd = {**psgd, "error_dict": {}, "p_memory_dict": {}, "q_memory_dict": {}}
    elif why is None:
        st._replay = Replay(layout, params, st._reduce)
    mem = getattr(getattr(inner, "comm", None), "memory", None)
    ppn = _procs_per_node(inner)
    shards = [r for r in residuals if r["shard"]]
    if shards and int(sd["procs_per_node"]) != ppn:
        n = sum(r["value"].numel() for r in shards)
        st._discard(n, f"hitopk shards of {sd['procs_per_node']} workers per node, now {ppn}")
        residuals = [r for r in residuals if not r["shard"]]
    if isinstance(mem, ResidualMemory):
        items = [
            (_local_key(r, params), r["value"].to(params[r["first"] or r["last"]].device))
            for r in residuals
        ]
        mem.load_state_dict(items)
    elif residuals:
        st._discard(sum(r["value"].numel() for r in residuals), "this hook has no error feedback")
    comp = getattr(getattr(inner, "comm", None), "compressor", None)
    if comp is not None and sd.get("generators"):
        set_randomk_generators(comp, sd["generators"])
    ps = getattr(inner, "psgd", None)
    if ps is not None and psgd is not None:
        for k, v in psgd.items():
            if k in ("error_dict", "p_memory_dict", "q_memory_dict"):
                v = {int(i): t.clone() for i, t in v.items()}
            if k != "rng":
                setattr(ps, k, v)
        set_numpy_rng_state(ps.rng, psgd["rng"])
        inner.last = None  # no bucket of this process is in flight


def numpy_rng_state(rng: np.random.RandomState) -> list[Any]:
    """A numpy generator's state as tensors and numbers (``weights_only`` loads it)."""
    name, keys, pos, has_gauss, cached = rng.get_state()
    return [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached]


def set_numpy_rng_state(rng: np.random.RandomState, st: list[Any]) -> None:
    name, keys, pos, has_gauss, cached = st
    rng.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), cached))


def randomk_generators(comp: Any) -> dict[str, torch.Tensor]:
    if not isinstance(comp, RandomKCompressor):
        return {}
    return {str(dev): g.get_state() for dev, g in comp._generators.items()}


def set_randomk_generators(comp: Any, states: Mapping[str, torch.Tensor]) -> None:
    if not isinstance(comp, RandomKCompressor) or comp.seed is None:
        return
    for dev, st in states.items():
        gen = torch.Generator(device=torch.device(dev)).manual_seed(comp.seed)
        gen.set_state(st.cpu())
        comp._generators[torch.device(dev)] = gen
