"""The per-step phase log (bench.comm.stats, bench.train.comm): each step noted as the
method, density and rank the hook sent it as, warm-up and density schedule on the step
axis, PowerSGD's uncompressed steps before its start, written to the curve and record."""

import os

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from bench.comm.config import CommConfig
from bench.comm.stats import PHASES, CommStats, Segment, format_phases, merge, parse_phases
from bench.results import columns as col
from bench.results.records import _phases
from bench.train.comm import CommController, attach


def _cfg(**kw) -> CommConfig:
    return OmegaConf.merge(OmegaConf.structured(CommConfig), kw)  # type: ignore[return-value]


def test_the_log_is_run_length_and_reads_back():
    st = CommStats()
    for step in range(5):
        st.begin_step(*(("dense", 1.0) if step < 2 else ("topk", 0.01)))
        st.bytes += 100.0 if step < 2 else 4.0
        st.steps += 1
    out = st.pop()
    assert out[PHASES] == "dense/1/0/2/100;topk/0.01/0/3/4" and PHASES == col.COMM_PHASES
    segs = parse_phases(out[PHASES])
    assert segs == [Segment("dense", 1.0, 0, 2, 200.0), Segment("topk", 0.01, 0, 3, 12.0)]
    assert format_phases(merge(segs + segs[1:])) == "dense/1/0/2/100;topk/0.01/0/6/4"
    assert PHASES not in st.pop()  # nothing since: no log
    assert parse_phases(float("nan")) == []


def test_the_controller_schedules_on_the_step_axis():
    cfg = _cfg(name="topk", density=0.01, warmup_steps=3, density_schedule=[0.1, 0.05, 0.01])
    cfg.schedule_steps = 2
    c = CommController(None, cfg, steps_per_epoch=100)
    got = [c.density_for(0, s) for s in range(10)]
    assert got == [1.0, 1.0, 1.0, 0.1, 0.1, 0.05, 0.05, 0.01, 0.01, 0.01]
    # per epoch as before when schedule_steps is 0
    old = CommController(None, _cfg(name="topk", warmup_epochs=1, density_schedule=[0.1]), 10)
    assert [old.density_for(e) for e in range(3)] == [1.0, 0.1, 0.1]
    assert old.dense_steps() == 10


@pytest.fixture
def one_process_group():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(29500 + os.getpid() % 1000)
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _train(cfg: CommConfig, steps: int) -> list[dict]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ctl = attach(ddp, cfg, steps_per_epoch=steps)
    ctl.set_epoch(0)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        ddp(torch.randn(8, 64)).sum().backward()
        opt.step()
    return [ctl.pop_stats()]


def test_a_ddp_run_logs_each_step_as_its_hook_sent_it(one_process_group):
    cfg = _cfg(name="topk", density=0.01, warmup_steps=2, density_schedule=[0.1, 0.01])
    cfg.schedule_steps, cfg.min_numel = 3, 0
    curve = _train(cfg, 8)
    segs = parse_phases(curve[0][PHASES])
    assert [(s.method, s.density, s.steps) for s in segs] == [
        ("dense", 1.0, 2),
        ("topk", 0.1, 3),
        ("topk", 0.01, 3),
    ]
    assert all(s.bytes == 0 for s in segs)  # one worker sends nothing (bytes: the cost model's)
    rec = _phases(curve)
    assert [r["steps"] for r in rec] == [2, 3, 3] and rec[0]["method"] == "dense"


def test_powersgd_logs_its_uncompressed_start(one_process_group):
    cfg = _cfg(name="powersgd", powersgd_rank=2, warmup_steps=4)
    segs = parse_phases(_train(cfg, 7)[0][PHASES])
    assert [(s.method, s.rank, s.steps) for s in segs] == [("dense", 0, 4), ("powersgd", 2, 3)]
