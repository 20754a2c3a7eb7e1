"""DDP communication hooks: compressor + memory + communicator, by name (``HOOKS``).

``make_hook(name, **options)`` gives ``(state, hook)`` for ``register_comm_hook``; the
options are :class:`~bench.comm.config.HookOptions`.  Each name is one :class:`HookSpec`:
its builder and the flags the launcher, the loop and the records read.  ``powersgd`` wraps
PyTorch's own ``powerSGD_hook``; ``nocomm`` sends nothing (the scaling study's
compute-only step).  The design is in docs/internals/comm.md.
"""

# No ``from __future__ import annotations``: DDP's register_comm_hook checks that the hook's
# ``bucket`` annotation *is* dist.GradBucket, which a string annotation is not.
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from bench.comm import cost, placement
from bench.comm.communicators import AllGather, AllReduce, Communicator, HiTopK, uses_gloo
from bench.comm.compressors import COMPRESSORS, NoCompressor, NoMemory, ResidualMemory
from bench.comm.config import HookOptions
from bench.comm.futures import Future, done, forward, new_future
from bench.comm.state import CommHookState, comm_hook
from bench.comm.stats import CommStats, ring
from bench.comm.topology import Groups, Topology, check_hierarchical, detect, groups
from bench.registry import ConfigError, Registry

HookFn = Callable[[Any, dist.GradBucket], torch.futures.Future]


class _Counters:
    """The state every hook state saves: its step counter and the schedule's position
    (density, dense flag); the controller reads and sets them each step."""

    step: int
    density: float
    force_dense: bool

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "density": self.density, "force_dense": self.force_dense}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.step, self.density = int(sd["step"]), float(sd["density"])
        self.force_dense = bool(sd["force_dense"])


