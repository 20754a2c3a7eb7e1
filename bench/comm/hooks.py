"""DDP communication hooks built from compressor + memory + communicator.

Usable by any PyTorch DDP user::

    from bench.comm import make_hook
    state, hook = make_hook("hitopk", density=0.001, warmup_steps=100)
    ddp_model.register_comm_hook(state, hook)

``make_hook`` must be called on every rank in the same order after
``torch.distributed.init_process_group`` (``hitopk`` creates its process groups there).
Names (``HOOKS``): ``dense``, ``fp16``, ``bf16`` (dense allreduce of cast values, as
``default_hooks.fp16_compress_hook``; no error feedback), ``topk``, ``mstopk``, ``randomk``
(flat sparse allgather), ``hitopk`` (hierarchical; its selector is ``mstopk`` unless
``selector=`` says otherwise) and ``powersgd`` (PyTorch's own
``ddp_comm_hooks.powerSGD_hook``, wrapped only to count bytes and time).

The hook's per-step statistics are in ``state.stats`` (:class:`CommStats`).  Buckets with
fewer than ``min_numel`` elements, and every bucket during the first ``warmup_steps`` steps
or while ``state.force_dense`` is set, go through the dense allreduce.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from bench.comm.communicators import COMMUNICATORS, AllReduce, CommStats, Communicator
from bench.comm.compressors import NoMemory, build_compressor, build_memory
from bench.comm.selection import MSTOPK_METHODS, SELECTORS
from bench.comm.topology import check_topology, detect, groups
from bench.registry import ConfigError, Registry

#: hook name -> (compressor name or None for hitopk/powersgd, communicator name)
HOOKS: Registry = Registry("comm")

for _name, _spec in {
    "dense": ("dense", "allreduce"),
    "fp16": ("fp16", "allreduce"),
    "bf16": ("bf16", "allreduce"),
    "topk": ("topk", "allgather"),
    "mstopk": ("mstopk", "allgather"),
    "randomk": ("randomk", "allgather"),
    "hitopk": (None, "hitopk"),
    "powersgd": (None, "powersgd"),
}.items():
    HOOKS.register(_name)(_spec)

HookFn = Callable[[Any, dist.GradBucket], torch.futures.Future]


@dataclass
class HookState:
    """Everything a hook needs between calls; the training controller adjusts it."""

    comm: Communicator
    dense: Communicator
    density: float = 0.01
    warmup_steps: int = 0
    min_numel: int = 16384
    force_dense: bool = False
    step: int = 0
    stats: CommStats = field(default_factory=CommStats)


def _bucket_key(bucket: dist.GradBucket) -> tuple:
    # DDP rebuilds its buckets after the first step: the index alone may then name another
    # set of parameters, so the residual is keyed by the parameters it covers too.
    params = bucket.parameters()
    return (
        bucket.index(),
        bucket.buffer().numel(),
        id(params[0]) if params else 0,
        id(params[-1]) if params else 0,
    )


def sparse_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP hook of every name but ``powersgd``: dispatch one bucket to a communicator."""
    buf = bucket.buffer()
    dense = state.force_dense or state.step < state.warmup_steps or buf.numel() < state.min_numel
    comm = state.dense if dense else state.comm
    fut = comm.reduce(buf, _bucket_key(bucket), state.density, state.stats)
    if bucket.is_last():
        state.step += 1
        state.stats.steps += 1
    return fut


@dataclass
class PowerSGDHookState:
    psgd: Any  # torch's PowerSGDState
    stats: CommStats = field(default_factory=CommStats)
    step: int = 0
    density: float = 1.0  # unused; the controller may set it
    force_dense: bool = False  # unused: PowerSGD's own start_powerSGD_iter is the warm-up
    serialize: bool = False  # wait for each bucket (needed on gloo, see powersgd_hook)
    multinode: bool = False  # count the allreduce bytes as inter-node


