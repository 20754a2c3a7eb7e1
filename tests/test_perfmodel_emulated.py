"""The performance model on the clusters the answer quotes: an emulated cluster priced from
its shaped link and measured compute, each workload its own network, PowerSGD's compute
priced, the constants read from calibration rows, and a projected time's assumption band."""

import csv
import math
from dataclasses import replace

import pytest

from bench import methods as M
from bench.cluster import calibration, projection
from bench.cluster import perfmodel as pm
from bench.registry import ConfigError
from bench.sweeps import ratios as R

LOOP = (1e-4, 1e9)  # a loopback path: 0.1 ms per message step, 1 GB/s


def _price(name, wl, c, k, **knobs):
    s = M.get(name)
    return s.step_time(wl, c, k, s.knobs_of(knobs))


def test_an_emulated_cluster_has_its_shaped_link_and_measured_compute():
    c = pm.emulated(30e6, 2, 2, compute_s=0.5, loopback=LOOP)
    f = c.slowdown
    assert f >= 1 and c.world == 4 and c.compute_s == 0.5
    # the shaped rate less TCP/IP framing; the netem delay plus a message step per step
    assert c.inter_bw == pytest.approx(30e6 / 8 * pm.link_efficiency())
    assert 0.9 < pm.link_efficiency() < 1
    assert c.inter_lat == pytest.approx(2e-4 + 1e-4 * f)
    assert c.intra_bw == pytest.approx(1e9 / f) and c.intra_lat == pytest.approx(1e-4 * f)
    # the step: the measured compute replaces the workload's compute and update
    wl = pm.Workload(buckets=(100_000, 50_000), compute_s=9.0, update_s=3.0)
    bare = replace(c, compute_s=None, slowdown=1.0)
    ring = sum(pm.ring_allreduce(d, bare, pm.Costs()) for d in wl.buckets)
    assert _price("dense", wl, c, pm.Costs()) == pytest.approx(0.5 + ring)
    # per-element costs run slower by the workers sharing the cores
    k = pm.Costs(dense_s=1e-8)
    extra = _price("dense", wl, c, k) - _price("dense", wl, c, pm.Costs())
    assert extra == pytest.approx(f * 1e-8 * sum(wl.buckets))
    with pytest.raises(ValueError, match="positive link"):
        pm.emulated(0, 2, 2, 0.5, loopback=LOOP)


def test_each_workload_is_priced_with_its_own_network():
    image, text = pm.workload_shapes("dawnbench_digits"), pm.workload_shapes("transformer_protocol")
    for wl in (image, text):
        assert wl.shapes and [sum(math.prod(s) for s in b) for b in wl.shapes] == list(wl.buckets)
        assert wl.numel not in (pm.RESNET50_NUMEL, 0)
    flat = {name: [s for b in wl.shapes for s in b] for name, wl in (("i", image), ("t", text))}
    assert any(len(s) == 4 for s in flat["i"])  # the ResNet-9's convolutions
    assert not any(len(s) > 2 for s in flat["t"])  # the Transformer's matrices only
    assert image.numel != text.numel
    with pytest.raises(ConfigError, match="experiment 'nope'"):
        pm.workload_shapes("nope")
    # the projection's network per workload: the Transformer's, not ResNet-50's
    base = projection.paper_workload(0.1, {}, workload="translation")
    assert base.numel == sum(projection.model_buckets("transformer_base", vocab=32000)[0])
    assert projection.paper_workload(0.1, {}).numel == pm.RESNET50_NUMEL
    # so at one ratio PowerSGD's price differs by workload (its matrices differ)
    k = M.get("powersgd").knobs_of({"comm.powersgd_rank": 4})
    at = {
        w: R.step_time_s("powersgd", k, 1.34, workload=w) for w in ("classification", "translation")
    }
    assert at["classification"] != pytest.approx(at["translation"], rel=1e-3)


def test_the_compute_for_a_ratio_makes_dense_take_that_ratio_of_it_on_each_workload():
    for w in ("classification", "translation"):
        compute = R.compute_for_ratio(2.0, w)
        wl = projection.paper_workload(compute, {}, workload=w)
        step = R.step_time_s("dense", M.get("dense").knobs_of({}), 2.0, hidden=0.0, workload=w)
        assert (step - compute - wl.update_s) / compute == pytest.approx(2.0)


def test_powersgd_prices_its_products_and_orthogonalisation():
    k = pm.Costs(matmul_s=1e-12, matmul_call_s=1e-6, qr_s=1e-11, qr_call_s=1e-5)
    # 1000 x 1000 at rank 4: three products of 8e6 flops and calls, one QR of 32,000 flops;
    # a vector and a 4 x 4 matrix are sent whole (no products)
    expect = 3 * (1e-6 + 8e6 * 1e-12) + 1e-5 + 2 * 1000 * 16 * 1e-11
    assert pm.lowrank_time([(1000, 1000), (10,), (4, 4)], 4, k) == pytest.approx(expect)
    assert pm.lowrank_time([(1000, 1000)], 8, k) > expect  # the rank's flops
    c = pm.Cluster(2, 2, inter_bw=1e6)
    wl = pm.Workload(buckets=(1_000_010,), compute_s=1.0, shapes=(((1000, 1000), (10,)),))
    more = _price("powersgd", wl, c, k) - _price("powersgd", wl, c, pm.Costs())
    assert more == pytest.approx(expect)


