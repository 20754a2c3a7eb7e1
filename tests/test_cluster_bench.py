"""The ``cluster`` benchmark (quick) and the emulated launcher's refusals."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from bench.config import Config
from bench.registry import ConfigError


def _cfg(**cluster):
    cfg = OmegaConf.structured(Config)
    cfg.cluster.name = "emulated"
    cfg.cluster.nnodes = 2
    for k, v in cluster.items():
        cfg.cluster[k] = v
    return cfg


@pytest.mark.parametrize(
    "cluster,msg",
    [
        ({"inter_node_bandwidth": "fast"}, "cannot parse the bandwidth"),
        ({"inter_node_latency": "soon"}, "cannot parse the latency"),
        ({"nnodes": 1}, "nnodes >= 2"),
        ({"nproc_per_node": 4096}, "cores can hold|GiB of memory"),
        ({"link_tolerance": 2.0}, "link_tolerance"),
    ],
)
def test_emulated_launcher_refuses_bad_input_before_building(tmp_path, cluster, msg):
    from bench.cluster.emulated import launch_emulated

    with pytest.raises(ConfigError, match=msg):
        launch_emulated(_cfg(**cluster).cluster, tmp_path / "run.json")


def test_emulated_launcher_is_registered():
    from bench.cluster.emulated import check_emulated, launch_emulated
    from bench.launch.run import LAUNCHERS

    assert LAUNCHERS["emulated"] == (launch_emulated, check_emulated)


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("tc"), reason="needs root and iproute2")
def test_quick_cluster_benchmark_writes_its_columns(tmp_path: Path):
    from bench.benchmarks.cluster import run

    path = run(str(tmp_path), quick=True)
    df = pd.read_csv(path)
    for col in (
        "bandwidth",
        "nodes",
        "procs_per_node",
        "comm",
        "density",
        "median_ms",
        "predicted_ms",
        "hardware",
        "kind",
        "efficiency",
    ):
        assert col in df.columns, col
    assert set(df["kind"]) == {"measured", "whatif", "projection", "overlap"}
    m = df[df["kind"] == "measured"]
    assert set(m["comm"]) == {"dense", "topk", "mstopk", "hitopk"}
    assert m["wire_error"].abs().max() < 0.10 and m["heldout_error"].notna().all()
    assert set(m["bandwidth"]) == {"1gbit", "10gbit"}
    assert (m["median_ms"] > 0).all() and (m["predicted_ms"] > 0).all()
    ov = df[df["kind"] == "overlap"]
    lb = ov[ov["scenario"] == "link-bound"]
    assert set(lb["comm"]) == set(m["comm"]) and (lb["procs_per_node"] == 1).all()
    assert (lb["bucket_cap_mb"] == 5.0).all() and (lb["comm_alone_ms"] > 0).all()
    assert (ov[ov["scenario"] != "link-bound"]["bucket_cap_mb"] == 25.0).all()
    p = df[df["kind"] == "projection"]
    assert set(p["nodes"]) == set(range(1, 17)) and p["efficiency"].between(0, 1.0001).all()
    assert (tmp_path / "bench" / "cluster.png").is_file()
    assert (tmp_path / "bench" / "cluster.scaling.png").is_file()


def test_the_cluster_figures_redraw_from_the_committed_run(tmp_path: Path):
    """The newest committed run (dense, fp16, bf16, PowerSGD and the top-k methods in its
    projection rows) draws both figures: a dash pattern passed as a format string failed."""
    from reproduce.bench import main

    repo = Path(__file__).resolve().parents[1]
    (tmp_path / "bench").mkdir()
    shutil.copy(repo / "results" / "bench" / "cluster.csv", tmp_path / "bench" / "cluster.csv")
    main(["cluster", "--replot", "--results-dir", str(tmp_path)])
    for name in ("cluster.png", "cluster.scaling.png"):
        assert (tmp_path / "bench" / name).stat().st_size > 10_000, name
