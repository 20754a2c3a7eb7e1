"""The public hook state in one process (a gloo world of one): made before the process
group, bound on first use, saved and loaded by parameter names (``torch.load`` with
``weights_only`` and pickling), continued exactly in another DDP bucket layout, refusing
or discarding with a count and a warning what cannot be continued; ``import bench.comm``
stays light."""

from __future__ import annotations

import copy
import io
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from bench.comm import CommHookState, make_hook

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def world(tmp_path: Path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "s"), 1), rank=0,
                            world_size=1)  # fmt: skip
    yield
    dist.destroy_process_group()


def _model(seed: int = 0, wide: int = 64) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(16, wide), torch.nn.ReLU(), torch.nn.Linear(wide, wide),
        torch.nn.ReLU(), torch.nn.Linear(wide, 4),
    )  # fmt: skip


def _train(ddp: DDP, opt: torch.optim.Optimizer, steps: range) -> list[torch.Tensor]:
    """Steps on batches fixed by the step number; the weights after each."""
    out = []
    for step in steps:
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        out.append(torch.cat([p.detach().flatten().clone() for p in ddp.parameters()]))
    return out


def _run(name: str, cap: float, model: torch.nn.Module, **opts) -> tuple:
    state, hook = make_hook(name, model=model, min_numel=0, **opts)
    ddp = DDP(model, bucket_cap_mb=cap)
    ddp.register_comm_hook(state, hook)
    return state, ddp, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def test_import_bench_comm_loads_no_hydra_dali_or_training_loop() -> None:
    code = (
        "import sys, bench.comm\n"
        "heavy = ('hydra', 'omegaconf', 'nvidia', 'bench.train', 'bench.launch',"
        " 'bench.config', 'bench.data', 'bench.report', 'lightning', 'accelerate')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_a_state_made_before_the_process_group_binds_on_first_use(tmp_path: Path) -> None:
    model = _model()
    state, hook = make_hook("mstopk", density=0.2, model=model)
    assert isinstance(state, CommHookState) and not state.bound
    state.density, state.force_dense = 0.5, True  # applied when it binds
    assert state.density == 0.5
    with pytest.raises(AttributeError, match="not bound"):
        _ = state.stats
    clone = pickle.loads(pickle.dumps(state))  # an unbound state pickles too
    assert clone.name == "mstopk" and clone.density == 0.5
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "s"), 1), rank=0,
                            world_size=1)  # fmt: skip
    try:
        ddp = DDP(model, bucket_cap_mb=0.01)
        ddp.register_comm_hook(state, hook)
        ddp(torch.randn(2, 16)).sum().backward()  # the first call binds
        assert state.bound and state.force_dense and state.density == 0.5
        assert state.step == 1 and state.stats.steps == 1
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", ["mstopk", "randomk", "powersgd"])
def test_a_resume_in_another_bucket_layout_continues_exactly(world: None, name: str) -> None:
    """Saved with DDP's buckets of 0.01 MB, loaded into a fresh DDP of one 25 MB bucket:
    the hook goes on reducing in the saved buckets, bit for bit like the run it continues
    (a fresh DDP's first step is in parameter order: a third layout)."""
    opts = {"seed": 3} if name == "randomk" else {}
    opts |= {"warmup_steps": 2, "powersgd_rank": 1} if name == "powersgd" else {"density": 0.1}
    state, ddp, opt = _run(name, 0.01, _model(), **opts)
    _train(ddp, opt, range(4))
    buf = io.BytesIO()
    torch.save({"hook": state.state_dict(), "model": ddp.module.state_dict(),
                "opt": opt.state_dict()}, buf)  # fmt: skip
    want = _train(ddp, opt, range(4, 8))

    buf.seek(0)
    ck = torch.load(buf, weights_only=True)  # tensors, numbers, strings, lists, dicts only
    model = _model(seed=1)
    model.load_state_dict(ck["model"])
    state2, ddp2, opt2 = _run(name, 25.0, model, **opts)
    opt2.load_state_dict(ck["opt"])
    state2.load_state_dict(ck["hook"])
    got = _train(ddp2, opt2, range(4, 8))
    for a, b in zip(want, got, strict=True):
        assert torch.equal(a, b)
    assert state2.discarded == 0 and state2.step == state.step == 8
    again = state2.state_dict()  # saved again: still in the layout it reduces in
    assert again["layout"] == state.state_dict()["layout"]


