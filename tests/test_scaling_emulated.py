"""``reproduce scaling`` on a 3-node emulated cluster (root, slow): every node its own
network namespace on a link paper-scaled at that size, the compute-only runs and each
method in one launch per size, the model's predictions written before the first run,
and nothing of the cluster left behind."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import TINY, run_cli

HAVE_ROOT = os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.skipif(not HAVE_ROOT, reason="needs root and iproute2 (ip, tc)"),
]


def test_three_emulated_nodes_measure_predict_and_clean_up(tmp_path: Path) -> None:
    from bench.cluster import netns

    before = set(netns.list_resources())
    tiny = [o for o in TINY if not o.startswith(("train.", "data.batch_size"))]
    p = run_cli(
        "scaling", "--topologies", "1x1,3x1", "--comm", "dense,hitopk", "--steps", "2",
        "--epochs", "2", "--repeats", "2", "--batch-per-worker", "16", "--results-dir",
        str(tmp_path), *tiny, timeout=1500,
    )  # fmt: skip
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert "2 launches" in out and "size 3x1: cluster profile paper" in out
    (csv,) = (tmp_path / "scaling").glob("*.csv")
    (plan_file,) = (tmp_path / "scaling").glob("*.plan.json")
    plan = json.loads(plan_file.read_text())
    size3 = next(s for s in plan["sizes"] if s["nodes"] == 3)
    assert size3["cluster"] == "emulated" and size3["inter_node_bandwidth"].endswith("mbit")
    assert size3["compute_s"] > 0 and size3["update_included"] and size3["target_ratio"] > 0
    df = pd.read_csv(csv)
    meas = df[(df["kind"] == "measured") & (df["nodes"] == 3)].set_index("comm")
    assert set(meas.index) == {"nocomm", "dense", "hitopk"}
    assert (meas["step_s"] > 0).all() and meas["predicted_step_s"].notna().all()
    assert (meas["inter_node_bandwidth"] == size3["inter_node_bandwidth"]).all()
    assert 0 < meas.loc["dense", "efficiency"] <= 1.5  # margins: a shared machine is noisy
    assert math.isfinite(meas.loc["dense", "link_ratio"])
    # the records keep each run's link check: every node's link, both ways
    recs = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines() if x]
    three = [r for r in recs if r["config"]["cluster"]["nnodes"] == 3]
    assert three and all((r.get("link_check") or {}).get("ok") for r in three)
    assert len({r["queue"]["id"] for r in three}) == 1  # one launch for the size
    assert set(netns.list_resources()) <= before  # namespaces, links and state removed
