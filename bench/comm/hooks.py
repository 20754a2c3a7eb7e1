"""DDP communication hooks built from compressor + memory + communicator.

Usable by any PyTorch DDP user::

    from bench.comm import make_hook
    state, hook = make_hook("hitopk", density=0.001, warmup_steps=100)
    ddp_model.register_comm_hook(state, hook)

``make_hook`` must be called on every rank in the same order; made before
``torch.distributed.init_process_group``, the state binds to the process group on the
hook's first call or on ``state.bind()`` (``hitopk`` creates its process groups then).
Saving and restoring the state: ``state.py``.
Names (``HOOKS``): ``dense``, ``fp16``, ``bf16`` (dense allreduce of cast values, as
``default_hooks.fp16_compress_hook``; no error feedback), ``topk``, ``mstopk``, ``randomk``
(flat sparse allgather), ``hitopk`` (hierarchical; its selector is ``mstopk`` unless
``selector=`` says otherwise) and ``powersgd`` (PyTorch's own
``ddp_comm_hooks.powerSGD_hook``, wrapped only to count bytes and time); ``nocomm``
returns each worker's local gradient and sends nothing: a measurement device (the
compute-only step of the scaling study, ``nocomm.py``), not a training method.

Each name is one :class:`HookSpec` in ``HOOKS``: its builder and the flags the launcher,
the training loop and the result records read (``is_sparse(name)``), so adding a method
touches this file only.

Every hook returns its future without waiting for a collective (``communicators.py``),
so DDP overlaps a bucket's communication with the backward pass of the next.  The hook's
per-step statistics are in ``state.stats`` (:class:`CommStats`; the times are defined in
``timing.py``; ``timing=False`` turns the CUDA events off).  Buckets with fewer than
``min_numel`` elements, and every bucket during the first ``warmup_steps`` steps or while
``state.force_dense`` is set, go through the dense allreduce.
"""

# No ``from __future__ import annotations``: DDP's register_comm_hook checks that the hook's
# ``bucket`` annotation *is* dist.GradBucket, which a string annotation is not.
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from bench.comm.communicators import COMMUNICATORS, AllReduce, Communicator, uses_gloo
from bench.comm.compressors import NoMemory, build_compressor, build_memory
from bench.comm.config import MSTopKMethod, Selector, ValueDtype, parse
from bench.comm.futures import Future, forward, new_future
from bench.comm.nocomm import build_nocomm
from bench.comm.state import CommHookState, comm_hook
from bench.comm.stats import CommStats, allreduce_traffic
from bench.comm.topology import Groups, Topology, check_hierarchical, detect, groups
from bench.registry import ConfigError, Registry

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
    step_started: bool = False  # a bucket of the current step has been handed over
    nan_check: bool = False  # flag each reduced bucket that holds a NaN or Inf
    # (bucket index, device bool "all finite") per reduced bucket, until the loop pops them
    finite: list[tuple[int, torch.Tensor]] = field(default_factory=list)

    def take_finite(self) -> list[tuple[int, torch.Tensor]]:
        """The device flags noted since the last call, unread: ``(bucket index, all finite)``
        of each reduced bucket (with ``nan_check``) and ``(-1, input finite)`` of each
        selection (always).  The loop reads them in one sync per step, off the hooks."""
        found, self.finite = self.finite, []
        return found + [(-1, f) for c in (self.comm, self.dense) for f in c.take_flags()]

    def check_finite(self) -> None:
        """Read every flag noted so far (one sync) and raise ValueError if one is false:
        where no per-step check runs (``nan_check`` off), at the end of an epoch."""
        found = self.take_finite()
        dev = found[0][1].device if found else None
        if found and not bool(torch.stack([ok.to(dev) for _, ok in found]).all()):
            raise ValueError("the tensor contains NaN or Inf: a gradient bucket of the comm hook")

    def fold_flags(self, keep: int = 64) -> None:
        """Past ``keep`` unread selection flags, AND them into one on the device (no sync):
        without a per-step reader the list would grow by one per sparse bucket and step."""
        for c in (self.comm, self.dense):
            if len(c.flags) > keep:
                flags = c.take_flags()
                c.flags.append(torch.stack([f.to(flags[0].device) for f in flags]).all())
            if len(c.exact) > keep:  # kept as "all exact" (inexact_count then says 0 or 1)
                exact, c.exact = c.exact, []
                c.exact.append(torch.stack([f.to(exact[0].device) for f in exact]).all())