def _write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=calibration.FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows({"device": "X", "hardware": "x", **r} for r in rows)


def test_the_cost_table_is_read_from_the_calibration_rows(tmp_path):
    def model(name, scale):
        per = {"reduce_s": 1e-9, "dense_s": 2e-9, "matmul_s": 1e-11, "matmul_call_s": 1e-6,
               "qr_s": 1e-10, "qr_call_s": 1e-5}  # fmt: skip
        rows = [{"model": name, "quantity": q, "value": v * scale} for q, v in per.items()]
        rows += [{"model": name, "quantity": "fwd_bwd_s", "value": 1.0, "n": 1000, "batch": 8},
                 {"model": name, "quantity": "dct_s", "value": 1e-5 * scale, "n": 1000},
                 {"model": name, "quantity": "select_s[mstopk]", "value": 3e-8 * scale,
                  "density": 0.01},
                 {"model": name, "quantity": "select_s[topk]", "value": 9e-8 * scale,
                  "density": 0.01},
                 {"model": name, "quantity": "scatter_s", "value": 5e-9 * scale,
                  "density": 0.01}]  # fmt: skip
        return rows

    loop = [{"model": calibration.LOOPBACK, "quantity": "loopback_lat_s", "value": 5e-5},
            {"model": calibration.LOOPBACK, "quantity": "loopback_s", "value": 1e-9}]  # fmt: skip
    path = tmp_path / "x.csv"
    _write(path, model("a", 1.0) + model("b", 3.0) + loop)
    k = calibration.costs(path)
    assert isinstance(k, pm.Costs)
    # the median of the two models (2x the first's), each selector with its EF addition
    assert k.matmul_s == pytest.approx(2e-11) and k.qr_call_s == pytest.approx(2e-5)
    assert k.selectors["mstopk"] == pytest.approx(6e-8 + 2e-9)
    assert k.using("topk").select_s == pytest.approx(18e-8 + 2e-9)
    # DeMo's transform per element, less its three elementwise passes
    assert k.selectors[calibration.DCT] == pytest.approx(2e-5 / 1000 - 3 * 4e-9)
    assert calibration.costs(path, model="a").matmul_s == pytest.approx(1e-11)
    assert calibration.loopback(path) == pytest.approx((5e-5, 1e9))
    c = pm.emulated(30e6, 2, 2, 0.5, loopback=calibration.loopback(path))
    assert c.intra_bw == pytest.approx(1e9 / c.slowdown)
    _write(path, model("a", 1.0)[:2])
    with pytest.raises(KeyError, match="no .* measured on"):
        calibration.costs(path)
    with pytest.raises(FileNotFoundError, match="gpucheck.calibrate --cpu"):
        calibration.costs("no such device", root=tmp_path)


def test_this_cpu_has_measured_constants():
    from bench.results.env import cpu_model

    if calibration.device_slug(cpu_model()) not in calibration.devices():
        pytest.skip(f"no calibration rows for this CPU ({cpu_model()})")
    k = calibration.costs("cpu")
    for name in ("select_s", "scatter_s", "dense_s", "reduce_s", "matmul_s", "qr_call_s"):
        assert 0 < getattr(k, name) < 1e-3, name
    lat, bw = calibration.loopback("cpu")
    assert 0 < lat < 0.1 and bw > 1e7  # loopback: under 100 ms a message, over 10 MB/s
    wl = pm.workload_shapes("transformer_protocol")
    c = pm.emulated(30e6, 2, 2, compute_s=0.3)
    steps = {m: _price(m, wl, c, k) for m in ("dense", "powersgd", "hitopk")}
    assert all(s > 0.3 for s in steps.values())
    assert steps["powersgd"] < steps["dense"] and steps["hitopk"] < steps["dense"]


def test_a_projected_time_carries_its_assumption_band(tmp_path):
    k = M.get("dense").knobs_of({})
    run = R.Run("r", "dense", "dense", 0, True, (R.Phase(100, "dense", k),), 1.0, 1.0, 100,
                workload="translation")  # fmt: skip
    other = replace(run, run_id="s", seed=1, phases=(R.Phase(120, "dense", k),))
    mean, low, high = R.time_band([run, other], 1.34)
    assert low < mean < high  # nothing hidden and a slow NIC; all hidden and a fast one
    assert mean == pytest.approx(110 * R.step_time_s("dense", k, 1.34, workload="translation"))
    assert R.corner_times(run, 1.34)[0] == pytest.approx(R.run_time_s(run, 1.34))
    assert all(math.isnan(x) for x in R.time_band([], 1.34))
