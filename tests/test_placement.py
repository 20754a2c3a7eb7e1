"""The placements of the sparse methods (``comm.placement``): conservation in the quantity
each compresses, density 1.0 equal to the uncompressed optimizer step (bit for bit on one
process, within tolerance on 2 gloo workers), ``update`` against Adam with its frozen
variance, resume bit for bit, and bad combinations refused before launch."""

from __future__ import annotations

import io
import math
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hydra import compose, initialize_config_dir
from torch.nn.parallel import DistributedDataParallel as DDP

from bench.comm.compressors import ResidualMemory, TopKCompressor
from bench.comm.config import CommConfig
from bench.comm.placement import DGCMemory
from bench.config import register_configs, to_object
from bench.optim import build_optimizer
from bench.optim.config import OptimConfig
from bench.registry import ConfigError
from bench.train.comm import attach

# DDP regroups its buckets after the first step: a first sparse step's residuals go (warned)
pytestmark = pytest.mark.filterwarnings("ignore:error feedback. discarded:RuntimeWarning")
CONF = Path(__file__).resolve().parents[1] / "conf"
SGD = dict(name="sgd", lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-3)
ADAMW = dict(name="adamw", update="foreach", lr=1e-2, betas=[0.9, 0.98], weight_decay=0.05)
OPTIM = {"grad": SGD, "grad+dgc": SGD, "update": ADAMW}
WARMUP = 2  # update's dense warm-up steps


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def world1():
    """One gloo process: DDP and the hooks run as on a cluster, without peers."""
    own = not dist.is_initialized()
    if own:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    if own:
        dist.destroy_process_group()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.LayerNorm(32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    )


def _batch(step: int, rank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)


def _setup(
    placement: str | None,
    density: float,
    min_numel: int = 0,
    optim: dict | None = None,
    name: str = "topk",
):
    """Model, optimizer and DDP; ``placement=None``: DDP's own allreduce, no comm hook."""
    model = _model()
    opt = build_optimizer(model, OptimConfig(**(optim or OPTIM[placement or "grad"])))
    ddp = DDP(model, gradient_as_bucket_view=True, bucket_cap_mb=0.001)
    ctl = None
    if placement is not None:
        cfg = CommConfig(name=name, density=density, placement=placement, min_numel=min_numel)
        cfg.procs_per_node = 1  # hitopk: every worker its own node
        cfg.warmup_steps = WARMUP if placement == "update" else 0
        ctl = attach(ddp, cfg, steps_per_epoch=100, optimizer=opt)
        ctl.set_epoch(0)
    return model, opt, ddp, ctl


def _train(parts: tuple, steps: range, rank: int = 0) -> list[torch.Tensor]:
    model, opt, ddp, _ = parts
    for step in steps:
        x, y = _batch(step, rank)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    return [p.detach().clone() for p in model.parameters()]


def _frozen_reference(optim: dict, steps: int) -> list[torch.Tensor]:
    """AdamW for the warm-up, then Adam with the warm-up's variance, written out here."""
    model, opt, ddp, _ = _setup(None, 1.0, optim=optim)
    _train((model, opt, ddp, None), range(WARMUP))
    lr, (b1, b2), wd = optim["lr"], optim["betas"], optim["weight_decay"]
    for step in range(WARMUP, steps):
        x, y = _batch(step)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        with torch.no_grad():
            for group in opt.param_groups:
                for p in group["params"]:
                    st = opt.state[p]
                    t = int(st["step"]) + 1
                    st["step"] += 1
                    m = st["exp_avg"].mul_(b1).add_(p.grad, alpha=1 - b1)
                    v_hat = st["exp_avg_sq"] / (1 - b2**WARMUP)  # frozen at the warm-up's end
                    p.mul_(1 - lr * group["weight_decay"])
                    p.sub_(lr * (m / (1 - b1**t)) / (v_hat.sqrt() + 1e-8))
        opt.zero_grad(set_to_none=False)
    assert wd > 0  # the decoupled decay is exercised
    return [p.detach().clone() for p in model.parameters()]


# -- conservation ------------------------------------------------------------------------


def test_grad_conserves_the_gradient() -> None:
    mem, comp = ResidualMemory(), TopKCompressor()
    for step in range(3):
        x = torch.randn(200, generator=torch.Generator().manual_seed(step))
        old = mem.buffers.get("b", torch.zeros(200)).clone()
        c = comp.compress(mem.compensate(x, "b"), 0.05)
        mem.update("b", None, c)
        sent = torch.zeros(200).index_add_(0, c.indices, c.values)
        torch.testing.assert_close(sent + mem.buffers["b"], old + x, rtol=0, atol=1e-6)


