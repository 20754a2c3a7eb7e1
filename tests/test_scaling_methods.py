"""The scaling study's methods beyond the comm hooks: DeMo and the sync strategies are
selected as the protocol selects them, keyed by method in the table, and predicted from
the same calibration by ``pm.demo_step_time`` and ``pm.sync_step_time``."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from bench.cluster import perfmodel as pm
from bench.cluster.calibration import DCT
from bench.methods import get
from bench.sweeps import scaling as sc
from bench.sweeps import scaling_model as sm
from bench.sweeps import scaling_table as st

SHAPES = (((256, 64, 3, 3), (256,)), ((128, 256), (128,)))
BUCKETS = tuple(sum(torch.Size(s).numel() for s in b) for b in SHAPES)


def _k(name: str, h: int, fragments: int, delay: int):
    """A sync strategy's knobs: H, fragments, fragment delay."""
    keys = ("sync.sync_every", "sync.fragments", "sync.fragment_sync_delay")
    return get(name).knobs_of(dict(zip(keys, (h, fragments, delay), strict=True)))


def _calibration() -> sm.Calibration:
    return sm.Calibration(buckets=BUCKETS, shapes=SHAPES, reduce_s=1e-9, dense_s=1e-9,
                          scatter_s=1e-8, select_s={"mstopk": 1e-8, DCT: 5e-8},
                          update_s=0.002, msg_lat_s=1e-4, intra_bw=1e9, cores=2)  # fmt: skip


def _model(n: int, m: int, link_bps: float) -> tuple[pm.Workload, pm.Cluster, pm.Costs]:
    """The cluster, costs and workload :func:`sm.predict` builds (contention included)."""
    cal, f = _calibration(), sm.contention(n, m, 2)
    c = pm.Cluster(n, m, inter_bw=link_bps / 8 * pm.link_efficiency(),
                   inter_lat=cal.msg_lat_s * f, intra_bw=cal.intra_bw / f,
                   intra_lat=cal.msg_lat_s * f)  # fmt: skip
    wl = pm.Workload(buckets=BUCKETS, compute_s=0.3, update_s=cal.update_s * f, shapes=SHAPES,
                     hidden={"demo": 0.0, "diloco": 0.0})  # fmt: skip
    k = pm.Costs(select_s=5e-8 * f, scatter_s=1e-8 * f, dense_s=1e-9 * f, reduce_s=1e-9 * f)
    return wl, c, k


@pytest.mark.parametrize("n,m", [(2, 2), (4, 2)])
def test_sync_strategies_are_the_node_step_plus_the_outer_allreduce_amortised(n, m):
    cal, bw = _calibration(), 40e6
    wl, c, k = _model(n, m, bw)
    dil = sm.predict("diloco", n, m, 0.3, bw, cal, _k("diloco", 10, 1, 0))["predicted_step_s"]
    dense_spec = get("dense")
    inner = dense_spec.step_time(wl, replace(c, nodes=1), k, dense_spec.knobs_of({}))
    outer = pm.outer_sync_time(sum(BUCKETS), c)
    assert outer == pytest.approx(m * 4 * 2 * (n - 1) / n * sum(BUCKETS) / c.inter_bw
                                  + 2 * (n - 1) * c.inter_lat)  # fmt: skip
    assert dil == pytest.approx(inner + outer / 10, rel=1e-6)
    dense = sm.predict("dense", n, m, 0.3, bw, cal)["predicted_step_s"]
    assert inner < dil < dense  # an all-reduce every 10 steps, not every step
    # Streaming DiLoCo: 2 fragments of half the model, each behind one inner step
    stream = sm.predict("streaming_diloco", n, m, 0.3, bw, cal, _k("streaming_diloco", 10, 2, 1))
    frag = pm.outer_sync_time(sum(BUCKETS) / 2, c)
    hidden = 2 * max(0.0, frag - inner) / 10
    assert stream["predicted_step_s"] == pytest.approx(inner + hidden, rel=1e-6)
    assert stream["predicted_step_s"] <= dil
    assert stream["predicted_compute_only_step_s"] == pytest.approx(0.3 + wl.update_s)


