"""Real-cluster configs: multinode from Slurm's environment, the Slurm submitit launcher,
the submitit path run with its local executor, and a training run on the emulated cluster."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bench.config import register_configs
from tests.conftest import REPO, TINY, run_cli

CONF = str(REPO / "conf")


def _compose(overrides: list[str], hydra: bool = False):
    register_configs()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=hydra)


def test_multinode_takes_its_topology_from_slurm(monkeypatch):
    for k in (
        "SLURM_JOB_NUM_NODES",
        "SLURM_NODEID",
        "SLURM_GPUS_ON_NODE",
        "SLURM_JOB_ID",
        "BENCH_RDZV_ENDPOINT",
    ):
        monkeypatch.delenv(k, raising=False)
    c = _compose(["cluster=multinode"]).cluster
    assert (c.nnodes, c.node_rank, c.rdzv_endpoint) == (2, 0, "")  # outside Slurm: set them
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "4")
    monkeypatch.setenv("SLURM_NODEID", "3")
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "8")
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    monkeypatch.setenv("BENCH_RDZV_ENDPOINT", "gpu-a:29500")
    c = OmegaConf.to_container(_compose(["cluster=multinode"]).cluster, resolve=True)
    assert (c["nnodes"], c["node_rank"], c["nproc_per_node"]) == (4, 3, 8)
    assert c["rdzv_endpoint"] == "gpu-a:29500" and c["rdzv_id"] == "1234"


def test_a_node_named_by_its_address_passes_it_to_its_agent(monkeypatch):
    """Where the nodes share one host name (the local Slurm cluster's namespaces), the
    node ranked first would host the workers' store at the loopback and the other nodes'
    workers would wait there: the node's address (``cluster.local_addr``, from the task's
    environment) goes to torchrun as ``--local-addr``; empty, torch's guess is kept."""
    from bench.cluster.slurm import TASK_PROLOG
    from bench.cluster.torchrun import torchrun_cmd
    from bench.config import to_object

    monkeypatch.delenv("BENCH_LOCAL_ADDR", raising=False)
    c = to_object(_compose(["cluster=multinode"])).cluster
    cmd = torchrun_cmd(c, Path("run.json"), endpoint="n0:1", rdzv_id="j", is_host=True)
    assert c.local_addr == "" and not any(a.startswith("--local-addr") for a in cmd)
    monkeypatch.setenv("BENCH_LOCAL_ADDR", "10.231.0.2")
    c = to_object(_compose(["cluster=multinode"])).cluster
    cmd = torchrun_cmd(c, Path("run.json"), endpoint="n0:1", rdzv_id="j",
                       local_addr=c.local_addr)  # fmt: skip
    assert "--local-addr=10.231.0.2" in cmd and cmd.index("--local-addr=10.231.0.2") < cmd.index(
        "-m", 2
    )  # an agent option, before the worker module
    # the prolog exports the address of the interface the collectives bind
    if shutil.which("ip") is None:
        pytest.skip("no ip command here")
    out = subprocess.run(["sh", "-c", TASK_PROLOG], capture_output=True, text=True).stdout
    lines = dict(ln.removeprefix("export ").split("=", 1) for ln in out.splitlines())
    if "GLOO_SOCKET_IFNAME" not in lines:
        pytest.skip("no interface besides lo here")
    dev = lines["GLOO_SOCKET_IFNAME"]
    shown = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", dev], capture_output=True,
                           text=True).stdout  # fmt: skip
    if "inet " in shown:  # an IPv4 address: exported, that one
        assert f"inet {lines.get('BENCH_LOCAL_ADDR')}/" in shown, (out, shown)
    else:
        assert "BENCH_LOCAL_ADDR" not in lines, out


def test_slurm_launcher_runs_one_task_per_node():
    h = _compose(["cluster=multinode", "hydra/launcher=slurm"], hydra=True).hydra.launcher
    assert h._target_.endswith("SlurmLauncher")
    assert h.tasks_per_node == 1 and h.nodes == 2
    # GPUs, CPUs and memory are left to the partition here; the sweeps size them per job
    # from the topology and the partition (bench/launch/submit.py, resources and check_fit)
    assert h.gpus_per_node is None and h.cpus_per_task is None and h.mem_gb is None
    assert any("BENCH_RDZV_ENDPOINT" in line for line in h.setup)


def test_emulated_config_composes():
    c = _compose(["cluster=emulated", "cluster.inter_node_bandwidth=10gbit"]).cluster
    assert c.name == "emulated" and c.nnodes == 2 and c.inter_node_bandwidth == "10gbit"


@pytest.mark.slow
def test_submitit_local_multirun(tmp_path: Path):
    p = run_cli(
        "train",
        "-m",
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=20",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        f"results.dir={tmp_path}",
        "train.epochs=1",
        "cluster.nproc_per_node=1",
        "optim.lr=0.05,0.1",
        *TINY,
        timeout=900,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    recs = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert sorted(r["config"]["optim"]["lr"] for r in recs) == [0.05, 0.1]
    assert list((tmp_path / "sweep" / ".submitit").iterdir())  # it went through submitit


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("tc"), reason="needs root and iproute2")
def test_training_on_the_emulated_cluster_records_the_link_check(tmp_path: Path):
    from bench.cluster.netns import list_resources

    p = run_cli(
        "train",
        "cluster=emulated",
        "cluster.inter_node_bandwidth=100mbit",
        "cluster.nproc_per_node=1",
        f"results.dir={tmp_path}",
        "train.epochs=1",
        *TINY,
        timeout=900,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = json.loads((tmp_path / "runs.jsonl").read_text().splitlines()[0])
    assert rec["nnodes"] == 2 and rec["world_size"] == 2
    lc = rec["link_check"]
    assert lc["ok"] and abs(lc["bandwidth_ratio"] - 1) <= 0.25
    assert lc["run_id"] not in list_resources()  # nothing of this run is left