@dataclass
class HookState(_Counters):
    """Everything a hook needs between calls; the training controller adjusts it."""

    comm: Communicator
    dense: Communicator
    density: float = 0.01
    warmup_steps: int = 0
    min_numel: int = cost.MIN_NUMEL
    force_dense: bool = False
    step: int = 0
    stats: CommStats = field(default_factory=CommStats)
    step_started: bool = False  # a bucket of the current step has been handed over
    nan_check: bool = False  # flag each reduced bucket that holds a NaN or Inf
    # (bucket index, device bool "all finite") per reduced bucket, until the loop pops them
    finite: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    # what the method compresses beyond the raw gradient (bench/comm/placement.py): None
    # for ``grad``, else an object whose ``before`` transforms each bucket in place
    placement: Any = None

    @property
    def discarded(self) -> int:
        """Memory elements given up (each with a warning)."""
        return self.comm.memory.discarded

    def phase(self, name: str) -> tuple[str, float]:
        """What this step is sent as, for the statistics (``CommStats.begin_step``)."""
        if not self.comm.sparse:
            return name, 1.0
        dense = self.force_dense or self.step < self.warmup_steps
        return ("dense", 1.0) if dense else (name, self.density)

    def state_dict(self) -> dict[str, Any]:
        """Counters, the memory's per-bucket tensors (by bucket key), the compressor's
        generators and the node layout that hitopk's shards are cut by."""
        return {
            **super().state_dict(),
            "procs_per_node": self._per_node(),
            "buckets": self.comm.memory.state_dict(),
            "generators": self.comm.compressor.state_dict(),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        super().load_state_dict(sd)
        self.step_started, self.finite = False, []
        buckets = sd["buckets"]
        if int(sd["procs_per_node"]) != self._per_node():  # hitopk's shards: cut otherwise
            shards = [(k, b) for k, m in buckets.items() for b in m if b[1:] == ("shard",)]
            n = sum(int(buckets[k].pop(b).numel()) for k, b in shards)
            if n:
                was = sd["procs_per_node"]
                self.comm.memory.discard(
                    n, f"hitopk shards of {was} workers a node, now {self._per_node()}"
                )
        self.comm.memory.load_state_dict(buckets)
        self.comm.compressor.load_state_dict(sd["generators"])

    def _per_node(self) -> int:
        g = self.comm.groups
        return g.topo.procs_per_node if g is not None and g.intra is not None else 0

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


def _carry_residuals(
    comm: Communicator, mem: ResidualMemory, bucket: dist.GradBucket, key: tuple
) -> None:
    """Error feedback across DDP's rebuilt buckets: a new bucket's parameters are noted
    (where its residual will lie in them), and the residuals its parameters had in the
    buckets of the layout before are added to its gradient (``ResidualMemory.carry``)."""
    places = mem.places.get(key)
    if places is None:
        buf = bucket.buffer()
        es = buf.element_size()
        places = mem.places[key] = [
            (id(p), (g.data_ptr() - buf.data_ptr()) // es, g.numel())
            for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True)
        ]
        mkey, pieces = comm.pieces(key, places, buf.numel())
        mem.pieces[mkey] = pieces
    if mem.pending:
        mem.carry(bucket.buffer(), places)


def sparse_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP hook of every name but ``powersgd``: dispatch one bucket to a communicator."""
    if not state.step_started:  # every bucket of the step before has completed
        state.step_started = True
        # residuals of buckets the last step did not use (DDP rebuilt its buckets) go
        state.comm.memory.sweep()
        state.fold_flags()  # the last step's callbacks have all run: no append races this
    buf = bucket.buffer()
    dense = state.force_dense or state.step < state.warmup_steps or buf.numel() < state.min_numel
    key = _bucket_key(bucket)
    if state.placement is None and isinstance(state.comm.memory, ResidualMemory):
        _carry_residuals(state.comm, state.comm.memory, bucket, key)
    if state.placement is not None:
        dense = state.placement.before(state, bucket, key, dense)
    comm = state.dense if dense else state.comm
    fut = comm.reduce(buf, key, state.density, state.stats)
    if state.nan_check:
        fut = fut.then(functools.partial(_check_finite, state, bucket.index()))
    if bucket.is_last():
        state.step += 1
        state.stats.steps += 1
        state.step_started = False
    return fut


class _Unflagged(_Counters):
    """A hook state that flags no NaN/Inf on the device (the loop then checks the local
    gradients itself) and gives nothing up."""

    nan_check = False  # set by the loop; no flags come of it
    discarded = 0

    def take_finite(self) -> None:
        return None

    def check_finite(self) -> None:
        """Nothing was flagged: a NaN or Inf shows in the loss and the gradients."""


#: PowerSGDState's per-bucket memories (keyed by bucket index), and what else of it is not
#: saved: its process group and its numpy generator (saved as tensors)
_PSGD_BUCKETS, _PSGD_SKIP = (
    ("error_dict", "p_memory_dict", "q_memory_dict"),
    ("process_group", "rng"),
)


@dataclass
class PowerSGDHookState(_Unflagged):
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

    def phase(self, name: str) -> tuple:
        """Compressed from PowerSGD's own ``start_powerSGD_iter`` on, a plain allreduce before."""
        ps = self.psgd
        compressing = ps.iter >= ps.start_powerSGD_iter
        return (name, 1.0, int(ps.matrix_approximation_rank)) if compressing else ("dense", 1.0)

    def state_dict(self) -> dict[str, Any]:
        """Counters and torch's PowerSGDState (its slots, as torch's ``__getstate__``
        keeps them, the numpy generator as tensors), its memories per bucket."""
        ps = self.psgd
        keep = [s for s in ps.__slots__ if s not in _PSGD_SKIP + _PSGD_BUCKETS]
        return {
            **super().state_dict(),
            "powersgd": {**{s: getattr(ps, s) for s in keep}, "rng": numpy_rng_state(ps.rng)},
            "buckets": {k: dict(getattr(ps, k)) for k in _PSGD_BUCKETS},
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        super().load_state_dict(sd)
        ps, saved = self.psgd, dict(sd["powersgd"])
        set_numpy_rng_state(ps.rng, saved.pop("rng"))
        for k, v in {**saved, **sd["buckets"]}.items():
            setattr(ps, k, {int(i): t.clone() for i, t in v.items()} if k in _PSGD_BUCKETS else v)
        self.last = None  # no bucket of this process is in flight


def _run_powersgd(state: PowerSGDHookState, bucket: dist.GradBucket) -> Future:
    """PyTorch's PowerSGD hook on one bucket, counting the elements it allreduces and its
    span (``stats.py``: all of it is ``comm_s``)."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

    ps, st = state.psgd, state.stats
    buf = bucket.buffer()
    w = dist.get_world_size(ps.process_group)
    before, compressing = ps.total_numel_after_compression, ps.iter >= ps.start_powerSGD_iter
    t0 = st.times.now(buf)
    fut = powerSGD_hook(ps, bucket)
    # before start_powerSGD_iter it is a plain allreduce and the counters do not move
    sent = ps.total_numel_after_compression - before if compressing else buf.numel()
    st.count(
        cost.allreduce(sent * buf.element_size(), *ring(w, state.multinode), 1), sent, buf.numel()
    )

    def finish(f: Future) -> torch.Tensor:
        st.times.add_comm(t0, st.times.now(buf))
        return f.value()

    return fut.then(finish)


def powersgd_hook(state: PowerSGDHookState, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """PyTorch's PowerSGD hook, counted (:func:`_run_powersgd`); returns without waiting."""
    if bucket.is_last():
        state.step += 1
        state.stats.steps += 1
    if state.serialize is None:
        state.serialize = uses_gloo(state.psgd.process_group, bucket.buffer().device)
    if not state.serialize:
        return _run_powersgd(state, bucket)
    buf = bucket.buffer()
    out = new_future(buf)
    prev, state.last = state.last, out
    # the bucket is still being written on the hook's stream; ``start`` may run later in
    # the callback of the bucket before, on a pool stream that waits on that bucket's
    # work only (at once, when it is already done): it must wait on this stream too
    written = torch.cuda.current_stream(buf.device).record_event() if buf.is_cuda else None

    def start(_: Any = None) -> None:
        try:
            if written is not None:
                torch.cuda.current_stream(buf.device).wait_event(written)
            forward(_run_powersgd(state, bucket), out)
        except BaseException as e:  # the step fails with it instead of hanging DDP
            out.set_exception(e)

    if prev is None:
        start()
    else:
        prev.add_done_callback(start)
    return out


@dataclass
class NoCommState(_Unflagged):
    """What the training controller and the saved state read of a hook's state; also the
    stand-in of a single process, which has no hook."""

    stats: CommStats = field(default_factory=CommStats)
    step: int = 0
    density: float = 1.0  # unused: nothing is sent
    force_dense: bool = False  # unused
    group: Any = None  # the process group of the step barrier (None: the default group)
    multinode: bool = False  # the barrier's bytes cross a node's link

    def phase(self, name: str) -> tuple[str, float]:
        return name, 1.0


BARRIER_BYTES = 4  # the step barrier: one float32 element


def nocomm_hook(state: NoCommState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The bucket's own (local) gradient, unsent; the step's last bucket resolves after a
    one-element allreduce, which keeps the workers in step (docs/internals/comm.md)."""
    buf = bucket.buffer()
    if not bucket.is_last():
        state.stats.count(cost.Traffic(()), 0, buf.numel())
        return done(buf)
    state.step += 1
    state.stats.steps += 1
    world = dist.get_world_size(state.group) if dist.is_initialized() else 1
    if world == 1:
        state.stats.count(cost.Traffic(()), 0, buf.numel())
        return done(buf)
    link = BARRIER_BYTES if state.multinode else 0
    barrier = cost.Stage("barrier", BARRIER_BYTES, link, 1, state.multinode)
    state.stats.count(cost.Traffic((barrier,)), 1, buf.numel())
    flag = torch.zeros(1, dtype=torch.float32, device=buf.device)
    fut = dist.all_reduce(flag, group=state.group, async_op=True).get_future()
    return fut.then(lambda _: buf)


def build_nocomm(opts: Any, topo_groups: Any, pg: Any) -> tuple[NoCommState, Any]:
    """The ``HookSpec.build`` of ``nocomm`` (the process group carries the step barrier)."""
    multinode = topo_groups is not None and topo_groups.topo.nnodes > 1
    return NoCommState(group=pg, multinode=multinode), nocomm_hook


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
    measurement: bool = False  # a measurement device, not a training method (``nocomm``)


#: hook name -> :class:`HookSpec`
HOOKS: Registry[HookSpec] = Registry("comm")


def is_sparse(name: str) -> bool:
    """Whether hook ``name`` sends a ``density`` fraction of each bucket (its records too)."""
    return HOOKS.get(name).sparse


def _reducer(compressor: str | None, communicator: type[Communicator]) -> Build:
    """Builder of ``(HookState, sparse_hook)``; ``compressor=None``: the ``selector`` option."""

    def build(opts: HookOptions, topo_groups: Groups | None, pg: Any) -> tuple[Any, HookFn]:
        comp = COMPRESSORS.get(str(compressor or opts.selector)).build(opts)
        # dense values alias the bucket, and the cast hooks follow PyTorch's: no feedback
        memory = ResidualMemory() if comp.sparse and opts.error_feedback else NoMemory()
        place, own = placement.make(opts.placement, opts.error_feedback)
        comm = communicator(comp, memory if own is None else own, topo_groups, pg, opts.value_dtype)
        dense = AllReduce(NoCompressor(), NoMemory(), topo_groups, pg)
        state = HookState(comm, dense, float(opts.density), opts.warmup_steps, opts.min_numel)
        state.placement = place
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


NOCOMM = "nocomm"  # sends nothing: local gradients (an optimizer that exchanges its own)

for _spec in (
    HookSpec("dense", _reducer("dense", AllReduce), sparse=False),
    HookSpec("fp16", _reducer("fp16", AllReduce), sparse=False),
    HookSpec("bf16", _reducer("bf16", AllReduce), sparse=False),
    *(HookSpec(n, _reducer(n, AllGather), sparse=True) for n in ("topk", "mstopk", "randomk")),
    HookSpec("hitopk", _reducer(None, HiTopK), sparse=True, hierarchical=True, validate=_two_nodes),
    HookSpec("powersgd", _build_powersgd, sparse=False, own_warmup=True),
    HookSpec(NOCOMM, build_nocomm, sparse=False, measurement=True),
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
    name: str, *, model: torch.nn.Module | None = None, process_group: Any = None, **options: Any
) -> tuple[CommHookState, HookFn]:
    """``(state, hook)`` for ``ddp_model.register_comm_hook(state, hook)``; call on every
    rank, before or after ``init_process_group`` (the state binds on the hook's first call).

    ``name``: dense, fp16, bf16, topk, mstopk, randomk, hitopk or powersgd.  ``model``: the
    model (or its DDP), whose parameter names key ``state.state_dict()``.
    ``process_group``: DDP's, when not the whole world.  The options
    (:class:`~bench.comm.config.HookOptions`; a misspelt one is a TypeError naming the
    closest):

    - ``density=0.01``: fraction of each bucket's elements sent, in (0, 1] (sparse hooks)
    - ``error_feedback=True``: keep what was not sent and add it to the next step
    - ``warmup_steps=0``: dense steps first (powersgd: its ``start_powerSGD_iter``, >= 2)
    - ``min_numel``: buckets with fewer elements are reduced dense
    - ``value_dtype="float32"``: the sparse values on the wire (float16, bfloat16)
    - ``procs_per_node=0``: workers per node (hitopk's intra-node stage); 0: torchrun's
      ``LOCAL_WORLD_SIZE``, else one node.  hitopk needs 2 or more nodes: on one machine
      ``procs_per_node=1`` treats each worker as a node
    - ``selector="mstopk"``: hitopk's shard selector (topk, mstopk, randomk)
    - ``mstopk_method="tiled"``: how mstopk finds its threshold (sampled, hist, paper)
    - ``powersgd_rank=4``: PowerSGD's ``matrix_approximation_rank``
    - ``seed=None``: randomk's generator seed
    - ``timing=True``: CUDA events for ``stats``' selection and communication times
    - ``placement="grad"``: what a sparse hook compresses (``grad+dgc``, ``update``;
      docs/algorithms.md)
    """
    HOOKS.get(name)  # an unknown name fails here, listing the known ones
    state = CommHookState(name, HookOptions.checked(options), build, process_group, model)
    if dist.is_initialized():  # otherwise it binds on the hook's first call (or bind())
        state.bind()
    return state, comm_hook


def build(name: str, opts: HookOptions, process_group: Any = None) -> tuple[Any, HookFn]:
    """The inner ``(state, hook)`` of ``name`` on the initialised process group (what a
    :class:`~bench.comm.state.CommHookState` holds once bound)."""
    spec = HOOKS.get(name)
    if opts.placement != "grad" and not spec.sparse:
        raise ConfigError(f"placement={opts.placement} applies to the sparse methods only")
    topo = _topology(spec, opts, process_group)
    if spec.validate is not None:
        spec.validate(opts, dist.get_world_size(process_group), topo.nnodes if topo else 1)
    topo_groups = None
    if topo is not None:  # hierarchical: new process groups; others: byte accounting only
        topo_groups = groups(topo) if spec.hierarchical else Groups(topo, None, None)
    return spec.build(opts, topo_groups, process_group)


def numpy_rng_state(rng: np.random.RandomState) -> list[Any]:
    """A numpy generator's state as tensors and numbers (``weights_only`` loads it)."""
    name, keys, pos, has_gauss, cached = rng.get_state()
    return [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached]


def set_numpy_rng_state(rng: np.random.RandomState, st: list[Any]) -> None:
    name, keys, pos, has_gauss, cached = st
    rng.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), cached))
