"""Error feedback feeds back: what a step does not send is sent by a later step.

Single process, on the pieces a communicator combines (memory + compressor, through
:meth:`Communicator.compress`, which every communicator's ``reduce`` calls): no
torch.distributed needed.  A constant gradient is the sharp case.  With error feedback the
residual of a small coordinate grows every step until it wins the selection, so every
coordinate is sent within a few ``1/density`` steps and what was sent approaches the sum
of the gradients; without it, top-k sends the same ``k`` coordinates forever.  Keeping the
residual but selecting from the raw gradient (so the residual is never re-sent) conserves
``sent + residual == inputs`` just as well, which is why conservation alone cannot catch it.

Conservation itself is checked per call for float32, bfloat16 and float16 gradients and
each wire dtype, with gradients beyond float16's range: the wire values stay finite and
the residual (float32 for 16-bit buckets) keeps what the clamp and rounding held back.
"""

from __future__ import annotations

import pytest
import torch

from bench.comm.communicators import AllGather, Communicator, HiTopK
from bench.comm.compressors import (
    COMPRESSORS,
    MSTopKCompressor,
    NoMemory,
    ResidualMemory,
)
from bench.comm.config import HookOptions
from bench.comm.topology import Groups, Topology

NUMEL = 4000
DENSITY = 0.05  # k = 200 of 4000
STEPS = 60  # 3 / DENSITY


def _gradient() -> torch.Tensor:
    """Constant per-coordinate magnitudes in [1, 2) with random signs, multiples of 1/64.

    Multiples of 1/64 below 2 keep every sum of up to 60 steps exact in float32.
    """
    gen = torch.Generator().manual_seed(0)
    g = 1 + torch.randint(0, 64, (NUMEL,), generator=gen).float() / 64
    return g * (torch.randint(0, 2, (NUMEL,), generator=gen) * 2 - 1)


def _comm(comm: str, selector: str, error_feedback: bool, value_dtype: str) -> Communicator:
    if selector == "mstopk":  # small_numel=0: the tiled MSTopK path even on a small bucket
        compressor = MSTopKCompressor(value_dtype, method="tiled", small_numel=0)
    else:
        compressor = COMPRESSORS.get(selector).build(HookOptions(value_dtype=value_dtype, seed=0))
    memory = ResidualMemory() if error_feedback else NoMemory()
    if comm == "hitopk":  # 2 nodes x 2: compress() runs on this worker's shard, no collective
        groups = Groups(Topology(world_size=4, procs_per_node=2, rank=0), None, None)
        return HiTopK(compressor, memory, groups, None, value_dtype)
    return AllGather(compressor, memory, None, None, value_dtype)


