"""DDP communication hooks by name (``HOOKS``): compressor + memory + communicator, or
PyTorch's ``powerSGD_hook``, or ``nocomm`` (sends nothing); docs/internals/comm.md."""

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
from bench.comm.layout import places
from bench.comm.state import CommHookState, comm_hook
from bench.comm.stats import CommStats, ring
from bench.comm.topology import Groups, Topology, check_hierarchical, detect, groups
from bench.registry import ConfigError, Registry

HookFn = Callable[[Any, dist.GradBucket], torch.futures.Future]


@dataclass(kw_only=True)
class _Counters:
    """The statistics, step counter and schedule position of every hook state."""

    stats: CommStats = field(default_factory=CommStats)
    step: int = 0
    density: float = 1.0  # the controller sets it; the dense hooks send everything
    force_dense: bool = False

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "density": self.density, "force_dense": self.force_dense}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.step, self.density = int(sd["step"]), float(sd["density"])
        self.force_dense = bool(sd["force_dense"])


@dataclass
class HookState(_Counters):
    """What a compressing hook keeps between calls; the training controller adjusts it."""

    comm: Communicator
    dense: Communicator
    warmup_steps: int = 0
    min_numel: int = cost.MIN_NUMEL
    step_started: bool = False  # a bucket of the current step has been handed over
    nan_check: bool = False  # flag each reduced bucket that holds a NaN or Inf
    # (bucket index, device bool "all finite") per reduced bucket, until the loop pops them
    finite: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    placement: Any = None  # None for ``grad``, else its ``before`` transforms each bucket

    @property
    def discarded(self) -> int:
        return self.comm.memory.discarded

    def phase(self, name: str) -> tuple[str, float]:
        """What this step is sent as (``CommStats.begin_step``)."""
        if not self.comm.sparse:
            return name, 1.0
        dense = self.force_dense or self.step < self.warmup_steps
        return ("dense", 1.0) if dense else (name, self.density)

    def state_dict(self) -> dict[str, Any]:
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
        """The unread device flags since the last call: ``(bucket index, all finite)`` per
        reduced bucket (``nan_check``), ``(-1, input finite)`` per selection."""
        found, self.finite = self.finite, []
        return found + [(-1, f) for c in (self.comm, self.dense) for f in c.take_flags()]

    def check_finite(self) -> None:
        """Read every flag so far (one sync); ValueError if one is false."""
        found = self.take_finite()
        dev = found[0][1].device if found else None
        if found and not bool(torch.stack([ok.to(dev) for _, ok in found]).all()):
            raise ValueError("the tensor contains NaN or Inf: a gradient bucket of the comm hook")

    def fold_flags(self, keep: int = 64) -> None:
        """AND the unread selection flags past ``keep`` into one (no sync): bounded list."""
        for c in (self.comm, self.dense):
            if len(c.flags) > keep:
                flags = c.take_flags()
                c.flags.append(torch.stack([f.to(flags[0].device) for f in flags]).all())


def _check_finite(state: HookState, index: int, fut: torch.futures.Future) -> torch.Tensor:
    out = fut.value()
    t = out[0] if isinstance(out, list) else out
    # the sum is NaN/Inf iff an element is (finite gradients never sum past fp32's range):
    # one pass without a temporary, ~30x cheaper than isfinite(t).all() on a CPU
    state.finite.append((index, torch.isfinite(t.sum())))
    return t


def _bucket_key(bucket: dist.GradBucket) -> tuple:
    # DDP rebuilds its buckets after the first step: keyed by the parameters it covers too
    params = bucket.parameters()
    ends = (id(params[0]), id(params[-1])) if params else (0, 0)
    return (bucket.index(), bucket.buffer().numel(), *ends)


def _carry_residuals(
    comm: Communicator, mem: ResidualMemory, bucket: dist.GradBucket, key: tuple
) -> None:
    """Error feedback across DDP's rebuilt buckets: a new bucket's parameters noted, the
    residuals they had in the buckets before added (``ResidualMemory.carry``)."""
    if key not in mem.places:
        mem.places[key] = places(bucket)
        mkey, pieces = comm.pieces(key, mem.places[key], bucket.buffer().numel())
        mem.pieces[mkey] = pieces
    if mem.pending:
        mem.carry(bucket.buffer(), mem.places[key])


