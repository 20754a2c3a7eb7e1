"""DeMo (bench/optim/demo.py): the DCT round trip, what is sent plus what stays equals the
momentum, k = a whole chunk is sign-SGD on the averaged gradient, 2 gloo workers apply
the same update, resume is bit for bit, bad values are refused, the performance model
prices its all-gather, and a short run with ``optim=demo`` leaves a record."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
import torch

from bench.benchmarks.spawn import run_workers
from bench.cluster import perfmodel as pm
from bench.comm import cost
from bench.comm.config import CommConfig
from bench.comm.stats import PhaseTimes
from bench.optim import OptimConfig, build_optimizer, validate
from bench.optim.demo import Chunking, DeMo, dct_matrix, packet_bytes
from bench.registry import ConfigError
from bench.train.comm import validate as validate_comm
from tests.conftest import TINY, run_cli

SHAPES = [(10,), (70, 3, 3, 3), (130, 200), (1,), (5, 4)]


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 9), torch.nn.ReLU(), torch.nn.Linear(9, 3))


def _grads(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def test_the_dct_is_orthonormal_and_the_chunks_round_trip() -> None:
    for n in (1, 3, 8, 64):
        d = dct_matrix(n)
        assert torch.allclose(d @ d.T, torch.eye(n), atol=1e-6)
    # DCT-II of a constant is its DC term alone: sqrt(n) * value
    assert torch.allclose(dct_matrix(4) @ torch.ones(4), torch.tensor([2.0, 0, 0, 0]), atol=1e-6)
    torch.manual_seed(0)
    for shape in SHAPES:
        ch = Chunking.of(shape, 64, 32)
        x = torch.randn(shape)
        assert torch.allclose(ch.tensor(ch.coefficients(x)), x, atol=1e-5), shape
    # 130 x 200: 2 x 3 chunks of 64 x 64, then edges of 2 rows and of 8 columns
    ch = Chunking.of((130, 200), 64, 32)
    grids = [(b.grid, b.cr, b.cc) for b in ch.blocks]
    assert grids == [((2, 3), 64, 64), ((2, 1), 64, 8), ((1, 3), 2, 64), ((1, 1), 2, 8)]
    assert ch.pairs == 6 * 32 + 2 * 32 + 3 * 32 + 16
    (vector,) = Chunking.of((10,), 64, 32).blocks
    assert (vector.cr, vector.cc, vector.k) == (1, 10, 10)  # a small chunk is sent whole


def test_what_is_sent_plus_what_stays_equals_the_momentum() -> None:
    torch.manual_seed(1)
    p = torch.nn.Parameter(torch.randn(20, 11))
    opt = DeMo([p], lr=0.1, momentum=0.9, chunk=4, topk=3)
    m0 = torch.randn(20, 11)
    opt.state[p]["momentum"] = m0.clone()
    p.grad = torch.randn(20, 11)
    momentum = 0.9 * m0 + p.grad
    ch, values, idx, sent = opt.extract(p, 0.9)
    kept = opt.state[p]["momentum"]
    assert torch.allclose(sent + kept, momentum, atol=1e-6)
    # the part sent is the inverse DCT of the selected coefficients
    assert torch.allclose(sent, ch.tensor(ch.scatter(values, idx)), atol=1e-6)
    assert [b.cc for b in ch.blocks] == [4, 3]  # 11 columns: 2 chunks of 4, then 3
    for b, full, rest, v, i in zip(
        ch.blocks, ch.coefficients(momentum), ch.coefficients(kept), values, idx, strict=True
    ):
        assert v.shape == (b.chunks, 3) and torch.allclose(v, full.gather(1, i), atol=1e-5)
        # ... which are the k largest in magnitude of each chunk
        mask = torch.zeros_like(full, dtype=torch.bool).scatter_(1, i, True)
        smallest_sent = full.abs().masked_fill(~mask, math.inf).min(dim=1).values
        largest_kept = full.abs().masked_fill(mask, -math.inf).max(dim=1).values
        assert (smallest_sent >= largest_kept).all()
        # what stays holds every other coefficient and none of the sent ones
        assert rest.masked_select(mask).abs().max() < 1e-5
        assert torch.allclose(rest.masked_select(~mask), full.masked_select(~mask), atol=1e-5)
    assert 0 < sent.norm() < momentum.norm()


def test_k_equal_to_a_chunk_is_sign_sgd_on_the_gradient() -> None:
    """Nothing stays in the momentum: every step is x <- x (1 - lr wd) - lr sign(g)."""
    model, ref = _net(), _net()
    opt = DeMo(
        [{"params": list(model.parameters()), "weight_decay": 0.1}],
        lr=0.01,
        momentum=0.9,
        chunk=4,
        topk=16,
    )
    for step in range(3):
        _grads(model, step)
        opt.step()
        with torch.no_grad():
            for q, p in zip(ref.parameters(), model.parameters(), strict=True):
                q.mul_(1 - 0.01 * 0.1).add_(p.grad.sign(), alpha=-0.01)
        assert max(st["momentum"].abs().max().item() for st in opt.state.values()) < 1e-5
    for q, p in zip(ref.parameters(), model.parameters(), strict=True):
        assert torch.allclose(q, p, atol=1e-7)


def _two_workers(rank: int, world: int) -> dict:
    """Each worker: the same start, its own gradients; DeMo's weights after 3 steps."""
    out = {}
    for name, topk in (("sparse", 2), ("whole", 16)):
        model = _net()
        opt = DeMo(model.parameters(), lr=0.05, momentum=0.9, chunk=4, topk=topk)
        sent = []
        opt.on_send = lambda *told, out=sent: out.append(told)
        opt.times = PhaseTimes()
        grads = []
        for step in range(3):
            _grads(model, 100 * rank + step)
            grads.append([p.grad.clone() for p in model.parameters()])
            opt.step()
        out[name] = {
            "times": opt.times.pop(),
            "weights": [p.detach().tolist() for p in model.parameters()],
            "momentum": [st["momentum"].tolist() for st in opt.state.values()],
            "grads": [[g.tolist() for g in gs] for gs in grads],
            "sent": sent,
        }
    return out