def test_a_pickled_bound_state_continues_exactly(world: None) -> None:
    state, ddp, opt = _run("topk", 0.01, _model(), density=0.1)
    _train(ddp, opt, range(3))
    blob = pickle.dumps(state)
    saved = copy.deepcopy((ddp.module.state_dict(), opt.state_dict()))
    want = _train(ddp, opt, range(3, 6))

    clone = pickle.loads(blob)
    assert not clone.bound and clone.step == 3
    model = _model(seed=1)
    model.load_state_dict(saved[0])
    clone.set_model(model)  # names back to this process's parameters
    ddp2 = DDP(model, bucket_cap_mb=0.01)
    ddp2.register_comm_hook(clone, make_hook("topk")[1])
    opt2 = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt2.load_state_dict(saved[1])
    for a, b in zip(want, _train(ddp2, opt2, range(3, 6)), strict=True):
        assert torch.equal(a, b)


def test_a_hook_whose_state_has_no_state_dict_is_refused_when_attached(
    world: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registered hook whose state a checkpoint could not save is refused at attach, in
    one line, not left out of the checkpoint; the suite's own hook states all declare it."""
    from bench.comm.hooks import HOOKS, HookSpec, nocomm_hook
    from bench.comm.state import Stateful
    from bench.config import Config
    from bench.registry import ConfigError
    from bench.train.comm import attach

    class Forgetful:  # a hook state with counters but no state_dict()/load_state_dict()
        stats, step, density, force_dense = None, 0, 1.0, False

    spec = HookSpec("forgetful", lambda opts, groups, pg: (Forgetful(), nocomm_hook), False)
    monkeypatch.setitem(HOOKS._items, "forgetful", spec)
    cfg = Config().comm
    cfg.name = "forgetful"
    with pytest.raises(ConfigError) as e:
        attach(DDP(_model()), cfg, steps_per_epoch=4)
    assert str(e.value) == (
        "comm=forgetful: its hook state Forgetful has no state_dict()/load_state_dict(): "
        "a checkpoint could not save it, so it is refused"
    )
    for name in ("dense", "mstopk", "powersgd", "nocomm"):
        state, _ = make_hook(name, model=_model())
        assert isinstance(state.inner, Stateful)


def test_state_that_cannot_be_continued_is_counted_and_warned_about(world: None) -> None:
    state, ddp, opt = _run("mstopk", 0.01, _model(), density=0.1, warmup_steps=1)
    _train(ddp, opt, range(3))
    assert state.discarded == 0  # a dense first step: nothing lost when DDP rebuilt
    sd = state.state_dict()
    kept = sum(r["value"].numel() for r in sd["buckets"]["residuals"])
    assert kept > 0
    other, _, _ = _run("mstopk", 0.01, _model(wide=32), density=0.1)  # other shapes
    with pytest.warns(RuntimeWarning, match="discarded .* another shape"):
        other.load_state_dict(sd)
    assert other.discarded == kept
    with pytest.raises(ValueError, match="'mstopk' loaded into a 'topk'"):
        _run("topk", 0.01, _model())[0].load_state_dict(sd)
    nameless, _ = make_hook("mstopk")
    with pytest.raises(ValueError, match="set_model"):
        nameless.load_state_dict(sd)


def test_a_first_sparse_step_s_residuals_go_on_when_ddp_rebuilds(world: None) -> None:
    """DDP's rebuilt buckets (after the first step) take the first step's residuals over
    by parameter: nothing discarded, nothing warned about (test_comm_feedback.py checks
    that sent + kept = what came in across the rebuild)."""
    state, ddp, opt = _run("mstopk", 0.01, _model(), density=0.1)
    mem = state.inner.comm.memory
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _train(ddp, opt, range(3))  # swept, and carried, before the third step
    assert state.discarded == 0 and not mem.pending and mem.buffers
