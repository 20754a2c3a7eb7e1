"""Update modes: every mode computes the reference update; state dicts move across modes."""

from __future__ import annotations

import copy
import dataclasses
import io
from pathlib import Path

import pytest
import torch
import torchvision
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from bench.optim import build_optimizer, ddp_kwargs, param_groups, validate
from bench.optim.config import OptimConfig, UpdateMode
from bench.optim.flat import FlatOptimizer
from bench.registry import ConfigError
from tests.helpers.optim_cases import OPTS, rel_err

UPDATE_MODES = UpdateMode.values()

STEPS = 20
TOL = 1e-6  # relative, per tensor: ||a - b|| / ||b||


def cfg(**kw) -> OptimConfig:
    """An OptimConfig composed as Hydra does (strings become the typed choices)."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(OptimConfig), kw))


def reference_lars(params: list, state: dict, lr: float, o: dict) -> None:
    """LARS written out plainly (You et al. 2017; torch-SGD momentum convention):
    ``buf = m * buf + d``, then ``p -= lr * (d + m * buf)`` (Nesterov) or ``lr * buf``."""
    with torch.no_grad():
        for p, wd, adapt in params:
            g = p.grad
            d = g + wd * p
            if adapt:
                pn, gn = p.norm(), g.norm()
                if pn > 0 and gn > 0:
                    d = d * (o["trust_coefficient"] * pn / (gn + wd * pn + OptimConfig().eps))
            buf = state.get(p)
            buf = d.clone() if buf is None else buf * o["momentum"] + d
            state[p] = buf
            p -= lr * (d + o["momentum"] * buf if o["nesterov"] else buf)


def reference(model: torch.nn.Module, o: dict):
    """The reference optimizer for ``o`` over a copy of ``model`` (None: LARS, done by hand)."""
    groups = param_groups(model, o["weight_decay"], True)
    if o["name"] == "sgd":
        return torch.optim.SGD(
            groups, lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"], foreach=False
        )
    if o["name"] == "adamw":
        return torch.optim.AdamW(groups, lr=o["lr"], betas=o["betas"], eps=o["eps"], foreach=False)
    if o["name"] == "adam":
        return torch.optim.Adam(groups, lr=o["lr"], betas=o["betas"], eps=o["eps"], foreach=False)
    return None


def set_grads(models: list[torch.nn.Module], step: int) -> None:
    gen = torch.Generator().manual_seed(1000 + step)
    for ps in zip(*(m.parameters() for m in models), strict=False):
        g = torch.randn(ps[0].shape, generator=gen) * 0.01
        for p in ps:
            if p.grad is None:
                p.grad = g.to(p.dtype).clone()
            else:
                p.grad.copy_(g)  # keeps flat-mode views


@pytest.fixture(scope="module")
def resnet18() -> torch.nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18()


def resnet18_head(m: torch.nn.Module) -> torch.nn.Module:
    """ResNet-18's first 30 parameter tensors (stem, layer1, layer2: 0.68 M values)."""
    return torch.nn.Sequential(m.conv1, m.bn1, m.layer1, m.layer2)


def lr_at(o: dict, step: int) -> float:
    return o["lr"] * (1.0 + 0.5 * step / STEPS)  # a changing lr, as a schedule would


CASES = [
    (k, m) for k in OPTS for m in UPDATE_MODES if not (OPTS[k]["name"] == "lars" and m == "fused")
]


def check_matches_reference(model: torch.nn.Module, opt: str, mode: str) -> None:
    o = OPTS[opt]
    subj, ref = copy.deepcopy(model), copy.deepcopy(model)
    optimizer = build_optimizer(subj, cfg(update=mode, **o))
    r = reference(ref, o)
    lars_state: dict = {}
    adapt = [
        (p, g["weight_decay"], i == 0)
        for i, g in enumerate(param_groups(ref, o["weight_decay"], True))
        for p in g["params"]
    ]
    for s in range(STEPS):
        optimizer.zero_grad(set_to_none=False)
        set_grads([subj, ref], s)
        for g in optimizer.param_groups:
            g["lr"] = lr_at(o, s)
        optimizer.step()
        if r is None:
            reference_lars(adapt, lars_state, lr_at(o, s), o)
        else:
            for g in r.param_groups:
                g["lr"] = lr_at(o, s)
            r.step()
    assert rel_err(subj, ref) < TOL
    assert rel_err(subj, model) > 1e-4  # it did move


