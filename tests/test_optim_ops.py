"""The flat update's steady-state step issues a constant number of operator calls.

Counted with torch's profiler: the top-level ``aten::`` operators of one ``step()`` (an
operator called from inside another, as a CPU foreach op's per-tensor fallback, is
that operator's business, not a call of ours).  A model with 10 parameter tensors and
one with 100 take the same number, with gradients of their own and as DDP's bucket
views (groups interleaved), on the fused and the portable paths.  On CUDA (``gpu``)
the kernels per step too: no more than torch's fused optimizer launches.
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import bench.optim.flat as flat
from bench.optim import build_optimizer
from bench.optim.flat import FlatOptimizer
from bench.optim.layout import ddp_like_buckets
from tests.helpers.optim_cases import OPTS, rel_err
from tests.helpers.optim_cases import plain_cfg as cfg

SIZES = (10, 100)  # parameter tensors: Linear(8, 8) weights and biases


def _net(n_tensors: int, device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(n_tensors // 2))).to(device)


def _fill_grads(model: torch.nn.Module, step: int) -> None:
    gen = torch.Generator().manual_seed(step)
    for p in model.parameters():
        g = torch.randn(p.shape, generator=gen).to(p.device)
        if p.grad is None:
            p.grad = g
        else:
            p.grad.copy_(g)


def _is_ours(e) -> bool:
    """A top-level aten operator: not called from inside another aten operator."""
    parent = e.cpu_parent
    return e.name.startswith("aten::") and (parent is None or not parent.name.startswith("aten::"))


def _profile_step(opt: torch.optim.Optimizer, device: str):
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
    return prof.events()


def _ops_per_step(name: str, n_tensors: int, ddp: bool, mode: str = "flat") -> int:
    model = _net(n_tensors)
    opt = build_optimizer(model, cfg(update=mode, **OPTS[name]))
    if ddp:  # one bucket: weights and biases interleave, two groups of 50 ranges each
        ddp_like_buckets(list(model.parameters()), cap_mb=1.0, first_mb=1.0)
    for s in range(3):  # layout, first step (state exposed), then the steady state
        _fill_grads(model, s)
        opt.step()
    return sum(map(_is_ours, _profile_step(opt, "cpu")))


@pytest.mark.parametrize("ddp", [False, True], ids=["own_grads", "ddp_buckets"])
@pytest.mark.parametrize("path", ["fused", "portable"])
@pytest.mark.parametrize("name", ["sgd", "sgd_plain", "adamw", "adam", "lars"])
def test_flat_step_ops_do_not_grow_with_the_parameters(
    name: str, path: str, ddp: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if path == "fused":
        if name == "lars":
            pytest.skip("CPU LARS runs torch's fused kernel once per layer (see lars.py)")
        monkeypatch.setattr(flat, "CPU_FUSED_MIN", 0)  # fused even for these small ranges
    else:
        monkeypatch.setattr(FlatOptimizer, "allow_fused", False)
    small, large = (_ops_per_step(name, n, ddp) for n in SIZES)
    assert small == large, (small, large)
    assert large <= 40  # a handful per group and bucket (about 10-30 today)


def test_the_per_tensor_modes_do_grow() -> None:
    """The measure sees a per-tensor loop: torch's naive SGD over the same models."""
    small, large = (_ops_per_step("sgd", n, ddp=False, mode="naive") for n in SIZES)
    assert large >= 5 * small


@pytest.mark.parametrize("name", ["sgd", "adamw", "lars"])
def test_the_constant_step_is_the_reference_update(name: str) -> None:
    """Steady-state spans over interleaved DDP buckets compute torch's update."""
    subj, ref = _net(100), _net(100)
    o_subj = build_optimizer(subj, cfg(update="flat", **OPTS[name]))
    o_ref = build_optimizer(ref, cfg(update="naive" if name != "lars" else "foreach", **OPTS[name]))
    ddp_like_buckets(list(subj.parameters()), cap_mb=1.0, first_mb=1.0)
    for s in range(5):
        for m, o in ((subj, o_subj), (ref, o_ref)):
            _fill_grads(m, s)
            o.step()
    assert o_subj.buckets[0].copies == 0
    assert o_subj.buckets[0]._group_spans  # the steady-state path ran
    assert rel_err(subj, ref) < 1e-5


def _cuda_kernels(name: str, n_tensors: int, mode: str) -> tuple[int, int]:
    """(top-level operators, CUDA kernels and memsets) of one steady-state step."""
    model = _net(n_tensors, "cuda")
    opt = build_optimizer(model, cfg(update=mode, **OPTS[name]))
    ddp_like_buckets(list(model.parameters()), cap_mb=1.0, first_mb=1.0)
    for s in range(3):
        _fill_grads(model, s)
        opt.step()
    torch.cuda.synchronize()
    events = _profile_step(opt, "cuda")
    on_gpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(map(_is_ours, events)), len(on_gpu)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sgd", "adamw", "lars"])
def test_flat_step_kernels_on_cuda(name: str) -> None:
    """Constant operator calls on CUDA, and (SGD, AdamW) no more kernels than torch
    fused over the same tensors (its multi-tensor launches grow by one per ~36-48
    tensors, flat's alike: ranges, not tensors, are its entries)."""
    ops = {n: _cuda_kernels(name, n, "flat") for n in SIZES}
    assert ops[10][0] == ops[100][0], ops
    if name != "lars":
        _, fused = _cuda_kernels(name, 100, "fused")
        assert ops[100][1] <= fused, (ops, fused)
