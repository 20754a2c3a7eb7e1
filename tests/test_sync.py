"""The synchronisation strategies (``sync=``): registered once, refused in one line when
they cannot run, a mid-period checkpoint of torchft's DiLoCo resumed bit for bit, and
(slow) 2 nodes x 2 workers per strategy: DDP inside each node only, equal replicas after
an outer step, the outer allreduce's bytes counted, the Lighthouse gone with the run, and
only the global model scored, after each outer synchronisation."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from torch import nn

from bench.config import register_configs, to_object
from bench.launch.run import validate
from bench.registry import ConfigError
from bench.results.columns import metric_column
from bench.sync import SYNCS, build, split_fragments

REPO = Path(__file__).resolve().parents[1]
register_configs()


def _cfg(overrides: list[str]):
    GlobalHydra.instance().clear()  # a launcher test before may leave Hydra initialised
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return to_object(compose(config_name="config", overrides=overrides))


def test_each_strategy_is_registered_once_with_its_config_file() -> None:
    files = sorted(p.stem for p in (REPO / "conf" / "sync").glob("*.yaml"))
    assert SYNCS.names() == files
    assert {"ddp", "diloco", "localsgd", "streaming_diloco"} <= set(files)
    for name in files:
        assert _cfg([f"sync={name}"]).sync.name == name
    assert _cfg([]).sync.name == "ddp"  # the default: today's every-step DDP
    with pytest.raises(KeyError):
        SYNCS.register("diloco")(SYNCS.get("diloco"))


def test_fragments_cut_the_parameters_in_order_about_evenly() -> None:
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)])  # 8 tensors, 288 elements
    params = list(model.parameters())
    for n in (1, 2, 3, 8):
        frags = split_fragments(model, n)
        got = [p for f in frags for p in f.parameters()]
        assert len(frags) == n and all(list(f.parameters()) for f in frags)
        assert [id(p) for p in got] == [id(p) for p in params]
    sizes = [sum(p.numel() for p in f.parameters()) for f in split_fragments(model, 2)]
    assert sizes == [144, 144]
    with pytest.raises(ConfigError, match="9"):
        split_fragments(model, 9)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["sync=diloco", "sync.sync_every=0"], "sync.sync_every (H) must be >= 1, got 0"),
        (["sync=localsgd", "sync.sync_every=-3"], "sync.sync_every (H) must be >= 1"),
        (
            ["sync=streaming_diloco", "sync.sync_every=4", "sync.fragments=8"],
            "sync.fragments=8 is more than sync.sync_every (H) = 4",
        ),
        (
            ["sync=streaming_diloco", "sync.sync_every=400", "sync.fragments=200"],
            "more than the model's 25 parameter tensors",
        ),
        (["sync=streaming_diloco", "sync.fragments=3"], "must divide sync.sync_every"),
        (["sync=diloco", "sync.fragments=2"], "sync=diloco synchronises the whole model"),
        (["sync=diloco", "sync.outer_lr=0"], "sync.outer_lr must be > 0"),
        (
            ["sync=streaming_diloco", "sync.fragment_sync_delay=10"],
            "fragment_sync_delay must be in [0, H / fragments)",
        ),
        (["sync=diloco", "comm=hitopk", "cluster.nnodes=2"], "comm=hitopk"),
    ],
)
def test_a_bad_value_is_refused_in_one_line_before_launch(overrides: list[str], says: str) -> None:
    with pytest.raises(ConfigError) as e:
        validate(_cfg(overrides), create_results=False)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_ddp_ignores_the_outer_knobs() -> None:
    validate(_cfg(["sync=ddp", "sync.sync_every=0"]), create_results=False)


def _replica(lighthouse: str, model: nn.Module, h: int, fragments: int):
    """A one-node DiLoCo on ``model``: (strategy, manager, inner optimizer, its state)."""
    from bench.sync.replica import ReplicaState, open_manager

    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = open_manager(
        node=0,
        nnodes=1,
        local_rank=0,
        local_world=1,
        lighthouse=lighthouse,
        store=("127.0.0.1", store.port),
        hostname="127.0.0.1",
        timeout_s=30,
        quorum_timeout_s=30,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    cfg = _cfg(["sync=streaming_diloco", f"sync.sync_every={h}", f"sync.fragments={fragments}"])
    strategy = build(cfg.sync, manager, model, opt)
    return strategy, manager, opt, ReplicaState(strategy, manager, model, opt), store


def _steps(model: nn.Module, opt: torch.optim.Optimizer, first: int, n: int) -> None:
    for i in range(first, first + n):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(16, 6, generator=g), torch.randn(16, 2, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()  # the strategy's hooks: an outer step every H / fragments steps


def test_a_checkpoint_in_the_middle_of_a_period_resumes_bit_for_bit() -> None:
    """Inner and outer optimizer states, each fragment's global weights, the step within
    the period and the Manager's step (which fragment is next) make the checkpoint."""
    from bench.cluster.lighthouse import Lighthouse

    def net() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))

    with Lighthouse(min_replicas=1, host="127.0.0.1") as lh:
        model = net()
        strategy, manager, opt, state, _store = _replica(lh.address, model, h=4, fragments=2)
        _steps(model, opt, 0, 7)  # fragment syncs at 2, 4, 6: mid-period at 7
        stats = manager.pop_stats()
        assert stats["sync/outer_syncs"] == 3
        # each sync's phases timed: the quorum, the send, the wait, outer step and commit
        assert all(stats[f"sync/{k}_s"] > 0 for k in ("quorum", "send", "finish"))
        assert manager.pop_stats()["sync/finish_s"] == 0.0  # popped: starts over
        buf = io.BytesIO()
        torch.save(state.state_dict(), buf)
        _steps(model, opt, 7, 6)
        want = [p.detach().clone() for p in model.parameters()]
        strategy.__exit__(None, None, None)
        manager.shutdown(wait=False)
    with Lighthouse(min_replicas=1, host="127.0.0.1") as lh:
        model = net()
        strategy, manager, opt, state, _store = _replica(lh.address, model, h=4, fragments=2)
        buf.seek(0)
        state.load_state_dict(torch.load(buf, weights_only=True))
        _steps(model, opt, 7, 6)
        assert all(torch.equal(a, b) for a, b in zip(want, model.parameters(), strict=True))
        strategy.__exit__(None, None, None)
        manager.shutdown(wait=False)
    with pytest.raises(OSError):  # stopped: nothing answers at its address any more
        urllib.request.urlopen(lh.address, timeout=2)


