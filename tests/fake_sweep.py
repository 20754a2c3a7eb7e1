"""A protocol sweep run end to end by a fake runner: every job of every stage gets a record
(and a curve) as a run would leave it, with step times from a made-up link, so the tables and
the report can be built from a complete v3 sweep in seconds.  Not a test of training."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import pytest

from bench import methods
from bench.cluster.netns import parse_bandwidth
from bench.results.env import cpu_model
from bench.results.records import append_record, write_curve
from bench.sweeps import common
from bench.sweeps import measured as ms
from bench.sweeps import protocol as pr
from bench.sweeps.carryover import CARRY
from tests.test_measured import COMPUTE_S, GUESS, _steps, _value

GROUPS = ("comm", "sync", "optim", "cluster", "data")
BITS = 4.0e8  # dense's bits over the link per step
CARRIED = {"hitopk": 1.5}  # steps at 8 nodes over those at 2 (every other method: 0.9)


def config_of(kv: dict[str, str]) -> dict[str, Any]:
    """The nested config a run of these overrides records (``comm=x``: ``comm.name``)."""
    cfg: dict[str, Any] = {}
    for k, v in kv.items():
        *path, last = k.split(".")
        cur = cfg
        for p in path:
            cur = cur.setdefault(p, {})
        if not path and last in GROUPS:
            cur.setdefault(last, {})["name"] = v
        else:
            cur[last] = _value(v)
    return cfg


def _share(name: str) -> float:
    """The method's bits over the link per step, as a share of dense's (made up, fixed)."""
    if methods.get(name).kind == "reference":
        return 0.0
    return 1.0 if name == methods.baseline() else 0.2 + 0.1 * (zlib.crc32(name.encode()) % 7)


def calibrated_kind() -> str:
    """The CPU the fake sweep runs on: this one where its costs are measured, else the
    first CPU with calibration rows, so that the model prices its predictions on any host."""
    from bench.cluster import calibration

    here = cpu_model()
    if calibration.device_slug(here) in calibration.devices():
        return here
    rows = (calibration.load(d) for d in calibration.devices())
    cpus = [r[0]["device"] for r in rows if r and str(r[0]["hardware"]).startswith("CPU ")]
    if not cpus:
        pytest.skip(f"no calibration rows for any CPU (this one: {here})")
    return cpus[0]


def runner(ran: list):
    def run(jobs: list[list[str]], sweep_dir: Path, experiment: str) -> list[int]:
        for job in jobs:
            kv = dict(o.split("=", 1) for o in job)
            role, trial, seed = kv["results.protocol_role"], kv["results.protocol_trial"], int(
                kv["train.seed"])  # fmt: skip
            cfg = config_of(kv)
            cfg.setdefault("cluster", {}).setdefault("inter_node_bandwidth", GUESS)
            for key, n in (("nnodes", 2), ("nproc_per_node", 2)):
                cfg["cluster"].setdefault(key, n)
            rec: dict[str, Any] = {"comm": cfg.get("comm", {}).get("name", "dense"), "config": cfg}
            name = methods.method_of(rec)
            where = kv.get("results.protocol_cluster", "")
            ran.append((role, name, trial, seed, where))
            bps = parse_bandwidth(cfg["cluster"]["inter_node_bandwidth"])
            step = COMPUTE_S * (1 + BITS * _share(name) / bps) if cfg["cluster"]["name"] != (
                "local") else 0.1  # fmt: skip
            rec |= {"run_id": f"r{len(ran)}", "status": "target_missed", "experiment": experiment,
                    "world_size": 4, "nnodes": 2, "data": "digits",
                    "target_metric": "top1", "target_value": 0.98,
                    "hardware": f"CPU {calibrated_kind()} (2 cores), no GPU",
                    "protocol": {"name": pr.NAME, "role": role, "trial": trial,
                                 "selected": role == "eval"}}  # fmt: skip
            if role in (ms.SHAPE, pr.TIME):
                rec |= {"train_time_s": 20 * step * (1 + 0.02 * (seed % 3 - 1)),
                        "comm_phases": [{"steps": 20}]}  # fmt: skip
            else:
                steps = _steps(trial, seed) + 3 * (zlib.crc32(name.encode()) % 5)
                if role == CARRY:  # at 8 nodes: fewer steps, hitopk relatively more than dense
                    steps = round(steps * CARRIED.get(name, 0.9))
                rec |= {"status": "ok", "steps_to_target": steps, "time_to_target_s": steps * step,
                        "train_time_s": steps * step, "scored": "global"}  # fmt: skip
                write_curve(kv["results.dir"], rec["run_id"], [
                    {"epoch": 1, "data/steps": steps, "clock/train_s": steps * step,
                     "acc/top1": 0.99}])  # fmt: skip
            append_record(kv["results.dir"], rec)
        return [0] * len(jobs)

    return run


def run_sweep(results_dir: Path, monkeypatch: pytest.MonkeyPatch, *argv: str) -> list:
    """``reproduce ablation ARGV`` into ``results_dir`` through the fake runner; the jobs run."""
    from reproduce.ablation import main

    ran: list = []
    monkeypatch.setattr(ms, "pin", lambda plan: "")  # no timing of this host
    monkeypatch.setattr(ms, "cpu_model", calibrated_kind)  # the sweep's CPU kind: measured
    monkeypatch.setattr(common, "run_queued", runner(ran))
    main([*argv, "--results-dir", str(results_dir)])
    return ran