def test_dgc_conserves_the_velocity_and_masks_the_momentum() -> None:
    mem, comp = DGCMemory(momentum=0.9, nesterov=True), TopKCompressor()
    u = torch.zeros(200)
    for step in range(4):
        x = torch.randn(200, generator=torch.Generator().manual_seed(step))
        old = mem.buffers.get("b", torch.zeros(200)).clone()
        u = u * 0.9 + x
        d = x + 0.9 * u  # the Nesterov direction the velocity accumulates
        c = comp.compress(mem.compensate(x, "b"), 0.05)
        mem.update("b", None, c)
        sent = torch.zeros(200).index_add_(0, c.indices, c.values)
        torch.testing.assert_close(sent + mem.buffers["b"], old + d, rtol=0, atol=1e-5)
        assert bool((mem.buffers["b"][c.indices] == 0).all())  # the sent velocity is cleared
        assert bool((mem.momenta["b"][c.indices] == 0).all())  # momentum-factor masking
        u[c.indices] = 0
        torch.testing.assert_close(mem.momenta["b"], u, rtol=0, atol=1e-5)


def test_update_conserves_the_momentum(world1) -> None:
    """Once frozen, the hook sends the top-k of the error-fed momentum ``lerp(m, g,
    1 - beta1)``: sent + new residual == old residual + that momentum."""
    parts = _setup("update", 0.05)
    model, opt, ddp, ctl = parts
    _train(parts, range(WARMUP + 1))  # one compressed step: a residual exists
    mem = ctl.state.comm.memory
    old = {k: b.clone() for k, b in mem.buffers.items()}
    exp_avg = {p: opt.state[p]["exp_avg"].clone() for p in model.parameters()}
    x, y = _batch(WARMUP + 1)
    grads = torch.autograd.grad(torch.nn.functional.mse_loss(model(x), y), model.parameters())
    moms = {p: torch.lerp(exp_avg[p], g, 1 - 0.9) for p, g in zip(model.parameters(), grads)}
    torch.nn.functional.mse_loss(ddp(x), y).backward()  # the hook fills p.grad, no step
    named = dict(model.named_parameters())
    layout = ctl.state._layout  # the step's buckets: their parameters and offsets
    assert layout and len(layout) == len(mem.buffers)

    def flat(lay: Any, of: Any) -> torch.Tensor:
        out = torch.zeros(lay.size)
        for name, off in zip(lay.names, lay.offsets):
            t = of(named[name]).reshape(-1)
            out[off : off + t.numel()] = t
        return out

    for lay in layout:
        (key,) = [k for k in mem.buffers if k[:2] == (lay.index, lay.size)]
        came = flat(lay, lambda p: moms[p])
        sent = flat(lay, lambda p: p.grad)  # one worker: the mean is the sum
        torch.testing.assert_close(sent + mem.buffers[key], old[key] + came, rtol=0, atol=1e-6)
    assert opt.param_groups[0]["frozen_variance"] == WARMUP


# -- density 1.0 against the uncompressed optimizer ---------------------------------------


def test_density_one_equals_the_uncompressed_step(world1) -> None:
    """Bit for bit on one process: ``grad`` and ``grad+dgc`` are SGD with Nesterov momentum
    and weight decay, ``update`` is its own uncompressed path (every bucket dense)."""
    sgd = _train(_setup(None, 1.0), range(6))
    for placement in ("grad", "grad+dgc"):
        got = _train(_setup(placement, 1.0), range(6))
        assert all(torch.equal(a, b) for a, b in zip(got, sgd)), placement
    adamw = _train(_setup(None, 1.0, optim=ADAMW), range(6))
    assert not all(torch.equal(a, b) for a, b in zip(adamw, _train(_setup(None, 1.0), range(6))))
    sparse = _train(_setup("update", 1.0), range(6))
    dense = _train(_setup("update", 1.0, min_numel=10**9), range(6))
    assert all(torch.equal(a, b) for a, b in zip(sparse, dense))
    warm = _train(_setup("update", 1.0), range(WARMUP))  # the warm-up is AdamW itself
    assert all(
        torch.equal(a, b)
        for a, b in zip(warm, _train(_setup(None, 1.0, optim=ADAMW), range(WARMUP)))
    )


def test_update_equals_adam_with_the_frozen_variance(world1) -> None:
    got = _train(_setup("update", 1.0), range(7))
    want = _frozen_reference(ADAMW, 7)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not all(
        torch.equal(a, b) for a, b in zip(got, _train(_setup(None, 1.0, optim=ADAMW), range(7)))
    )


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    res: dict[str, Any] = {}
    for placement in ("grad", "grad+dgc", "update"):
        got = _train(_setup(placement, 1.0, name="hitopk"), range(4), rank)
        # the uncompressed step: DDP's allreduce and the optimizer, or update's dense path
        ref = "update" if placement == "update" else None
        optim = OPTIM[placement]
        want = _train(_setup(ref, 1.0, min_numel=10**9, optim=optim), range(4), rank)
        # compressed (hitopk, a node per worker): every worker applies the same update
        parts = _setup(placement, 0.1, name="hitopk")
        sparse = torch.cat([p.reshape(-1) for p in _train(parts, range(4), rank)])
        both = [torch.empty_like(sparse) for _ in range(2)]
        dist.all_gather(both, sparse)
        ok = torch.equal(*both) and bool(sparse.isfinite().all())
        if placement == "grad+dgc":  # the momentum and velocity live on the node's shard
            mem = parts[3].state.comm.memory
            ok = ok and all(k[1] == "shard" for k in [*mem.momenta, *mem.buffers])
            ok = ok and len(mem.momenta) == len(mem.buffers) > 0
        res[placement] = (got, want, ok)
    if rank == 0:
        torch.save(res, out)
    dist.barrier()
    dist.destroy_process_group()


