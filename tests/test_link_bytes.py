"""Bytes on the wire: what a run logs leaving each node per step (its hook's, DeMo's or the
outer synchronisation's count, with TCP/IP framing) against the emulated link's interface
counters read over the training steps only (the record's ``link_bytes``)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bench.cluster import emulated
from bench.cluster.emulated import LinkClock, link_bytes, wire_comparison
from bench.comm import cost
from tests.conftest import run_cli


def test_the_clock_counts_the_link_only_while_it_runs(monkeypatch):
    counters = iter([(100, 50), (1100, 550), (5000, 5000), (5400, 5200)])
    monkeypatch.setattr(emulated, "link_counters", lambda: next(counters))
    clock = LinkClock(node=1)
    clock.start()
    clock.start()  # already running: no second reading
    clock.pause()
    clock.pause()  # already paused: nothing read
    clock.resume()  # an evaluation's 3900 bytes in between are not counted
    clock.pause()
    assert clock.reading() == (1, 1000 + 400, 500 + 200)
    assert LinkClock(node=None).reading() is None


def test_a_worker_reads_counters_only_as_an_emulated_nodes_first(monkeypatch):
    monkeypatch.delenv(emulated.NODE_ENV, raising=False)
    assert LinkClock.of_worker(0).node is None  # not an emulated cluster
    monkeypatch.setenv(emulated.NODE_ENV, "3")
    assert LinkClock.of_worker(0).node == 3
    assert LinkClock.of_worker(1).node is None  # the node's other workers


def test_link_bytes_per_step_beside_the_logged_bytes_on_the_wire():
    logged = 1_000_000.0
    wire = cost.on_wire(logged, logged)
    readings = [None, (1, int(1.02 * wire) * 10, 7 * 10), (0, int(0.98 * wire) * 10, 5 * 10)]
    lb = link_bytes(readings, 10, logged)
    assert [n["node"] for n in lb["nodes"]] == [0, 1]
    assert lb["per_node_per_step"][0] == [pytest.approx(0.98 * wire, abs=1), 5.0]
    assert lb["predicted_wire_bytes"] == pytest.approx(wire)
    assert lb["ratio"] == pytest.approx(1.0, abs=1e-6)
    assert link_bytes([None, None], 10, logged) is None  # no node read: not emulated
    assert link_bytes(readings, 0, logged) is None
    assert "ratio" not in link_bytes(readings, 10, None)  # nothing logged: the counters alone


def test_the_benchmark_and_the_record_compare_alike():
    from bench.benchmarks.cluster import _wire

    res = {"nodes": 2, "procs_per_node": 1, "buckets": [100_000], "density": 1.0}
    link = cost.allreduce(100_000, 2, 1).link_bytes
    res["dense"] = {"wire_bytes": [[cost.on_wire(link, link), 0.0]] * 2}
    assert _wire("dense", res) == wire_comparison(link, [cost.on_wire(link, link)] * 2)
    assert abs(_wire("dense", res)["wire_error"]) < 1e-12


# --- measured: 2 emulated nodes x 1 worker, the digits recipe, a few dozen steps --------
# 3 epochs of 11 steps (the digits' training set at 128 a step), an evaluation after each
STEPS, EPOCHS = 12, 3
METHODS = {
    "dense": [],
    "demo": ["optim=demo", "comm=nocomm"],
    "diloco": ["sync=diloco", "sync.sync_every=4"],  # 8 outer all-reduces in 33 steps
}


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("tc"), reason="needs root and iproute2 (ip, tc)"
)
def test_logged_bytes_match_the_link_counters_within_10_percent(tmp_path: Path):
    from bench.cluster import netns

    before = set(netns.list_resources())
    common = [
        "experiment=dawnbench_digits", "cluster=emulated", "cluster.nnodes=2",
        "cluster.nproc_per_node=1", "cluster.link_check=false", f"train.epochs={EPOCHS}",
        f"train.max_steps_per_epoch={STEPS}", "train.stop_at_target=false",
        "train.checkpoint_every=0", "train.progress=false", "results.plot=false",
        f"results.dir={tmp_path}",
    ]  # fmt: skip
    seen = {}
    for method, over in METHODS.items():
        p = run_cli("train", *common, *over, timeout=900)
        assert p.returncode == 0, (method, (p.stdout + p.stderr)[-4000:])
        last = (tmp_path / "runs.jsonl").read_text().splitlines()[-1]
        seen[method] = json.loads(last)["link_bytes"]
    print(json.dumps(seen, indent=1))
    for method, lb in seen.items():
        assert lb["steps"] >= 30, method
        assert lb["link_bytes_per_node"] > 0, method
        assert abs(lb["ratio"] - 1) < 0.10, (method, lb)
    assert set(netns.list_resources()) <= before  # namespaces and links removed
