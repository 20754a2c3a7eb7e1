"""Flat mode over DDP's own gradient buckets: no gradient copied, torch's arithmetic.

Single process: gradients laid out as DDP's buckets (``layout.ddp_like_buckets``), a
bucket rebuild, a parameter without a gradient inside a bucket.  Two gloo processes:
real ``DistributedDataParallel`` with ``ddp_kwargs`` (``gradient_as_bucket_view=True``),
small buckets, against torch's foreach optimizers trained the same way.
"""

from __future__ import annotations

import copy

import pytest
import torch

import bench.optim.flat as flat
from bench.optim import build_optimizer, ddp_kwargs
from bench.optim.layout import ddp_like_buckets
from tests.helpers.optim_cases import OPTS, rel_err
from tests.helpers.optim_cases import plain_cfg as cfg


def _net(seed: int = 0) -> torch.nn.Module:
    """Conv/BN/Linear: the decay and no-decay groups interleave in bucket order."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 32),
        torch.nn.Linear(32, 5),
    )


def _grads(model: torch.nn.Module, step: int, skip: torch.nn.Parameter | None = None) -> None:
    """Deterministic gradients written into the existing ``p.grad`` (a bucket view)."""
    gen = torch.Generator().manual_seed(step)
    for p in model.parameters():
        g = torch.randn(p.shape, generator=gen).mul_(0.1).to(p.dtype)
        if p.grad is None:
            p.grad = g
        else:
            p.grad.copy_(g)
    if skip is not None:
        skip.grad = None


def _own_storage(opt) -> set[int]:
    return {b.grad.untyped_storage().data_ptr() for b in opt.buckets}


@pytest.mark.parametrize("opt", ["sgd", "lars", "adamw", "adam"])
def test_bucket_views_are_updated_in_place(opt: str) -> None:
    """Bucket-view gradients: no copy, re-laid at the first step and after a rebuild,
    a gradient-less parameter skipped, and the naive loop's result."""
    model = _net()
    subj, ref = copy.deepcopy(model), copy.deepcopy(model)
    o_subj = build_optimizer(subj, cfg(update="flat", **OPTS[opt]))
    o_ref = build_optimizer(ref, cfg(update="naive", **OPTS[opt]))
    ddp_like_buckets(list(subj.parameters()), cap_mb=0.005, first_mb=0.001)
    b = o_subj.buckets[0]
    skip_s, skip_r = subj[8].bias, ref[8].bias  # no gradient in steps 2 and 3
    compact: list[bool] = []
    for s in range(6):
        if s == 4:  # DDP's rebuild: new buckets, other order
            ddp_like_buckets(list(subj.parameters())[::-1], cap_mb=0.01, first_mb=0.01)
        skip = s in (2, 3)
        _grads(subj, s, skip_s if skip else None)
        _grads(ref, s, skip_r if skip else None)
        o_subj.step()
        o_ref.step()
        o_subj.zero_grad(set_to_none=False)
        o_ref.zero_grad(set_to_none=False)
        # the general path's whole-bucket updates (the steady state takes none)
        compact += [w.compact for w in b.whole_cache.values()]
    assert b.copies == 0
    assert b.relayouts >= 2
    assert len(b.segments) >= 2
    # after the rebuild, the steady state: one update per group (not Adam, whose
    # skipped bias is steps behind its group)
    assert bool(b._group_spans) == (opt in ("sgd", "lars"))
    # buckets updated whole; the interleaved group gathered, updated and put back, or
    # (Adam: the skipped bias is steps behind its group) updated run by run
    assert compact and (all(compact) if opt in ("sgd", "lars") else not all(compact))
    assert all(k >= 0 for k in b.seg_of)
    assert all(p.grad.untyped_storage().data_ptr() not in _own_storage(o_subj) for p in b.params)
    assert rel_err(subj, ref) < 1e-5
    # torch's checkpoint format, loadable by the naive optimizer
    sd = o_subj.state_dict()
    assert sorted(sd["state"]) == sorted(o_ref.state_dict()["state"])
    o_ref.load_state_dict(sd)