def _check_finite(state: HookState, index: int, fut: torch.futures.Future) -> torch.Tensor:
    """The reduced (decompressed) bucket, its finiteness noted without a host sync."""
    out = fut.value()
    t = out[0] if isinstance(out, list) else out
    # the sum is NaN/Inf iff an element is (finite gradients never sum past fp32's range):
    # one pass without a temporary, ~30x cheaper than isfinite(t).all() on a CPU
    state.finite.append((index, torch.isfinite(t.sum())))
    return t


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
    if not state.step_started:  # every bucket of the step before has completed
        state.step_started = True
        # residuals of buckets the last step did not use (DDP rebuilt its buckets) go
        state.comm.memory.sweep()
        state.fold_flags()  # the last step's callbacks have all run: no append races this
    buf = bucket.buffer()
    dense = state.force_dense or state.step < state.warmup_steps or buf.numel() < state.min_numel
    comm = state.dense if dense else state.comm
    fut = comm.reduce(buf, _bucket_key(bucket), state.density, state.stats)
    if state.nan_check:
        fut = fut.then(functools.partial(_check_finite, state, bucket.index()))
    if bucket.is_last():
        state.step += 1
        state.stats.steps += 1
        state.step_started = False
    return fut


@dataclass
class PowerSGDHookState:
    psgd: Any  # torch's PowerSGDState
    stats: CommStats = field(default_factory=CommStats)
    step: int = 0
    density: float = 1.0  # unused; the controller may set it
    force_dense: bool = False  # unused: PowerSGD's own start_powerSGD_iter is the warm-up
    # start each bucket when the one before is done (gloo; see below); None: decided by the
    # first bucket's device (a "cpu:gloo,cuda:nccl" group sends CUDA buckets over NCCL)
    serialize: bool | None = False
    multinode: bool = False  # count the allreduce bytes as inter-node
    last: Future | None = None  # the future of the bucket before (serialize)