# -- 2 nodes x 2 workers through the local launcher ------------------------------------

BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def _params(path: Path) -> dict[str, torch.Tensor]:
    model = torch.load(path, weights_only=True)["replica"]["model"]
    return {k: v for k, v in model.items() if not k.endswith(BUFFERS)}


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> set[str]:
    return {k for k in a if torch.equal(a[k], b[k])}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["localsgd", "diloco", "streaming_diloco"])
def test_two_nodes_of_two_workers_meet_every_h_steps(name: str, tmp_path: Path) -> None:
    """3 steps an epoch, 2 epochs, H = 2 (Streaming: 2 fragments, H = 4, one fragment every
    2 steps): the checkpoint after step 3 is one step past an outer sync, the one after
    step 6 right after one."""
    h = 4 if name == "streaming_diloco" else 2
    res = tmp_path / "runs"
    cmd = [
        sys.executable, "-m", "reproduce", "train", "experiment=dawnbench_digits",
        f"sync={name}", f"sync.sync_every={h}", "cluster.nnodes=2", "cluster.nproc_per_node=2",
        "train.epochs=2", "train.max_steps_per_epoch=3", "train.stop_at_target=false",
        "train.eval_every_steps=1", "cluster.threads_per_worker=1",
        "train.progress=false", "results.plot=false", f"results.dir={res}",
    ]  # fmt: skip
    if name == "streaming_diloco":
        cmd += ["sync.fragments=2", "sync.fragment_sync_delay=0"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=800)
    assert out.returncode == 0, out.stderr[-3000:]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(res) not in ps, "a worker (or its Lighthouse) outlived the run"
    (run,) = (res / "checkpoints").iterdir()
    mid = [_params(run / "epoch-0001" / f"rank{r}.pt") for r in range(4)]
    end = [_params(run / "epoch-0002" / f"rank{r}.pt") for r in range(4)]
    for p in (mid, end):  # DDP inside each node: its two workers alike, always
        assert _equal(p[0], p[1]) == set(p[0]) and _equal(p[2], p[3]) == set(p[2])
    # one step past an outer sync: no per-step gradient exchange across the nodes
    assert not _equal(mid[0], mid[2])
    if name == "streaming_diloco":  # the fragment just synchronised, not the other one
        assert 0 < len(_equal(end[0], end[2])) < len(end[0])
    else:
        assert _equal(end[0], end[2]) == set(end[0])
    import pandas as pd

    curve = pd.read_csv(next((res / "curves").glob("*.csv")))
    numel = sum(v.numel() for v in end[0].values())
    syncs = curve["sync/outer_syncs"].tolist()
    assert syncs == [1, 2]
    link = curve["comm/inter_node_bytes_per_step"] * curve["data/steps"]
    if name != "streaming_diloco":  # every tensor, every sync: 2 rings (one per local rank)
        assert link.tolist() == pytest.approx([2 * 4 * numel * s for s in syncs])
    assert (link > 0).all()
    # asked after every step, scored only where the global model exists: right after each
    # outer synchronisation (a fragment's for Streaming DiLoCo), every 2 steps; epoch 1
    # ended between two (step 3): its evaluation waited for the one of step 4
    (rec,) = [json.loads(line) for line in (res / "runs.jsonl").read_text().splitlines()]
    got = [(e["step"], e["outer_syncs"], e["scored"]) for e in rec["evals"]]
    assert got == [(2, 1, "global"), (4, 2, "global"), (6, 3, "global")]
    assert math.isnan(curve["acc/top1"][0]) and curve["acc/top1"][1] == rec["evals"][-1]["acc/top1"]
    # the model scored: the replicas' global one (rank 0's outer parameters, the workers'
    # mean buffers), as this process scores it on the whole held-out set
    ev, last = _score_global(run / "epoch-0002", cmd[4:]), rec["evals"][-1]
    assert ev["loss"] == pytest.approx(last[metric_column("loss")], rel=1e-4)
    assert abs(ev["top1"] - last["acc/top1"]) <= 1 / 360


def _score_global(ckpt: Path, overrides: list[str]) -> dict[str, float]:
    """The held-out metrics of the global model of checkpoint ``ckpt`` (4 workers)."""
    from bench.train.workload import WORKLOADS

    cfg = _cfg([o for o in overrides if not o.startswith(("cluster.", "results."))])
    wl = WORKLOADS.get(cfg.train.workload)(cfg, 0, 1, torch.device("cpu"))
    shards = [torch.load(ckpt / f"rank{r}.pt", weights_only=True)["replica"] for r in range(4)]
    state = dict(shards[0]["model"])
    params = [n for n, p in wl.model.named_parameters() if p.requires_grad]
    by_index = [sorted(f["global"].items(), key=lambda kv: int(kv[0].split(".")[-1]))
                for f in shards[0].get("fragments", [])]  # fmt: skip
    state.update(zip(params, [t for f in by_index for _, t in f], strict=False))
    for k, v in state.items():
        if k not in params and v.is_floating_point():
            state[k] = torch.stack([sh["model"][k] for sh in shards]).mean(0)
    wl.model.load_state_dict(state)
    return wl.evaluate(wl.model, wl.data.eval, contextlib.nullcontext)