def powersgd_hook(
    state: PowerSGDHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """PyTorch's PowerSGD hook, counting the elements it allreduces and its time."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

    ps = state.psgd
    buf = bucket.buffer()
    w = dist.get_world_size(ps.process_group)
    before, compressing = ps.total_numel_after_compression, ps.iter >= ps.start_powerSGD_iter
    t0 = time.perf_counter()
    fut = powerSGD_hook(ps, bucket)
    # before start_powerSGD_iter it is a plain allreduce and the counters do not move
    sent = ps.total_numel_after_compression - before if compressing else buf.numel()
    nbytes = 2.0 * (w - 1) / w * sent * buf.element_size()
    st = state.stats
    st.bytes += nbytes
    st.inter_bytes += nbytes if state.multinode else 0.0
    st.sent += sent
    st.numel += buf.numel()
    if bucket.is_last():
        state.step += 1
        st.steps += 1

    if state.serialize:
        # gloo: PowerSGD issues its P/Q allreduces from future callbacks, which run in
        # different orders on different ranks once several buckets are in flight (gloo
        # then aborts with "collective mismatch"); finishing each bucket first keeps order.
        out = fut.wait()
        st.comm_s += time.perf_counter() - t0
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(out)
        return done

    def finish(f: torch.futures.Future) -> torch.Tensor:
        st.comm_s += time.perf_counter() - t0
        return f.value()

    return fut.then(finish)


def check_options(
    name: str,
    *,
    density: float = 0.01,
    value_dtype: str = "float32",
    selector: str = "mstopk",
    mstopk_method: str = "tiled",
    min_numel: int = 16384,
    warmup_steps: int = 0,
    powersgd_rank: int = 4,
) -> None:
    """Raise ConfigError for anything ``make_hook`` would refuse (no distributed calls)."""
    HOOKS.get(name)
    if not 0.0 < float(density) <= 1.0:
        raise ConfigError(f"comm density must be in (0, 1], got {density}")
    from bench.comm.compressors import value_dtype as _vd

    _vd(value_dtype)
    if selector not in ("topk", "mstopk", "randomk"):
        SELECTORS.get(selector)
        raise ConfigError(f"hitopk selector must be topk, mstopk or randomk, got {selector!r}")
    if mstopk_method not in MSTOPK_METHODS:
        raise ConfigError(
            f"unknown mstopk method {mstopk_method!r}; choose one of {MSTOPK_METHODS}"
        )
    if min_numel < 0 or warmup_steps < 0:
        raise ConfigError("min_numel and warmup_steps must be >= 0")
    if powersgd_rank < 1:
        raise ConfigError(f"powersgd rank must be >= 1, got {powersgd_rank}")


def make_hook(
    name: str,
    *,
    density: float = 0.01,
    error_feedback: bool = True,
    warmup_steps: int = 0,
    min_numel: int = 16384,
    value_dtype: str = "float32",
    selector: str = "mstopk",
    mstopk_method: str = "tiled",
    procs_per_node: int = 0,
    process_group: Any = None,
    powersgd_rank: int = 4,
    seed: int | None = None,
) -> tuple[Any, HookFn]:
    """Build ``(state, hook)`` for ``ddp_model.register_comm_hook(state, hook)``.

    Args:
        name: ``dense``, ``fp16``, ``bf16``, ``topk``, ``mstopk``, ``randomk``, ``hitopk`` or
            ``powersgd``.
        density: fraction of each bucket's elements sent, in (0, 1] (top-k family).
        error_feedback: keep what is not sent and add it to the next step (top-k family and
            PowerSGD).
        warmup_steps: dense steps before compression starts (PowerSGD: its
            ``start_powerSGD_iter``, at least 2).
        min_numel: buckets with fewer elements use the dense allreduce.
        value_dtype: ``float32``, ``float16`` or ``bfloat16`` values on the wire (sparse).
        selector: top-k selector of ``hitopk``: ``mstopk`` (default), ``topk``, ``randomk``.
        mstopk_method: ``tiled``, ``sampled``, ``hist`` or ``paper`` (see ``selection.py``).
        procs_per_node: workers per node for ``hitopk``; 0 = torchrun's ``LOCAL_WORLD_SIZE``.
        process_group: group to reduce over (default: world; not for ``hitopk``).
        powersgd_rank: PowerSGD's ``matrix_approximation_rank``.
        seed: RNG seed of ``randomk``.
    """
    check_options(
        name,
        density=density,
        value_dtype=value_dtype,
        selector=selector,
        mstopk_method=mstopk_method,
        min_numel=min_numel,
        warmup_steps=warmup_steps,
        powersgd_rank=powersgd_rank,
    )
    if not dist.is_initialized():
        raise ConfigError("make_hook needs torch.distributed to be initialised first")
    compressor_name, comm_name = HOOKS.get(name)
    world = dist.get_world_size(process_group)
    rank = dist.get_rank(process_group)
    topo_groups = None
    if comm_name == "hitopk" or procs_per_node > 0 or process_group is None:
        try:
            topo = detect(world, rank, procs_per_node)
        except ConfigError:
            if comm_name == "hitopk":
                raise
            topo = detect(world, rank, world)  # unknown layout: count bytes as one node
        if comm_name == "hitopk":
            check_topology(world, topo.procs_per_node)
            if topo.nnodes < 2:
                raise ConfigError(
                    "hitopk needs at least 2 nodes (it saves inter-node traffic only); on one "
                    "node use comm=mstopk, or set procs_per_node=1 to treat each worker as a node"
                )
            topo_groups = groups(topo)
        else:
            from bench.comm.topology import Groups

            topo_groups = Groups(topo, None, None)  # byte accounting only: no new groups
    multinode = topo_groups is not None and topo_groups.topo.nnodes > 1

    if comm_name == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

        ps = PowerSGDState(
            process_group=process_group,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=max(2, warmup_steps),  # PowerSGD needs >= 2 with EF
            min_compression_rate=2,
            use_error_feedback=error_feedback,
            warm_start=True,
            random_seed=0 if seed is None else seed,
        )
        backend = dist.get_backend(process_group)
        pstate = PowerSGDHookState(ps, serialize=backend == "gloo", multinode=multinode)
        return pstate, powersgd_hook

    sel_opts: dict[str, Any] = {}
    if compressor_name is None:  # hitopk: its selector is an option
        compressor_name = selector
    if compressor_name == "mstopk":
        sel_opts["method"] = mstopk_method
    if compressor_name == "randomk" and seed is not None:
        sel_opts["seed"] = seed
    if compressor_name in ("dense", "fp16", "bf16"):
        compressor = build_compressor(compressor_name)
        memory = NoMemory()  # dense values alias the bucket; cast hooks follow PyTorch's
    else:
        compressor = build_compressor(compressor_name, value_dtype=value_dtype, **sel_opts)
        memory = build_memory(error_feedback)
    comm = COMMUNICATORS.get(comm_name)(compressor, memory, topo_groups, process_group, value_dtype)
    dense = AllReduce(build_compressor("dense"), NoMemory(), topo_groups, process_group)
    state = HookState(comm, dense, float(density), int(warmup_steps), int(min_numel))
    return state, sparse_hook