def _run_powersgd(state: PowerSGDHookState, bucket: dist.GradBucket) -> Future:
    """PyTorch's PowerSGD hook on one bucket, counting the elements it allreduces and its
    span (``timing.py``: all of it is ``comm_s``)."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

    ps, st = state.psgd, state.stats
    buf = bucket.buffer()
    w = dist.get_world_size(ps.process_group)
    before, compressing = ps.total_numel_after_compression, ps.iter >= ps.start_powerSGD_iter
    t0 = st.times.now(buf)
    fut = powerSGD_hook(ps, bucket)
    # before start_powerSGD_iter it is a plain allreduce and the counters do not move
    sent = ps.total_numel_after_compression - before if compressing else buf.numel()
    traffic = allreduce_traffic(sent * buf.element_size(), w, state.multinode)
    st.count(traffic, sent, buf.numel())

    def finish(f: Future) -> torch.Tensor:
        st.times.add_comm(t0, st.times.now(buf))
        return f.value()

    return fut.then(finish)


def powersgd_hook(state: PowerSGDHookState, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """PyTorch's PowerSGD hook, counted (:func:`_run_powersgd`); returns without waiting.

    On gloo, PowerSGD issues its P/Q allreduces from future callbacks, which run in
    different orders on different ranks once several buckets are in flight (gloo then
    aborts with "collective mismatch").  With ``serialize`` each bucket starts from the
    completion callback of the bucket before: one bucket in flight, in bucket order, and
    still no wait in the hook.
    """
    if bucket.is_last():
        state.step += 1
        state.stats.steps += 1
    if state.serialize is None:
        state.serialize = uses_gloo(state.psgd.process_group, bucket.buffer().device)
    if not state.serialize:
        return _run_powersgd(state, bucket)
    out = new_future(bucket.buffer())
    prev, state.last = state.last, out

    def start(_: Any = None) -> None:
        try:
            forward(_run_powersgd(state, bucket), out)
        except BaseException as e:  # the step fails with it instead of hanging DDP
            out.set_exception(e)

    if prev is None:
        start()
    else:
        prev.add_done_callback(start)
    return out


@dataclass(frozen=True)
class HookOptions:
    """``make_hook``'s options, converted to their types and checked on construction."""

    density: float = 0.01  # fraction of each bucket's elements sent, in (0, 1]
    error_feedback: bool = True
    warmup_steps: int = 0
    min_numel: int = 16384
    value_dtype: ValueDtype = ValueDtype.float32
    selector: Selector = Selector.mstopk
    mstopk_method: MSTopKMethod = MSTopKMethod.tiled
    procs_per_node: int = 0
    powersgd_rank: int = 4
    seed: int | None = None
    timing: bool = True  # time/select_s and time/comm_s of CUDA buckets (CUDA events)

    def __post_init__(self) -> None:
        # strings from Python callers become the enums (ConfigError listing the values)
        for name, kind, what in (
            ("value_dtype", ValueDtype, "value dtype"),
            ("selector", Selector, "selector"),
            ("mstopk_method", MSTopKMethod, "mstopk method"),
        ):
            object.__setattr__(self, name, parse(kind, getattr(self, name), what))
        if not 0.0 < float(self.density) <= 1.0:
            raise ConfigError(f"comm density must be in (0, 1], got {self.density}")
        if self.min_numel < 0 or self.warmup_steps < 0:
            raise ConfigError("min_numel and warmup_steps must be >= 0")
        if self.powersgd_rank < 1:
            raise ConfigError(f"powersgd rank must be >= 1, got {self.powersgd_rank}")


#: (options, node groups or None, process group) -> (state, hook)
Build = Callable[[HookOptions, Groups | None, Any], tuple[Any, HookFn]]
#: (options, world size, nodes) -> None, or ConfigError
Check = Callable[[HookOptions, int, int], None]


@dataclass(frozen=True)
class HookSpec:
    """One hook name: how to build it, and what the launcher, loop and records need to know."""

    name: str
    build: Build
    sparse: bool  # sends a `density` fraction of each bucket; False: the whole bucket (1.0)
    hierarchical: bool = False  # uses intra- and inter-node process groups (made by make_hook)
    own_warmup: bool = False  # counts its dense warm-up steps itself (``warmup_steps``)
    validate: Check | None = None  # checks of this method only, before launch and in make_hook
    # the tuning protocol's search space (bench.sweeps.protocol): trial label -> CommConfig
    # field values; one entry: nothing to tune.  Every tunable method declares as many
    # trials as the others (tests/test_protocol.py checks it).
    search_space: tuple[tuple[str, dict[str, Any]], ...] = (("default", {}),)
    # a measurement device, not a training method (``nocomm``): no sweep trains with it
    measurement: bool = False
    # a workload's own search space where the default's does not fit it (workload ->
    # trials, as many as the default's): the Transformer learns at density 0.05, not 0.01
    workload_spaces: Mapping[str, tuple[tuple[str, dict[str, Any]], ...]] = field(
        default_factory=dict
    )


#: hook name -> :class:`HookSpec`
HOOKS: Registry[HookSpec] = Registry("comm")


def is_sparse(name: str) -> bool:
    """Whether hook ``name`` sends a ``density`` fraction of each bucket (its records too)."""
    return HOOKS.get(name).sparse