def _run(comm: Communicator, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of what was sent (float64) and the step at which each coordinate was first sent."""
    sent = torch.zeros(NUMEL, dtype=torch.float64)
    first = torch.full((NUMEL,), -1)
    for step in range(STEPS):
        c = comm.compress(g.clone(), "bucket", DENSITY)  # the hook hands over a fresh bucket
        assert c.indices is not None and c.indices.numel() == DENSITY * NUMEL
        sent.index_add_(0, c.indices, c.values.double())
        new = c.indices[first[c.indices] < 0]
        first[new] = step
    return sent, first


CASES = [
    (comm, sel, vdt)
    for comm in ("allgather", "hitopk")
    for sel in ("topk", "mstopk", "randomk")
    for vdt in ("float32", "float16")
]


@pytest.mark.parametrize("comm, selector, value_dtype", CASES)
def test_feedback_sends_what_was_kept(comm: str, selector: str, value_dtype: str) -> None:
    g = _gradient()
    c = _comm(comm, selector, True, value_dtype)
    sent, first = _run(c, g)
    total = STEPS * g.double()
    # what was sent plus what is kept is what came in, exactly (fp16 rounding stays kept)
    residual = c.memory.buffers["bucket"]
    assert torch.equal(sent + residual.double(), total)
    # ...and most of it was sent: the kept part is about one gradient per 1/density steps
    assert float(sent.abs().sum() / total.abs().sum()) > 0.6
    # the sum sent has the sign of the gradient (the residual never overshoots)
    assert bool((sent * total >= 0).all())
    if selector != "randomk":  # top-k: every coordinate sent within 2 / density steps
        assert int(first.min()) >= 0, "a coordinate was never sent"
        assert int(first.max()) < 2 / DENSITY


@pytest.mark.parametrize("selector", ["topk", "mstopk"])
def test_without_feedback_small_coordinates_are_never_sent(selector: str) -> None:
    """The control: the checks above tell feedback from its absence."""
    g = _gradient()
    sent, first = _run(_comm("allgather", selector, False, "float32"), g)
    assert int((first >= 0).sum()) == DENSITY * NUMEL  # the same k coordinates every step
    assert float(sent.abs().sum() / (STEPS * g.double()).abs().sum()) < 0.1


GRAD_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
WIRE_DTYPES = ["float32", "float16", "bfloat16"]


def _steep_gradient(step: int, dtype: torch.dtype) -> torch.Tensor:
    """Normal values plus a few at and beyond float16's range (65504) in every step."""
    g = 3 * torch.randn(NUMEL, generator=torch.Generator().manual_seed(step))
    big = [1e6, -2e5, 7e4, 65500.0] if dtype != torch.float16 else [65504.0, -65504.0, 6e4, 1e-7]
    g[: len(big)] = torch.tensor(big)
    return g.to(dtype)


@pytest.mark.parametrize("comm", ["allgather", "hitopk"])
@pytest.mark.parametrize("value_dtype", WIRE_DTYPES)
@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=str)
def test_each_call_conserves_for_every_gradient_dtype(
    comm: str, value_dtype: str, dtype: torch.dtype
) -> None:
    """sent + new residual == old residual + gradient, exactly in the residual's dtype
    (float32 for 16-bit buckets), with wire values that never overflow."""
    c = _comm(comm, "topk", True, value_dtype)
    wire = getattr(torch, value_dtype)
    for step in range(6):
        g = _steep_gradient(step, dtype)
        old = c.memory.buffers.get("bucket")
        old = torch.zeros(NUMEL) if old is None else old.clone()
        assert old.dtype == torch.float32  # 16-bit buckets too: the residual is float32
        out = c.compress(g.clone(), "bucket", DENSITY)
        new = c.memory.buffers["bucket"]
        assert out.values.dtype == wire and bool(torch.isfinite(out.values).all())
        assert bool(torch.isfinite(new).all())
        # nothing above what the bucket's dtype holds goes out (the receivers' mean fits)
        assert float(out.values.float().abs().max()) <= torch.finfo(dtype).max
        sent = torch.zeros(NUMEL, dtype=torch.float64)
        sent[out.indices] = out.values.double()
        assert torch.equal(sent + new.double(), (old + g.to(old.dtype)).double())
        # the same against the exact sum: only the residual dtype's rounding of old + g
        exact = old.double() + g.double()
        assert float(((sent + new.double() - exact).abs() / exact.abs().clamp_min(1)).max()) < 1e-6


def test_float16_bucket_keeps_what_the_wire_clamp_holds_back() -> None:
    """Values at float16's limit that randomk does not send pile up past 65504 in the
    residual (float32), which re-sends them clamped, instead of turning inf."""
    c = _comm("allgather", "randomk", True, "float16")
    g = torch.full((NUMEL,), 60000.0, dtype=torch.float16)
    total = torch.zeros(NUMEL, dtype=torch.float64)
    sent = torch.zeros(NUMEL, dtype=torch.float64)
    for _ in range(5):
        out = c.compress(g.clone(), "bucket", DENSITY)
        assert float(out.values.float().abs().max()) <= 65504 and bool(out.values.isfinite().all())
        sent.index_add_(0, out.indices, out.values.double())
        total += g.double()
    res = c.memory.buffers["bucket"]
    assert res.dtype == torch.float32 and float(res.max()) > 65504
    assert torch.equal(sent + res.double(), total)


@pytest.mark.parametrize("name", ["fp16", "bf16"])
@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=str)
def test_cast_compressors_never_overflow(name: str, dtype: torch.dtype) -> None:
    """The dense fp16/bf16 hooks' values: clamped into what the wire and bucket hold."""
    x = torch.tensor([1e6, -1e6, 65504.0, 3.0, 1e39]).clamp(-torch.finfo(dtype).max, None)
    x = x.clamp(None, torch.finfo(dtype).max).to(dtype)
    out = COMPRESSORS.get(name)().compress(x, 1.0).values
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(out.to(dtype)).all())
    assert float(out[3]) == 3.0