def test_two_gloo_workers_apply_the_same_update() -> None:
    r0, r1 = run_workers(_two_workers, 2, 1, timeout_s=200)
    start = [p.detach() for p in _net().parameters()]
    shapes = [p.shape for p in start]
    for name in ("sparse", "whole"):
        a, b = r0[name], r1[name]
        assert a["weights"] == b["weights"], name  # bit for bit
        assert a["sent"] == b["sent"] and len(a["sent"]) == 3
        # its transform and decode timed as selection, its all-gather as communication
        assert all(t > 0 for t in a["times"]) and all(t > 0 for t in b["times"])
        packet, pairs, numel = a["sent"][0]
        assert packet == packet_bytes(shapes, 4, 16 if name == "whole" else 2) == 6 * pairs
        assert numel == sum(p.numel() for p in start)
        moved = [torch.tensor(w) - p for w, p in zip(a["weights"], start, strict=True)]
        assert all(m.abs().max() > 0 for m in moved)
    # the error stays local: the workers' momenta differ
    assert r0["sparse"]["momentum"] != r1["sparse"]["momentum"]
    # k = a whole chunk: sign-SGD on the workers' averaged gradient, step by step
    expect = [p.clone() for p in start]
    for step in range(3):
        for i, p in enumerate(expect):
            g0 = torch.tensor(r0["whole"]["grads"][step][i])
            g1 = torch.tensor(r1["whole"]["grads"][step][i])
            p.add_(((g0 + g1) / 2).sign(), alpha=-0.05)
    for w, p in zip(r0["whole"]["weights"], expect, strict=True):
        assert torch.allclose(torch.tensor(w), p, atol=1e-6)