def _reducer(compressor: str | None, communicator: str) -> Build:
    """Builder of ``(HookState, sparse_hook)``; ``compressor=None``: the ``selector`` option."""

    def build(opts: HookOptions, topo_groups: Groups | None, pg: Any) -> tuple[Any, HookFn]:
        comp = build_compressor(
            compressor or opts.selector, opts.value_dtype, opts.mstopk_method, opts.seed
        )
        # dense values alias the bucket, and the cast hooks follow PyTorch's: no feedback
        memory = build_memory(opts.error_feedback) if comp.sparse else NoMemory()
        comm = COMMUNICATORS.get(communicator)(comp, memory, topo_groups, pg, opts.value_dtype)
        dense = AllReduce(build_compressor("dense"), NoMemory(), topo_groups, pg)
        state = HookState(comm, dense, float(opts.density), opts.warmup_steps, opts.min_numel)
        state.stats.times.enabled = opts.timing
        return state, sparse_hook

    return build


def _build_powersgd(opts: HookOptions, topo_groups: Groups | None, pg: Any) -> tuple[Any, HookFn]:
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    ps = PowerSGDState(
        process_group=pg,
        matrix_approximation_rank=opts.powersgd_rank,
        start_powerSGD_iter=max(2, opts.warmup_steps),  # PowerSGD needs >= 2 with EF
        min_compression_rate=2,
        use_error_feedback=opts.error_feedback,
        warm_start=True,
        random_seed=0 if opts.seed is None else opts.seed,
    )
    multinode = topo_groups is not None and topo_groups.topo.nnodes > 1
    state = PowerSGDHookState(ps, serialize=None, multinode=multinode)
    state.stats.times.enabled = opts.timing
    return state, powersgd_hook


def _two_nodes(opts: HookOptions, world_size: int, nnodes: int) -> None:
    check_hierarchical(nnodes)


# the sparse methods' warm-up schedule: per-epoch densities after which the final density
# repeats (the schedule the committed sweeps used, ending at the trial's final density)
WARMUP_SCHEDULE = (0.1, 0.05, 0.03)


def _sparse_space(
    densities: tuple[float, ...] = (0.01, 0.001),
) -> tuple[tuple[str, dict[str, Any]], ...]:
    """density schedule {none, warm-up} x final density ``densities``: 4 trials.  The
    warm-up sends the schedule's densities above the final one, then the final one."""
    out = []
    for d in densities:
        warm = [*(x for x in WARMUP_SCHEDULE if x > d), d]
        out.append((f"d{d:g}", {"density": d, "density_schedule": []}))
        out.append((f"d{d:g}-warmup", {"density": d, "density_schedule": warm}))
    return tuple(out)


# the embedded Transformer (AdamW) barely learns at density 0.01 and learns at 0.05
# (docs/protocol.md): its trials are final density {0.05, 0.01} x {none, warm-up}
_SPARSE_WORKLOADS = {"translation": _sparse_space((0.05, 0.01))}


# PowerSGD: rank {4, 8} x start {step 2, after one dense epoch}.  One epoch is the "about
# 10 % of the steps to target" of torch's guidance on the embedded tasks (6-8 epochs to
# target on digits, 12-16 % of them); warmup_epochs x steps per epoch is its start step.
_POWERSGD_SPACE = tuple(
    (f"rank{r}-start{'1ep' if w else '2'}", {"powersgd_rank": r, "warmup_epochs": w})
    for r in (4, 8)
    for w in (0, 1)
)


for _spec in (
    HookSpec("dense", _reducer("dense", "allreduce"), sparse=False),
    HookSpec("fp16", _reducer("fp16", "allreduce"), sparse=False),
    HookSpec("bf16", _reducer("bf16", "allreduce"), sparse=False),
    # dense, fp16, bf16: nothing to tune that moves the trajectory (the bucket size changes
    # step time only, and the embedded models fit one 25 MB bucket): one trial
    *(
        HookSpec(
            n,
            _reducer(n, "allgather"),
            sparse=True,
            search_space=_sparse_space(),
            workload_spaces=_SPARSE_WORKLOADS,
        )
        for n in ("topk", "mstopk", "randomk")
    ),
    HookSpec(
        "hitopk",
        _reducer(None, "hitopk"),
        sparse=True,
        hierarchical=True,
        validate=_two_nodes,
        search_space=_sparse_space(),
        workload_spaces=_SPARSE_WORKLOADS,
    ),
    HookSpec(
        "powersgd", _build_powersgd, sparse=False, own_warmup=True, search_space=_POWERSGD_SPACE
    ),
    # the compute-only step of the scaling study (bench/comm/nocomm.py): nothing is sent
    HookSpec("nocomm", build_nocomm, sparse=False, measurement=True),
):
    HOOKS.register(_spec.name)(_spec)