@pytest.mark.parametrize("opt,mode", CASES)
def test_mode_matches_reference(resnet18: torch.nn.Module, opt: str, mode: str) -> None:
    """Every optimizer x mode, 20 steps, on the first 30 tensors of ResNet-18 (fast)."""
    check_matches_reference(resnet18_head(resnet18), opt, mode)


@pytest.mark.slow
@pytest.mark.parametrize("opt,mode", CASES)
def test_mode_matches_reference_full_resnet18(
    resnet18: torch.nn.Module, opt: str, mode: str
) -> None:
    """The same on all 62 tensors (11.7 M values) of ResNet-18."""
    check_matches_reference(resnet18, opt, mode)


def test_param_groups_weight_decay_respected() -> None:
    torch.manual_seed(0)
    model = torchvision.models.resnet18()
    before = copy.deepcopy(model)
    o = cfg(name="sgd", update="flat", lr=0.1, momentum=0.0, nesterov=False, weight_decay=0.1)
    opt = build_optimizer(model, o)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # zero gradients: only weight decay moves anything
    for (name, p), q in zip(model.named_parameters(), before.parameters(), strict=False):
        if p.ndim <= 1:  # BN parameters and biases: excluded from decay
            assert torch.equal(p, q), name
        else:
            torch.testing.assert_close(p, q * (1 - 0.1 * 0.1))


def _state_bytes(opt: torch.optim.Optimizer) -> dict:
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    return torch.load(buf)


@pytest.mark.parametrize(
    "opt,a,b",
    [
        ("sgd", "flat", "foreach"),
        ("sgd", "foreach", "flat"),
        ("sgd", "fused", "flat"),
        ("sgd", "flat", "naive"),
        ("lars", "flat", "foreach"),
        ("lars", "naive", "flat"),
        ("adamw", "flat", "foreach"),
        ("adamw", "fused", "flat"),
        ("adamw", "flat", "fused"),
    ],
)
def test_state_dict_round_trip_across_modes(opt: str, a: str, b: str) -> None:
    torch.manual_seed(0)
    model = resnet18_head(torchvision.models.resnet18())
    o = OPTS[opt]
    straight, first = copy.deepcopy(model), copy.deepcopy(model)
    opt_straight = build_optimizer(straight, cfg(update=a, **o))
    opt_first = build_optimizer(first, cfg(update=a, **o))
    for s in range(3):
        for m, op in ((straight, opt_straight), (first, opt_first)):
            op.zero_grad(set_to_none=False)
            set_grads([m], s)
            op.step()
    sd = _state_bytes(opt_first)
    assert set(sd) == {"state", "param_groups"} and 0 in sd["state"]
    resumed = copy.deepcopy(first)  # the model checkpoint
    opt_resumed = build_optimizer(resumed, cfg(update=b, **o))
    opt_resumed.load_state_dict(sd)
    if b == "flat":
        assert all(g["flat"] for g in opt_resumed.param_groups)
    else:
        assert all(not g.get("flat") for g in opt_resumed.param_groups)
        assert (
            opt_resumed.param_groups[0].get("fused") == (True if b == "fused" else None)
            or b != "fused"
        )
    for s in range(3, 6):
        for m, op in ((straight, opt_straight), (resumed, opt_resumed)):
            op.zero_grad(set_to_none=False)
            set_grads([m], s)
            op.step()
    assert rel_err(resumed, straight) < TOL