def test_set_to_none_keeps_bucket_views_zeroed() -> None:
    model = _net()
    opt = build_optimizer(model, cfg(update="flat", **OPTS["sgd"]))
    buckets = ddp_like_buckets(list(model.parameters()), cap_mb=0.005)
    _grads(model, 0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    assert all(float(t.abs().sum()) == 0.0 for t in buckets)
    assert all(p.grad is not None for p in model.parameters())
    assert opt.buckets[0].copies == 0


def test_master_weights_over_bucket_views() -> None:
    """bf16 model copy with fp32 masters: bf16 and fp32 buckets, as DDP makes them."""
    model = _net()
    subj, ref = copy.deepcopy(model), copy.deepcopy(model)
    o_subj = build_optimizer(subj, cfg(update="flat", master_weights="bf16", **OPTS["sgd"]))
    o_ref = build_optimizer(ref, cfg(update="flat", master_weights="bf16", **OPTS["sgd"]))
    ddp_like_buckets(list(subj.parameters()), cap_mb=0.005)
    for s in range(3):
        _grads(subj, s)
        _grads(ref, s)
        o_subj.step()
        o_ref.step()
        o_subj.zero_grad(set_to_none=False)
        o_ref.zero_grad(set_to_none=False)
    assert all(b.copies == 0 for b in o_subj.buckets)
    assert sum(b.copies for b in o_ref.buckets) > 0  # the copying path, for contrast
    assert rel_err(subj, ref) == 0.0


def _ddp_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    out = {}
    for name, mode, extra in (
        ("sgd", "foreach", {}),
        ("sgd", "flat", {}),
        ("lars", "foreach", {}),
        ("lars", "flat", {}),
        ("adamw", "fused", {}),
        ("adamw", "flat", {}),
    ):
        model = _net()
        model[1].eval(), model[4].eval()  # BN statistics stay out of the comparison
        opt = build_optimizer(model, cfg(update=mode, **OPTS[name], **extra))
        ddp = DDP(model, bucket_cap_mb=0.01, **ddp_kwargs(opt))
        gen = torch.Generator().manual_seed(rank)
        for _ in range(4):  # DDP rebuilds its buckets after the first
            x = torch.randn(4, 3, 10, 10, generator=gen)
            ddp(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        if mode == "flat":
            b = opt.buckets[0]
            out[f"{name}_check"] = (
                b.copies,
                b.relayouts,
                len(b.segments),
                all(k >= 0 for k in b.seg_of),
                any(p.grad.untyped_storage().data_ptr() in _own_storage(opt) for p in b.params),
            )
        out[f"{name}_{mode}"] = [p.detach().clone() for p in model.parameters()]
    if rank == 0:
        torch.save(out, f"{out_dir}/out.pt")
    dist.destroy_process_group()


def test_ddp_flat_copies_no_gradient(tmp_path) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    out = torch.load(tmp_path / "out.pt")
    for name, ref in (("sgd", "foreach"), ("lars", "foreach"), ("adamw", "fused")):
        copies, relayouts, n_segments, all_in_buckets, any_own = out[f"{name}_check"]
        assert copies == 0, name
        assert relayouts >= 1 and n_segments >= 2 and all_in_buckets and not any_own, name
        for a, b in zip(out[f"{name}_flat"], out[f"{name}_{ref}"], strict=True):
            assert ((a - b).norm() / b.norm()).item() < 1e-5, name


@pytest.mark.gpu
@pytest.mark.parametrize("group_steps", [True, False], ids=["per_group", "general"])
@pytest.mark.parametrize("opt", ["sgd", "lars", "adamw"])
def test_bucket_views_on_cuda(opt: str, group_steps: bool, monkeypatch) -> None:
    """The CUDA path (fused kernels, LARS's segment-id gather; one update per group in
    the steady state, or the whole-bucket update of the general path) over DDP-like
    buckets: torch's result, no copy; bf16 model with fp32 masters too."""
    monkeypatch.setattr(flat.FlatOptimizer, "group_steps", group_steps)
    dev = torch.device("cuda")
    model = _net().to(dev)
    subj, ref, low = copy.deepcopy(model), copy.deepcopy(model), copy.deepcopy(model)
    o_subj = build_optimizer(subj, cfg(update="flat", **OPTS[opt]))
    o_ref = build_optimizer(ref, cfg(update="foreach", **OPTS[opt]))
    o_low = build_optimizer(low, cfg(update="flat", master_weights="bf16", **OPTS[opt]))
    ddp_like_buckets(list(subj.parameters()), cap_mb=0.005, first_mb=0.001)
    ddp_like_buckets(list(low.parameters()), cap_mb=0.005, first_mb=0.001)
    for s in range(4):
        for m, o in ((subj, o_subj), (ref, o_ref), (low, o_low)):
            gen = torch.Generator().manual_seed(s)
            for p in m.parameters():
                g = torch.randn(p.shape, generator=gen).mul_(0.1).to(dev, p.dtype)
                if p.grad is None:
                    p.grad = g
                else:
                    p.grad.copy_(g)
            o.step()
            o.zero_grad(set_to_none=False)
    torch.cuda.synchronize()
    assert all(b.copies == 0 and b.segments for b in o_subj.buckets + o_low.buckets)
    assert bool(o_subj.buckets[0].whole_cache) != group_steps
    assert bool(o_subj.buckets[0]._group_spans) == group_steps
    assert rel_err(subj, ref) < 1e-5
    assert rel_err(low, ref) < 2e-2  # bf16 model copy of fp32 masters


@pytest.mark.gpu
def test_update_benchmark_quick_on_cuda(tmp_path) -> None:
    import pandas as pd

    from bench.benchmarks import load_all

    df = pd.read_csv(load_all().get("update").run(results_dir=str(tmp_path), quick=True))
    assert set(df["device"]) == {"cuda"}
    assert set(df["mode"]) == {"naive", "foreach", "fused", "flat"}
    assert set(df.loc[df["variant"] == "master=bf16", "optimizer"]) == {"sgd", "lars", "adamw"}
    assert (df.loc[df["mode"] == "flat", "ddp_copies"] == 0).all()


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_fused_bucket_then_compact_group(opt: str, monkeypatch) -> None:
    """Fused kernel over the bucket, vector ops over the gathered group (scratch buffers
    first allocated by the gathered span): torch's result.  The general path, which the
    steady state would not take here."""
    monkeypatch.setattr(flat, "CPU_FUSED_MIN", 100)
    monkeypatch.setattr(flat.FlatOptimizer, "group_steps", False)
    model = _net()
    subj, ref = copy.deepcopy(model), copy.deepcopy(model)
    o_subj = build_optimizer(subj, cfg(update="flat", **OPTS[opt]))
    o_ref = build_optimizer(ref, cfg(update="naive", **OPTS[opt]))
    ddp_like_buckets(list(subj.parameters()), cap_mb=0.005, first_mb=0.001)
    for s in range(3):
        _grads(subj, s)
        _grads(ref, s)
        o_subj.step()
        o_ref.step()
    assert any(w.compact for w in o_subj.buckets[0].whole_cache.values())
    assert rel_err(subj, ref) < 1e-5