def _topology(spec: HookSpec, opts: HookOptions, process_group: Any) -> Topology | None:
    """This rank's node layout, or None on a sub-group without ``procs_per_node``."""
    if not (spec.hierarchical or opts.procs_per_node > 0 or process_group is None):
        return None
    world = dist.get_world_size(process_group)
    rank = dist.get_rank(process_group)
    try:
        return detect(world, rank, opts.procs_per_node)
    except ConfigError:
        if spec.hierarchical:
            raise
        return detect(world, rank, world)  # unknown layout: count bytes as one node


def make_hook(
    name: str,
    *,
    density: float = 0.01,
    error_feedback: bool = True,
    warmup_steps: int = 0,
    min_numel: int = 16384,
    value_dtype: ValueDtype | str = ValueDtype.float32,
    selector: Selector | str = Selector.mstopk,
    mstopk_method: MSTopKMethod | str = MSTopKMethod.tiled,
    procs_per_node: int = 0,
    process_group: Any = None,
    powersgd_rank: int = 4,
    seed: int | None = None,
    timing: bool = True,
    model: torch.nn.Module | None = None,
) -> tuple[CommHookState, HookFn]:
    """Build ``(state, hook)`` for ``ddp_model.register_comm_hook(state, hook)``.

    The state is a :class:`~bench.comm.state.CommHookState`: it may be made before
    ``init_process_group`` (it binds on the hook's first call, or on ``state.bind()``),
    and ``state.state_dict()`` / ``load_state_dict()`` / pickling save and restore it
    keyed by the names of ``model``'s parameters.

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
        timing: record CUDA events for the times of CUDA buckets (``timing.py``); CPU
            buckets are always timed (the host clock costs nothing).
        model: the model (or its DDP module) whose parameter names key the saved state
            (or ``state.set_model(model)`` later); needed to save or load bucket state.
    Raises:
        ConfigError: an unknown name or option value (naming the allowed ones), or a
            topology the method cannot use.
    """
    HOOKS.get(name)  # an unknown name fails here, listing the known ones
    opts = HookOptions(
        density=density,
        error_feedback=error_feedback,
        warmup_steps=warmup_steps,
        min_numel=min_numel,
        value_dtype=value_dtype,  # a str becomes the enum (HookOptions.__post_init__)
        selector=selector,
        mstopk_method=mstopk_method,
        procs_per_node=procs_per_node,
        powersgd_rank=powersgd_rank,
        seed=seed,
        timing=timing,
    )
    state = CommHookState(name, opts, build, process_group=process_group, model=model)
    if dist.is_initialized():  # otherwise it binds on the hook's first call (or bind())
        state.bind()
    return state, comm_hook


def build(name: str, opts: HookOptions, process_group: Any = None) -> tuple[Any, HookFn]:
    """The inner ``(state, hook)`` of ``name`` on the initialised process group (what a
    :class:`~bench.comm.state.CommHookState` holds once bound)."""
    spec = HOOKS.get(name)
    topo = _topology(spec, opts, process_group)
    if spec.validate is not None:
        spec.validate(opts, dist.get_world_size(process_group), topo.nnodes if topo else 1)
    topo_groups = None
    if topo is not None:  # hierarchical: new process groups; others: byte accounting only
        topo_groups = groups(topo) if spec.hierarchical else Groups(topo, None, None)
    return spec.build(opts, topo_groups, process_group)