def sparse_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Dispatch one bucket to a communicator (every hook but powersgd's and nocomm's)."""
    if not state.step_started:  # every bucket of the step before has completed
        state.step_started = True
        # residuals of buckets the last step did not use (DDP rebuilt its buckets) go
        state.comm.memory.sweep()
        state.fold_flags()  # the last step's callbacks have all run: no append races this
    buf = bucket.buffer()
    dense = state.force_dense or state.step < state.warmup_steps or buf.numel() < state.min_numel
    key, mem = _bucket_key(bucket), state.comm.memory
    if state.placement is not None:
        dense = state.placement.before(state, bucket, key, dense)
    elif isinstance(mem, ResidualMemory):
        _carry_residuals(state.comm, mem, bucket, key)
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
    """Flags no NaN/Inf (the loop checks the local gradients) and gives nothing up."""

    nan_check = False  # set by the loop; no flags come of it
    discarded = 0

    def take_finite(self) -> None:
        return None

    def check_finite(self) -> None:
        pass


_PSGD_BUCKETS = ("error_dict", "p_memory_dict", "q_memory_dict")  # keyed by bucket index
_PSGD_SKIP = ("process_group", "rng")  # not saved as they are


@dataclass
class PowerSGDHookState(_Unflagged):
    psgd: Any  # torch's PowerSGDState; its start_powerSGD_iter is the warm-up
    # start each bucket when the one before is done (gloo; see below); None: decided by the
    # first bucket's device (a "cpu:gloo,cuda:nccl" group sends CUDA buckets over NCCL)
    serialize: bool | None = False
    multinode: bool = False  # count the allreduce bytes as inter-node
    last: Future | None = None  # the future of the bucket before (serialize)

    def phase(self, name: str) -> tuple:
        ps = self.psgd
        compressing = ps.iter >= ps.start_powerSGD_iter
        return (name, 1.0, int(ps.matrix_approximation_rank)) if compressing else ("dense", 1.0)

    def state_dict(self) -> dict[str, Any]:
        # the numpy generator's state as tensors: ``weights_only`` loads it
        ps = self.psgd
        keep = [s for s in ps.__slots__ if s not in _PSGD_SKIP + _PSGD_BUCKETS]
        name, keys, pos, has_gauss, cached = ps.rng.get_state()
        rng = [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached]
        return {
            **super().state_dict(),
            "powersgd": {**{s: getattr(ps, s) for s in keep}, "rng": rng},
            "buckets": {k: dict(getattr(ps, k)) for k in _PSGD_BUCKETS},
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        super().load_state_dict(sd)
        ps, saved = self.psgd, dict(sd["powersgd"])
        name, keys, pos, has_gauss, cached = saved.pop("rng")
        ps.rng.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), cached))
        for k, v in {**saved, **sd["buckets"]}.items():
            setattr(ps, k, {int(i): t.clone() for i, t in v.items()} if k in _PSGD_BUCKETS else v)
        self.last = None  # no bucket of this process is in flight


def _run_powersgd(state: PowerSGDHookState, bucket: dist.GradBucket) -> Future:
    """PyTorch's PowerSGD hook on one bucket, its elements and span counted (as comm_s)."""
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
    """PyTorch's PowerSGD hook, counted; on gloo each bucket starts when the one before ends."""
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
    """``nocomm``'s state; also the stand-in of a single process, which has no hook."""

    group: Any = None  # the process group of the step barrier (None: the default group)
    multinode: bool = False  # the barrier's bytes cross a node's link

    def phase(self, name: str) -> tuple[str, float]:
        return name, 1.0


BARRIER_BYTES = 4  # the step barrier: one float32 element


def nocomm_hook(state: NoCommState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The bucket's local gradient, unsent; the step's last bucket waits on a one-element
    allreduce that keeps the workers in step."""
    buf, last = bucket.buffer(), bucket.is_last()
    if last:
        state.step += 1
        state.stats.steps += 1
    if not last or not dist.is_initialized() or dist.get_world_size(state.group) == 1:
        state.stats.count(cost.Traffic(()), 0, buf.numel())
        return done(buf)
    link = BARRIER_BYTES if state.multinode else 0
    barrier = cost.Stage("barrier", BARRIER_BYTES, link, 1, state.multinode)
    state.stats.count(cost.Traffic((barrier,)), 1, buf.numel())
    flag = torch.zeros(1, dtype=torch.float32, device=buf.device)
    fut = dist.all_reduce(flag, group=state.group, async_op=True).get_future()
    return fut.then(lambda _: buf)


def build_nocomm(opts: Any, topo_groups: Any, pg: Any) -> tuple[NoCommState, Any]:
    multinode = topo_groups is not None and topo_groups.topo.nnodes > 1
    return NoCommState(group=pg, multinode=multinode), nocomm_hook


#: (options, node groups or None, process group) -> (state, hook)
Build = Callable[[HookOptions, Groups | None, Any], tuple[Any, HookFn]]
#: (options, world size, nodes) -> None, or ConfigError
Check = Callable[[HookOptions, int, int], None]


@dataclass(frozen=True)
class HookSpec:
    """One hook name: its builder, and what the launcher, loop and records read."""

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
        state = HookState(comm, dense, opts.warmup_steps, opts.min_numel, placement=place)
        state.density = float(opts.density)
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
    """The inner ``(state, hook)`` of ``name`` that a bound ``CommHookState`` holds."""
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
