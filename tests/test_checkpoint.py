"""Checkpoints in one process: what is saved comes back exactly (model, optimizer in every
update mode, schedule, the comm hook's residuals through its public state API, RNG, clock,
curve), an incompatible config is refused naming the keys, old checkpoints are pruned; a
failed launch still leaves a full record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from bench.config import Config, to_container
from bench.registry import ConfigError
from bench.results import records
from bench.train import checkpoint as ck
from bench.train.comm import attach
from bench.train.loop import checkpoints
from bench.train.runtime import PhaseTimer
from bench.train.state import TrainState


@pytest.fixture(autouse=True)
def one_process_world(tmp_path: Path):
    """A world of one (gloo): DDP and its comm hook run as in a training worker."""
    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def _state(tmp_path: Path, update: str, seed: int = 0) -> TrainState:
    from bench.optim import build_optimizer, build_scheduler

    cfg = Config()
    cfg.results.dir = str(tmp_path)
    cfg.optim.update = update
    cfg.train.keep_checkpoints = 2
    cfg.comm.name, cfg.comm.density, cfg.comm.min_numel = "mstopk", 0.1, 0
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = build_optimizer(model, cfg.optim)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    return TrainState(
        ddp=ddp,
        cfg=cfg,
        run={"run_id": "r1", "launch_time": 0.0},
        rank=0,
        world=1,
        nnodes=1,
        device=torch.device("cpu"),
        workload=None,
        model=model,
        optimizer=opt,
        scheduler=build_scheduler(opt, cfg.optim, steps_per_epoch=4, epochs=3),
        scaler=None,
        comm=attach(ddp, cfg.comm, steps_per_epoch=4),
        autocast=None,
        steps=4,
        timer=PhaseTimer(torch.device("cpu"), False),
    )


def _steps(s: TrainState, n: int) -> None:
    """``n`` training steps through DDP and its mstopk hook (error feedback); the data come
    from the global RNG (restored by a checkpoint)."""
    for _ in range(n):
        x = torch.randn(5, 8)
        loss = s.ddp(x).square().mean()
        loss.backward()
        s.optimizer.step()
        s.optimizer.zero_grad(set_to_none=False)
        s.scheduler.step()
        s.step += 1


@pytest.mark.parametrize("update", ["naive", "foreach", "fused", "flat"])
def test_a_resumed_state_continues_exactly(tmp_path: Path, update: str) -> None:
    a = _state(tmp_path, update)
    _steps(a, 3)
    a.epoch, a.curve = 1, [{"epoch": 1, "loss/train": 1.5}]
    a.evals = [{"step": 2, "epoch": 1, "clock/train_s": 4.0, "acc/top1": 0.5}]  # sub-epoch
    a.clock.load_state_dict({"elapsed": 7.0})
    checkpoints(a).save(barrier=lambda: None)
    _steps(a, 3)  # the uninterrupted run goes on
    b = _state(tmp_path, update, seed=1)  # another process: other weights, other ids
    manifest = ck.latest(tmp_path, "r1")
    assert manifest is not None and manifest["epoch"] == 1
    checkpoints(b).load(manifest)
    assert (b.epoch, b.step, b.clock.elapsed, b.curve) == (1, 3, 7.0, a.curve)
    assert b.evals == a.evals
    assert b.comm.state.step == 3
    _steps(b, 3)
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert b.scheduler.get_last_lr() == a.scheduler.get_last_lr()
    (ra,) = a.comm.state.comm.memory.buffers.values()
    (rb,) = b.comm.state.comm.memory.buffers.values()
    assert torch.equal(ra, rb) and ra.abs().sum() > 0  # came back under this process's ids
    assert b.comm.state.discarded == 0  # (a: its first sparse step, before DDP rebuilt)


def test_old_checkpoints_are_pruned_and_files_are_whole(tmp_path: Path) -> None:
    s = _state(tmp_path, "foreach")
    for epoch in (1, 2, 3):
        s.epoch = epoch
        checkpoints(s).save(barrier=lambda: None)
    d = ck.run_dir(tmp_path, "r1")
    assert sorted(p.name for p in d.glob("epoch-*.json")) == ["epoch-0002.json", "epoch-0003.json"]
    assert sorted(p.name for p in d.iterdir() if p.is_dir()) == ["epoch-0002", "epoch-0003"]
    assert not list(d.rglob(".*tmp"))
    # weights_only loading: nothing but tensors and plain containers inside
    torch.load(d / "epoch-0003" / "common.pt", weights_only=True)
    torch.load(d / "epoch-0003" / "rank0.pt", weights_only=True)


def test_an_incompatible_config_is_refused_naming_the_keys(tmp_path: Path) -> None:
    s = _state(tmp_path, "foreach")
    s.epoch = 1
    checkpoints(s).save(barrier=lambda: None)
    manifest = ck.latest(tmp_path, "r1")
    other = to_container(s.cfg)
    other["optim"]["lr"] = 0.1
    other["comm"]["name"] = "topk"
    other["train"]["epochs"] = 50  # may differ: a longer budget
    with pytest.raises(ConfigError, match=r"comm\.name .*optim\.lr"):
        ck.check_compatible(manifest, other)
    ck.check_compatible(manifest, to_container(s.cfg))


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (TimeoutError("the emulated run did not finish within 5 s"), "error"),
        (ConfigError("link check: measured 0.3 Gbit/s, 1 Gbit/s wanted"), "error"),
        (KeyboardInterrupt(), "interrupted"),
    ],
)
def test_a_failed_launch_leaves_a_full_record_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: BaseException, status: str
) -> None:
    from bench.launch import run as run_mod

    def fail(cfg: Config, run_json: Path) -> int:
        raise exc

    monkeypatch.setattr(run_mod, "launch_workers", fail)
    cfg = Config()
    cfg.results.dir = str(tmp_path)
    meta = {"run_id": "r9", "started_at": records.now_iso(), "launch_time": 0.0}
    if status == "error":
        with pytest.raises(type(exc)):
            run_mod.launch_and_record(cfg, meta, tmp_path / "out")
    else:
        rc, _ = run_mod.launch_and_record(cfg, meta, tmp_path / "out")
        assert rc == 130
    (line,) = records.runs_path(tmp_path).read_text().splitlines()
    rec = json.loads(line)
    assert tuple(rec) == records.RECORD_FIELDS and rec["status"] == status
    assert rec["git_sha"] and rec["hardware"] and rec["versions"] and rec["torch_version"]
    assert rec["reason"] and (str(exc) in rec["reason"] or "interrupted" in rec["reason"])