@pytest.mark.parametrize("n,m", [(2, 2), (4, 2)])
def test_demo_is_compute_its_allgather_and_own_work_then_the_update(n, m):
    cal, bw = _calibration(), 40e6
    wl, c, k = _model(n, m, bw)
    demo = get("demo").knobs_of({"optim.demo_chunk": 64, "optim.demo_topk": 32})
    got = sm.predict("demo", n, m, 0.3, bw, cal, demo)["predicted_step_s"]
    assert got == pytest.approx(pm.demo_step_time(wl, 64, 32, c, k), rel=1e-6)
    shapes = [s for b in SHAPES for s in b]
    exchange = pm.demo_exchange(shapes, 64, 32, c, k)
    assert got == pytest.approx(0.3 + exchange + wl.update_s, rel=1e-6)
    # its own work is priced from the calibration's DeMo cost, per element
    numel = sum(BUCKETS)
    assert exchange > numel * 5e-8 * sm.contention(n, m, 2)
    assert got < sm.predict("dense", n, m, 0.3, bw, cal)["predicted_step_s"]


def test_the_plan_selects_each_method_as_the_protocol_does():
    plan = sc.Plan(sweep_id="x", comms=("dense", "demo", "diloco", "streaming_diloco"),
                   topologies=((1, 1), (2, 2), (4, 2)), extra=("sync.sync_every=4",))  # fmt: skip
    plan.check()
    jobs = {p[:3]: j for p, j in plan.jobs() if p[3] == sc.SEED}
    assert {"optim=demo", "comm=nocomm"} <= set(jobs[(2, 2, "demo")])
    assert "sync=diloco" in jobs[(4, 2, "diloco")]
    assert "sync=streaming_diloco" in jobs[(2, 2, "streaming_diloco")]
    assert (1, 1, "diloco") not in jobs  # one node has nothing to synchronise
    # H = 4 at 5 steps an epoch: a warm-up epoch, then 4 epochs of 20 steps (5 periods)
    assert "train.epochs=5" in jobs[(4, 2, "diloco")] and plan.schedule("diloco") == (1, 4)
    assert "train.epochs=3" in jobs[(4, 2, "demo")]  # DeMo exchanges every step
    assert any("diloco on 1x1" in s for s in plan.skipped())
    knobs = plan.knobs()
    assert (knobs["diloco"].sync_every, knobs["diloco"].fragments) == (4, 1)
    assert (knobs["streaming_diloco"].sync_every, knobs["streaming_diloco"].fragments) == (4, 2)
    assert (knobs["demo"].chunk, knobs["demo"].topk) == (64, 32)


def test_records_are_keyed_by_method_so_demo_is_not_the_compute_only_run(tmp_path):
    curve = tmp_path / "c.csv"
    curve.write_text("data/samples,data/steps,clock/epoch_s\n64,2,9.0\n64,2,1.0\n")

    def rec(comm: str, **cfg) -> dict:
        return {"comm": comm, "status": "ok", "run_id": comm, "curve": str(curve),
                "config": {"cluster": {"nnodes": 2, "nproc_per_node": 2},
                           "train": {"seed": sc.SEED}, **cfg}}  # fmt: skip

    demo = rec("nocomm", optim={"name": "demo"})
    dil = rec("dense", sync={"name": "diloco"})
    assert sc.key_of(demo) == (2, 2, "demo", sc.SEED)
    assert sc.key_of(dil) == (2, 2, "diloco", sc.SEED)
    assert sc.key_of(rec("nocomm", optim={"name": "sgd"})) == (2, 2, "nocomm", sc.SEED)
    rows = st.measured_rows([demo, dil], {})
    assert {r["comm"] for r in rows} == {"demo", "diloco"}


def test_demo_calibration_measures_its_own_work_per_element():
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 10))
    s = sm.demo_select_s(net, 8, 4, dense_s=0.0)
    assert 0 < s < 1e-3
    assert sm.demo_select_s(net, 8, 4, dense_s=1.0) == 0.0  # never below zero