def test_two_gloo_workers(tmp_path: Path) -> None:
    """Density 1.0 (hitopk, a node per worker) within tolerance of the uncompressed step;
    at density 0.1 the workers stay identical."""
    out = str(tmp_path / "res.pt")
    mp.spawn(_worker, args=(_port(), out), nprocs=2, join=True)
    for placement, (got, want, same) in torch.load(out).items():
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=placement)
        assert same, placement


# -- resume ------------------------------------------------------------------------------


def _roundtrip(obj: Any) -> Any:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("placement", ["grad", "grad+dgc", "update"])
def test_resume_is_bit_for_bit(world1, placement: str) -> None:
    parts = _setup(placement, 0.1)
    model, opt, _, ctl = parts
    _train(parts, range(4))
    saved = _roundtrip(
        {"model": model.state_dict(), "opt": opt.state_dict(), "hook": ctl.state.state_dict()}
    )
    if placement == "grad+dgc":
        assert saved["hook"]["buckets"]["momenta"] and saved["hook"]["buckets"]["residuals"]
    straight = _train(parts, range(4, 8))
    again = _setup(placement, 0.1)  # a restarted worker: built, then loaded
    again[0].load_state_dict(saved["model"])
    again[1].load_state_dict(saved["opt"])
    again[3].state.load_state_dict(saved["hook"])
    resumed = _train(again, range(4, 8))
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed))


# -- refused before launch -----------------------------------------------------------------


def _validate(overrides: list[str]) -> None:
    from bench.launch.run import validate

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    validate(to_object(cfg), create_results=False)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["comm=topk", "comm.placement=grad+dgc", "optim=adamw"], "does not fit optim=adamw"),
        (["comm=hitopk", "comm.placement=update", "optim=sgd"], "does not fit optim=sgd"),
        (["comm=dense", "comm.placement=update", "optim=adamw"], "sparse methods"),
        (["comm=mstopk", "comm.placement=update", "optim=adamw"], "warm-up"),
        (["comm=topk", "comm.placement=dgc"], "unknown comm.placement 'dgc'; choose one of"),
        (
            [
                "comm=topk",
                "comm.placement=grad+dgc",
                "optim=sgd",
                "optim.momentum=0",
                "optim.nesterov=false",
            ],
            "momentum > 0",
        ),  # fmt: skip
    ],
)
def test_bad_combination_is_refused_in_one_line(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as e:
        _validate(["cluster.nnodes=2", *overrides])
    assert "\n" not in str(e.value)


def test_good_combinations_pass() -> None:
    _validate(["comm=topk", "comm.placement=grad+dgc", "optim=sgd"])
    _validate(["comm=mstopk", "comm.placement=update", "optim=adamw", "comm.warmup_steps=40"])


def test_the_study_table_is_steps_over_dense_on_the_same_seed(tmp_path):
    """bench.report.placement: each sparse run against dense of its experiment and seed;
    a miss keeps its steps run and no ratio; the figure is written once."""
    from bench.report import placement

    def rec(run_id, comm, seed, steps, placement_="grad", density=1.0, exp="dawnbench_digits"):
        return {
            "run_id": run_id, "experiment": exp, "comm": comm,
            "status": "ok" if steps else "target_missed", "steps_to_target": steps,
            "comm_phases": [{"steps": steps or 132}],
            "config": {"train": {"seed": seed}, "results": {"sweep_id": "pl"},
                       "comm": {"placement": placement_, "density": density}},
        }  # fmt: skip

    recs = [
        rec("d0", "dense", 1000, 60),
        rec("d1", "dense", 1001, 50),
        rec("a", "hitopk", 1000, 66, "grad", 0.01),
        rec("b", "hitopk", 1001, 60, "grad+dgc", 0.01),
        rec("c", "hitopk", 1000, None, "grad", 0.001),
    ]
    df = placement.table([rec("a0", "hitopk", 1000, 99, "grad", 0.01), *recs])
    got = {r.run_id: r.relative for r in df.itertuples()}
    assert "a0" not in got  # its rerun "a" (recorded later) represents the configuration
    assert got["a"] == pytest.approx(1.1) and got["b"] == pytest.approx(1.2)
    assert math.isnan(got["c"]) and df.set_index("run_id").loc["c", "steps_run"] == 132
    path = placement.plot(df, tmp_path / "p.png", "study")
    assert path.exists() and path.stat().st_size > 5000