def test_flat_keeps_gradient_views_and_zero_grad() -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 2)
    )
    opt = build_optimizer(model, cfg(name="sgd", update="flat"))
    assert isinstance(opt, FlatOptimizer) and ddp_kwargs(opt) == {"gradient_as_bucket_view": True}
    (b,) = opt.buckets
    n = len(b.params)
    assert all(p.grad is None for p in model.parameters())  # as a new torch optimizer
    for it in range(2):
        model(torch.randn(4, 8)).square().sum().backward()
        for p in model.parameters():  # from the 2nd step on, autograd accumulates in place
            assert p.untyped_storage().data_ptr() == b.model.untyped_storage().data_ptr()
            in_buffer = p.grad.untyped_storage().data_ptr() == b.grad.untyped_storage().data_ptr()
            assert in_buffer == (it > 0)
        opt.step()  # the first step copies autograd's fresh gradients in, once
        assert b.copies == n and b.grad.abs().sum() > 0
        opt.zero_grad(set_to_none=False)  # still views, zeroed
        assert all(p.grad is not None for p in model.parameters()) and b.grad.abs().sum() == 0
    assert b.copies == n
    model[0].weight.grad = torch.ones_like(model[0].weight)  # replaced: copied in, counted
    opt.step()
    assert (
        b.copies == n + 1
        and model[0].weight.grad.untyped_storage().data_ptr() == b.grad.untyped_storage().data_ptr()
    )


def test_grad_scaler_contract_unscales_and_skips() -> None:
    torch.manual_seed(0)
    m1 = torch.nn.Linear(10, 10)
    m2 = copy.deepcopy(m1)
    o1 = build_optimizer(m1, cfg(name="sgd", update="flat", nesterov=False))
    o2 = build_optimizer(m2, cfg(name="sgd", update="foreach", nesterov=False))
    set_grads([m1, m2], 0)
    with torch.no_grad():
        for p in m1.parameters():
            p.grad.mul_(1024.0)
    o1.grad_scale, o1.found_inf = torch.tensor(1024.0), torch.tensor(0.0)
    o1.step()
    o2.step()
    assert rel_err(m1, m2) < TOL
    before = copy.deepcopy(m1)
    o1.found_inf = torch.tensor(1.0)
    o1.step()  # an overflow step: skipped
    assert rel_err(m1, before) == 0.0


@pytest.mark.parametrize("dtype", ["bf16"])
def test_master_weights_fp32_with_low_precision_model(dtype: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 6 * 6, 4),
    )
    ref = copy.deepcopy(model)
    o = dict(OPTS["sgd"])
    opt = build_optimizer(model, cfg(update="flat", master_weights=dtype, **o))
    r = reference(ref, o)
    low = torch.bfloat16
    assert [p.dtype for p in model.parameters()] == [
        low,
        torch.float32,
        torch.float32,
        torch.float32,
        low,
        torch.float32,
    ]
    b = next(b for b in opt.buckets if b.dtype == low)
    assert b.master.dtype == torch.float32 and len(opt.buckets) == 2
    for s in range(5):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=low):
            model(torch.randn(2, 3, 8, 8)).float().sum().backward()  # the bf16 model trains
        set_grads([model], s)  # then known gradients, the same for the reference
        for p, q in zip(model.parameters(), ref.parameters(), strict=False):
            q.grad = p.grad.float()  # the reference sees the bf16-rounded gradients
        opt.step()
        r.step()
    masters = [b.view(b.master, k) for k in range(len(b.params))]
    refs = [q for q in ref.parameters() if q.ndim >= 2]
    for m, q in zip(masters, refs, strict=False):
        assert ((m - q).norm() / q.norm()).item() < TOL
    for m, p in zip(masters, b.params, strict=False):
        assert torch.equal(m.to(low), p)
    assert rel_err(model, ref) < 1e-2  # bf16 model copy: about 3 significant digits
    # the checkpoint carries the fp32 master: an fp32 foreach run that takes its weights
    # from the masters continues as the fp32 reference does
    sd = _state_bytes(opt)
    assert torch.equal(sd["state"][0]["master_param"], masters[0])
    fp32 = copy.deepcopy(model).float()
    with torch.no_grad():
        for p, m in zip((p for p in fp32.parameters() if p.ndim >= 2), masters, strict=True):
            p.copy_(m)
    o2 = build_optimizer(fp32, cfg(update="foreach", **o))
    o2.load_state_dict(sd)
    for s in range(5, 8):
        set_grads([fp32, ref], s)
        o2.step()
        r.step()
    assert rel_err(fp32, ref) < TOL