def test_resume_continues_bit_for_bit() -> None:
    def run(steps: range, model: torch.nn.Module, opt: DeMo) -> None:
        for step in steps:
            _grads(model, step)
            opt.step()

    cfg = OptimConfig(name="demo", update="naive", lr=0.01, momentum=0.999, demo_chunk=4)
    cfg.demo_topk = 3
    whole = _net()
    run(range(4), whole, build_optimizer(whole, cfg))
    first = _net()
    opt = build_optimizer(first, cfg)
    run(range(2), first, opt)
    buf = io.BytesIO()
    torch.save({"model": first.state_dict(), "optimizer": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf)
    resumed = _net(seed=7)
    resumed.load_state_dict(saved["model"])
    opt2 = build_optimizer(resumed, cfg)
    opt2.load_state_dict(saved["optimizer"])
    assert all("momentum" in st for st in opt2.state.values()) and len(opt2.state) == 4
    run(range(2, 4), resumed, opt2)
    for a, b in zip(whole.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


def test_each_worker_s_momenta_go_to_its_own_checkpoint_shard() -> None:
    """DeMo's error stays on its worker: its optimizer is this rank's share of a checkpoint
    (rank 0's ``common.pt`` alone would resume every worker with rank 0's momenta)."""
    from bench.train.comm import attach

    cfg = OptimConfig(name="demo", update="naive", momentum=0.999, demo_chunk=4, demo_topk=3)
    model = _net()
    opt = build_optimizer(model, cfg)
    ctl = attach(model, CommConfig(name="nocomm"), 4, optimizer=opt, optim=cfg)
    assert ctl.states()["exchange"] is opt and opt.on_send is not None
    sgd = OptimConfig(name="sgd")
    plain = attach(model, CommConfig(name="dense"), 4, build_optimizer(model, sgd), optim=sgd)
    assert set(plain.states()) == {"hook"}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"demo_chunk": 0}, "optim.demo_chunk must be >= 1"),
        ({"demo_topk": 0}, r"optim.demo_topk must be in \[1, 4096\]"),
        ({"demo_chunk": 4, "demo_topk": 17}, r"in \[1, 16\] \(the elements of a 4 x 4 chunk\)"),
        ({"momentum": 1.0}, r"DeMo's decay\) must be in \[0, 1\)"),
        ({"update": "flat"}, "optim.update=flat is not available for optim=demo"),
    ],
)
def test_bad_values_are_refused_in_one_line(fields: dict, message: str) -> None:
    cfg = OptimConfig(**{"name": "demo", "update": "naive", "momentum": 0.999, **fields})
    with pytest.raises(ConfigError, match=message) as e:
        validate(cfg)
    assert "\n" not in str(e.value)


def test_demo_needs_the_local_gradients_of_nocomm() -> None:
    for comm in ("dense", "topk", "hitopk", "powersgd"):
        with pytest.raises(ConfigError, match=f"use comm=nocomm, not comm={comm}"):
            validate_comm(CommConfig(name=comm), 4, 2, optim=OptimConfig(name="demo"))
    validate_comm(CommConfig(name="nocomm"), 2, 1, optim=OptimConfig(name="demo"))
    validate_comm(CommConfig(name="topk"), 2, 1, optim=OptimConfig(name="sgd"))