def test_loaded_residuals_survive_the_sweep_after_earlier_use() -> None:
    """Residuals loaded into a memory that has reduced other buckets (a hook state loaded
    mid-run) are kept by the next step's sweep, which would free buckets left unused."""
    mem = ResidualMemory()
    mem.sweep()
    mem.compensate(torch.ones(4), key="first-layout")  # a step before the load
    saved = torch.tensor([0.5, -0.25, 0.0, 1.0])
    mem.load_state_dict({"residuals": {"rebuilt": saved}})
    mem.sweep()  # the first step after the resume
    assert torch.equal(mem.compensate(torch.zeros(4), key="rebuilt"), saved)


class _Bucket:
    """A DDP bucket of ``params`` in this order: their gradients laid end to end."""

    def __init__(self, params: list[torch.Tensor], grads: dict[int, torch.Tensor]) -> None:
        self.params = params
        self.buf = torch.cat([grads[id(p)] for p in params])
        self.views, at = [], 0
        for p in params:
            self.views.append(self.buf[at : at + p.numel()].view(p.shape))
            at += p.numel()

    def buffer(self) -> torch.Tensor:
        return self.buf

    def parameters(self) -> list[torch.Tensor]:
        return self.params

    def gradients(self) -> list[torch.Tensor]:
        return self.views


def test_residuals_go_on_by_parameter_when_ddp_rebuilds_its_buckets(recwarn) -> None:
    """DDP's first step reduces its buckets in one layout, the later ones in another (its
    rebuild): what the first step kept is added into the parameters' new bucket, nothing
    is discarded or warned about, and sent + kept = what came in, per parameter."""
    from bench.comm.hooks import _carry_residuals

    a, b = torch.zeros(300), torch.zeros(5, 100)  # two parameters
    gen = torch.Generator().manual_seed(0)
    grads = {id(p): torch.randn(p.numel(), generator=gen) for p in (a, b)}
    comm = _comm("allgather", "topk", True, "float32")
    mem = comm.memory
    sent = {id(p): torch.zeros(p.numel(), dtype=torch.float64) for p in (a, b)}
    layouts = [[a, b], [b, a], [b, a], [b, a]]  # step 1 in one order, then rebuilt
    for params in layouts:
        mem.sweep()  # each step's first bucket (sparse_hook)
        bucket = _Bucket(params, grads)
        key = (0, 800, id(params[0]), id(params[-1]))
        _carry_residuals(comm, mem, bucket, key)
        c = comm.compress(bucket.buffer(), key, 0.05)
        flat = torch.zeros(800, dtype=torch.float64).index_add_(0, c.indices, c.values.double())
        at = 0
        for p in params:
            sent[id(p)] += flat[at : at + p.numel()]
            at += p.numel()
        assert mem.discarded == 0 and not mem.pending  # carried in the step it was found
    kept = mem.buffers[key].double()  # the last layout: b, then a
    assert torch.allclose(sent[id(b)] + kept[:500], 4 * grads[id(b)].double(), atol=1e-5)
    assert torch.allclose(sent[id(a)] + kept[500:], 4 * grads[id(a)].double(), atol=1e-5)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_hitopk_residual_pieces_are_this_workers_shard() -> None:
    """hitopk keeps the residual of its shard of the bucket: the pieces are the parts of
    the parameters in that shard (2 workers a node: shard 1 of a 7-element bucket is
    elements 4..7, padded)."""
    comm = _comm("hitopk", "topk", True, "float32")
    comm.groups = Groups(Topology(world_size=4, procs_per_node=2, rank=1), None, None)
    key, pieces = comm.pieces("k", [(10, 0, 3), (11, 3, 4)], 7)
    assert key == ("k", "shard") and pieces == [(11, 0, 1, 3)]
    comm.groups = Groups(Topology(world_size=4, procs_per_node=2, rank=0), None, None)
    assert comm.pieces("k", [(10, 0, 3), (11, 3, 4)], 7)[1] == [(10, 0, 0, 3), (11, 3, 0, 1)]
