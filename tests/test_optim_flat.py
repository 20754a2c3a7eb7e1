"""Flat mode against torch's semantics: parameters without a gradient, master weights.

* a parameter whose ``.grad`` is None is left alone (no weight decay, no momentum, no
  Adam step), in every optimizer, whatever ``zero_grad(set_to_none=...)`` is used;
* fp32 master weights follow the model when it moved without them (a checkpoint from an
  update mode that keeps no master, a model loaded after the optimizer, DDP's broadcast).
"""

from __future__ import annotations

import copy
import io

import pytest
import torch

from bench.optim import after_ddp_broadcast, build_optimizer, ddp_kwargs
from tests.test_optim import OPTS, cfg, rel_err, set_grads


def _net(seed: int = 0) -> torch.nn.Module:
    """A conv net with a head that only some steps use (``unused`` is never called)."""
    torch.manual_seed(seed)
    return torch.nn.ModuleDict(
        {
            "body": torch.nn.Sequential(
                torch.nn.Conv2d(3, 8, 3, bias=False),  # BN would make its gradient noise
                torch.nn.BatchNorm2d(8),
                torch.nn.ReLU(),
                torch.nn.AdaptiveAvgPool2d(2),
                torch.nn.Flatten(),
                torch.nn.Linear(32, 5),
            ),
            "late": torch.nn.Linear(5, 5),  # used from step 2 on: state starts later
            "unused": torch.nn.Linear(5, 5),
        }
    )


def _loss(model: torch.nn.Module, step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(4, 3, 8, 8, generator=gen)
    out = model["body"](x)
    if step >= 2:
        out = model["late"](out)
    return out.square().mean()


@pytest.mark.parametrize("set_to_none", [False, True])
@pytest.mark.parametrize(
    "opt,mode", [(o, "flat") for o in ("sgd", "lars", "adamw", "adam")] + [("lars", "foreach")]
)
def test_flat_leaves_params_without_grad_alone(opt: str, mode: str, set_to_none: bool) -> None:
    """Flat mode (and foreach LARS, ours) updates exactly what torch's naive loop updates,
    with either zero_grad, when a layer starts late and another is never used."""
    model = _net()
    before = copy.deepcopy(model)
    subj, ref = copy.deepcopy(model), copy.deepcopy(model)
    o_subj = build_optimizer(subj, cfg(update=mode, **OPTS[opt]))
    o_ref = build_optimizer(ref, cfg(update="naive", **OPTS[opt]))
    for s in range(5):
        for m, o in ((subj, o_subj), (ref, o_ref)):
            _loss(m, s).backward()
            o.step()
            o.zero_grad(set_to_none=set_to_none)
    assert torch.equal(subj["unused"].weight, before["unused"].weight)
    assert all(p.grad is None for p in subj["unused"].parameters())
    assert rel_err(subj, ref) < 1e-5
    assert rel_err(subj["late"], before["late"]) > 1e-4  # it did move
    # the checkpoint lists the same parameters as torch's (none without a gradient)
    assert sorted(o_subj.state_dict()["state"]) == sorted(o_ref.state_dict()["state"])


def test_flat_zero_grad_set_to_none_drops_views() -> None:
    model = _net()
    opt = build_optimizer(model, cfg(update="flat", **OPTS["sgd"]))
    _loss(model, 0).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())
    _loss(model, 0).backward()
    opt.zero_grad(set_to_none=False)  # as torch: zeroes existing gradients, keeps None
    assert all(p.grad is None for p in model["late"].parameters())
    assert all(p.grad is not None and p.grad.abs().sum() == 0 for p in model["body"].parameters())


def _state(opt: torch.optim.Optimizer) -> dict:
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    return torch.load(buf)


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
    for s in steps:
        opt.zero_grad(set_to_none=False)
        set_grads([model], s)
        opt.step()


def _masters(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    (b,) = [b for b in opt.buckets if b.master is not b.model]
    return [b.view(b.master, k).clone() for k in range(len(b.params))]


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().float().clone() for p in model.parameters() if p.ndim >= 2]


def _fp32_copy(model: torch.nn.Module, like: torch.nn.Module) -> torch.nn.Module:
    """An fp32 model holding ``model``'s (possibly bf16) weights: a resumed checkpoint."""
    out = copy.deepcopy(like).float()
    out.load_state_dict(model.state_dict())
    return out


def test_stale_master_is_not_resumed_after_an_fp32_phase() -> None:
    """flat-bf16 -> foreach (fp32, no master) -> flat-bf16: the last phase resumes from the
    fp32 weights of the second, not from the masters that the first left in the state."""
    o = OPTS["sgd"]
    base = _net()
    m1 = copy.deepcopy(base)
    opt1 = build_optimizer(m1, cfg(update="flat", master_weights="bf16", **o))
    _train(m1, opt1, range(3))
    m2 = _fp32_copy(m1, base)
    opt2 = build_optimizer(m2, cfg(update="foreach", **o))
    opt2.load_state_dict(_state(opt1))
    _train(m2, opt2, range(3, 6))
    sd2 = _state(opt2)
    fp32_weights = _weights(m2)
    # the model checkpoint (fp32) loaded before the optimizer is built
    m3 = copy.deepcopy(m2)
    opt3 = build_optimizer(m3, cfg(update="flat", master_weights="bf16", **o))
    opt3.load_state_dict(sd2)
    for m, w in zip(_masters(opt3), fp32_weights, strict=True):
        assert torch.equal(m, w)
    # the model loaded after the optimizer was built: the masters follow it
    m4 = copy.deepcopy(base)
    opt4 = build_optimizer(m4, cfg(update="flat", master_weights="bf16", **o))
    m4.load_state_dict(m2.state_dict())
    opt4.load_state_dict(sd2)
    for m, p in zip(_masters(opt4), _weights(m4), strict=True):
        assert torch.equal(m.bfloat16().float(), p)
    # and both continue as the fp32 run does (to bf16 precision)
    _train(m2, opt2, range(6, 9))
    for m, opt in ((m3, opt3), (m4, opt4)):
        _train(m, opt, range(6, 9))
        assert rel_err(m, m2) < 1e-2