def test_the_model_prices_the_allgather_on_the_paper_cluster() -> None:
    from bench.cluster import projection

    _, shapes = projection.model_buckets("resnet50")
    params = [s for b in shapes for s in b]
    packet = packet_bytes(params, 64, 32)
    pairs = sum(Chunking.of(s, 64, 32).pairs for s in params)
    numel = sum(math.prod(s) for s in params)
    assert packet == 6 * pairs and numel == pm.RESNET50_NUMEL
    assert 70 < 4 * numel / packet < 80  # a worker's packet against its dense gradient
    k = projection.GPU_COSTS
    for nodes in (2, 16):
        c = projection.paper_cluster(nodes, 25, 0.7)
        w = c.world
        assert cost.demo(packet, nodes, 8).link_bytes == (w - 1) * packet
        # one flat ring allgather over the slow link: (w - 1) steps of one packet
        wire = (w - 1) * (c.inter_lat + packet / c.inter_bw)
        compute = numel * (k.select_s + 3 * k.dense_s) + w * pairs * k.scatter_s
        assert pm.demo_exchange(params, 64, 32, c, k) == pytest.approx(wire + compute)
    # a flat allgather grows with the workers: a third of dense's time on 2 x 8, more on 16 x 8
    wl = projection.paper_workload(0.1, {})
    from bench.methods import get

    dense = [
        get("dense").aggregation_time(wl.buckets, projection.paper_cluster(n, 25, 0.7), k, None)
        for n in (2, 16)
    ]
    demo = [
        pm.demo_step_time(wl, 64, 32, projection.paper_cluster(n, 25, 0.7), k) - 0.1 - wl.update_s
        for n in (2, 16)
    ]
    assert demo[0] < dense[0] / 2 and demo[1] > dense[1]
    one = pm.demo_exchange(params, 64, 32, pm.Cluster(1, 1, 1.0), k)
    assert one == pytest.approx(numel * (k.select_s + 3 * k.dense_s) + pairs * k.scatter_s)


@pytest.mark.slow
def test_a_short_demo_run_writes_a_record(tmp_path: Path) -> None:
    refused = run_cli("train", "optim=demo", f"results.dir={tmp_path}", *TINY)
    assert refused.returncode != 0 and "use comm=nocomm" in refused.stderr + refused.stdout
    assert not (tmp_path / "runs.jsonl").exists()
    p = run_cli(
        "train",
        "optim=demo",
        "comm=nocomm",
        "optim.demo_chunk=8",
        "optim.demo_topk=4",
        f"results.dir={tmp_path}",
        "train.epochs=1",
        *TINY,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (line,) = (tmp_path / "runs.jsonl").read_text().splitlines()
    rec = json.loads(line)
    assert rec["comm"] == "nocomm" and rec["config"]["optim"]["name"] == "demo"
    assert rec["status"] in ("ok", "target_missed") and rec["world_size"] == 2
    # each step: one packet of 6-byte pairs to the other worker, and the 4-byte barrier
    assert rec["comm_bytes_per_step"] > 4 and (rec["comm_bytes_per_step"] - 4) % 6 == 0


@pytest.mark.slow
def test_a_two_worker_run_resumed_from_its_first_epoch_goes_on_bit_for_bit(tmp_path: Path) -> None:
    """Each worker's momenta come back from its own shard: the resumed second epoch equals
    the uninterrupted one (with rank 0's momenta on both workers it did not)."""
    import shutil

    import pandas as pd

    args = ["optim=demo", "comm=nocomm", "optim.demo_chunk=8", "optim.demo_topk=4",
            "train.epochs=2", "train.stop_at_target=false", "train.max_steps_per_epoch=3",
            "train.keep_checkpoints=3", *[o for o in TINY if "max_steps" not in o]]  # fmt: skip
    p = run_cli("train", f"results.dir={tmp_path / 'ref'}", *args)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    shutil.copytree(tmp_path / "ref", tmp_path / "cut")
    (rec,) = [
        json.loads(line) for line in (tmp_path / "ref" / "runs.jsonl").read_text().splitlines()
    ]
    (tmp_path / "cut" / "runs.jsonl").unlink()  # as if it had stopped after epoch 1's checkpoint
    for p2 in (tmp_path / "cut" / "checkpoints" / rec["run_id"]).glob("epoch-0002*"):
        shutil.rmtree(p2) if p2.is_dir() else p2.unlink()
    p = run_cli("train", f"resume={rec['run_id']}", f"results.dir={tmp_path / 'cut'}")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    curves = [pd.read_csv(next((tmp_path / d / "curves").glob("*.csv"))) for d in ("ref", "cut")]
    cols = ["loss/train", "acc/train_top1", "loss/eval"]
    pd.testing.assert_frame_equal(curves[0][cols], curves[1][cols], check_exact=True)