def test_validate_refuses_unsupported_modes() -> None:
    with pytest.raises(ConfigError, match="naive, foreach, flat"):
        validate(cfg(name="lars", update="fused"))
    with pytest.raises(ConfigError, match="needs optim.update=flat"):
        validate(cfg(name="sgd", update="foreach", master_weights="bf16"))
    with pytest.raises(ValidationError, match="naive, foreach, fused, flat"):
        cfg(name="sgd", update="fast")  # refused where the config is composed
    with pytest.raises(ConfigError, match="nesterov"):
        validate(cfg(name="lars", momentum=0.0, nesterov=True))
    with pytest.raises(ConfigError, match="trust_coefficient"):
        validate(cfg(name="lars", trust_coefficient=0.0))
    with pytest.raises(ConfigError):
        validate(cfg(name="adamw", betas=[0.9, 1.5]))
    for name in ("sgd", "lars", "adam", "adamw"):
        validate(cfg(name=name, update="flat"))


def _ddp_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """Train a small BN conv net 4 steps under DDP in foreach and flat modes (one rank)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = {}
    for mode, extra in (
        ("foreach", {}),
        ("flat", {}),
        ("flat_bucket_view", {"gradient_as_bucket_view": True}),
    ):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(32, 5),
        )
        opt = build_optimizer(model, cfg(name="sgd", update=mode.split("_")[0], lr=0.1))
        ddp = DDP(model, **{**ddp_kwargs(opt), **extra})
        gen = torch.Generator().manual_seed(rank)
        for _ in range(4):
            x, y = (
                torch.randn(6, 3, 10, 10, generator=gen),
                torch.randint(0, 5, (6,), generator=gen),
            )
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        if mode == "flat":  # DDP's gradients are used in place: never copied
            b = opt.buckets[0]
            assert b.copies == 0 and b.relayouts >= 1
            assert all(k >= 0 for k in b.seg_of)
        if mode == "flat_bucket_view":  # the same layout, asked for twice
            assert opt.buckets[0].copies == 0
        results[mode] = [p.detach().clone() for p in model.parameters()]
    if rank == 0:
        torch.save(results, f"{out_dir}/params.pt")
    dist.destroy_process_group()


def test_ddp_flat_trains_like_foreach(tmp_path) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    res = torch.load(tmp_path / "params.pt")
    for mode in ("flat", "flat_bucket_view"):
        for a, b in zip(res[mode], res["foreach"], strict=True):
            assert ((a - b).norm() / b.norm()).item() < TOL, mode


def test_optim_config_files_validate() -> None:
    files = sorted((Path(__file__).resolve().parents[1] / "conf" / "optim").glob("*.yaml"))
    assert {f.stem for f in files} >= {"sgd", "lars", "adam", "adamw"}
    for f in files:
        c = OmegaConf.to_object(
            OmegaConf.merge(OmegaConf.structured(OptimConfig), OmegaConf.load(f))
        )
        assert c.name == f.stem  # file stem = registry key
        validate(c)
        for mode in UPDATE_MODES:
            try:  # every mode is either built or refused with the alternatives
                validate(dataclasses.replace(c, update=mode))
            except ConfigError as e:
                assert "choose one of" in str(e)


def test_fp16_model_copy_with_grad_scaler() -> None:
    """fp16 model copy + fp32 master weights under torch.amp.GradScaler (CPU autocast)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = build_optimizer(model, cfg(name="sgd", update="flat", master_weights="fp16", lr=0.1))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x = torch.randn(16, 8)
    losses = []
    for _ in range(5):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).float().square().mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=False)
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    b = next(b for b in opt.buckets if b.dtype == torch.float16)
    assert torch.equal(b.master.half(), b.model)


@pytest.mark.parametrize("opt", ["sgd", "sgd_plain", "lars", "lars_nesterov", "adam", "adamw"])
def test_flat_portable_path_matches_reference(
    resnet18: torch.nn.Module, opt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vector-op fallbacks of flat mode (devices without torch's fused kernels)."""
    monkeypatch.setattr(FlatOptimizer, "allow_fused", False)
    model = resnet18_head(resnet18)
    probe = build_optimizer(copy.deepcopy(model), cfg(update="flat", **OPTS[opt]))
    assert not any(probe.use_fused)
    check_matches_reference(model, opt, "flat")