@pytest.mark.parametrize("model_first", [True, False])
def test_flat_master_resume_is_exact(model_first: bool) -> None:
    """flat-bf16 -> flat-bf16 through a checkpoint (bf16 model weights + optimizer state):
    the saved masters come back, whether the model is loaded before or after the build."""
    o = OPTS["adamw"]
    base = _net()
    straight = copy.deepcopy(base)
    opt = build_optimizer(straight, cfg(update="flat", master_weights="bf16", **o))
    _train(straight, opt, range(3))
    sd, weights = _state(opt), copy.deepcopy(straight.state_dict())
    resumed = copy.deepcopy(base)
    if model_first:
        resumed.load_state_dict(weights)
    opt2 = build_optimizer(resumed, cfg(update="flat", master_weights="bf16", **o))
    if not model_first:
        resumed.load_state_dict(weights)
    opt2.load_state_dict(sd)
    _train(straight, opt, range(3, 6))
    _train(resumed, opt2, range(3, 6))
    assert rel_err(resumed, straight) == 0.0
    for a, b in zip(_masters(opt2), _masters(opt), strict=True):
        assert torch.equal(a, b)


def test_fp32_state_without_master_keeps_fp32_weights() -> None:
    """A foreach state (no master at all) loaded into flat-bf16 built from fp32 weights:
    the master is the fp32 weight, not its bf16 rounding."""
    o = OPTS["adamw"]
    m1 = _net()
    opt1 = build_optimizer(m1, cfg(update="foreach", **o))
    _train(m1, opt1, range(3))
    w = _weights(m1)
    m2 = copy.deepcopy(m1)
    opt2 = build_optimizer(m2, cfg(update="flat", master_weights="bf16", **o))
    opt2.load_state_dict(_state(opt1))
    for m, x in zip(_masters(opt2), w, strict=True):
        assert torch.equal(m, x)


def test_model_loaded_after_build_moves_the_master() -> None:
    """``model.load_state_dict`` after the optimizer was built, without optimizer state:
    the next step starts from the loaded weights, not from the old masters."""
    o = OPTS["sgd"]
    target = _net(seed=1)
    model = _net(seed=0)
    opt = build_optimizer(model, cfg(update="flat", master_weights="bf16", **o))
    model.load_state_dict(target.state_dict())
    ref = _fp32_copy(model, target)  # the bf16 weights as loaded, in a new run
    opt_ref = build_optimizer(ref, cfg(update="flat", master_weights="bf16", **o))
    _train(model, opt, range(2))
    _train(ref, opt_ref, range(2))
    assert rel_err(model, ref) == 0.0


def test_after_ddp_broadcast_master_follows_model() -> None:
    """Single process: a write into the model copy (what DDP's broadcast does on ranks
    other than 0) is taken into the masters by ``after_ddp_broadcast``."""
    model = _net(seed=0)
    opt = build_optimizer(model, cfg(update="flat", master_weights="bf16", **OPTS["sgd"]))
    src = _net(seed=1)
    with torch.no_grad():
        for p, q in zip(model.parameters(), src.parameters(), strict=True):
            p.detach().copy_(q)
    after_ddp_broadcast(opt)
    for m, p in zip(_masters(opt), _weights(model), strict=True):
        assert torch.equal(m, p)
    fp32 = build_optimizer(torch.nn.Linear(2, 2), cfg(update="foreach", **OPTS["sgd"]))
    after_ddp_broadcast(fp32)  # a no-op for optimizers without masters


def _ddp_master_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """Each rank builds its model from a different seed; DDP broadcasts rank 0's."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    model = _net(seed=rank)["body"]
    opt = build_optimizer(model, cfg(update="flat", master_weights="bf16", **OPTS["sgd"]))
    ddp = DDP(model, **ddp_kwargs(opt))
    after_ddp_broadcast(opt)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(3):
        x = torch.randn(4, 3, 8, 8, generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = ddp(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    torch.save(_masters(opt), f"{out_dir}/masters{rank}.pt")
    dist.destroy_process_group()


def test_ddp_masters_agree_across_ranks(tmp_path) -> None:
    import torch.multiprocessing as mp

    mp.spawn(
        _ddp_master_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True
    )
    m0, m1 = (torch.load(tmp_path / f"masters{r}.pt") for r in range(2))
    for a, b in zip(m0, m1, strict=True):
        assert torch.equal(a, b)
