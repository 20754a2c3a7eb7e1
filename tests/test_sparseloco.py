"""The sparse outer exchanges (``sync=sparseloco``, ``sync=hitopk_diloco``): what is sent
plus what is kept is the error-feedback buffer, the packet has the bytes the formula says,
sparseloco at density 1 without quantisation or error feedback is DiLoCo with an outer SGD
of rate 1 bit for bit, two nodes (gloo, in one process) end every outer step with equal
replicas, a mid-period checkpoint resumes bit for bit with the error feedback in it, and
(slow) 2 nodes x 2 workers through the local launcher."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from bench.comm.wire import unpack
from bench.sync import build
from bench.sync.sparse import ChunkTopK, ShardTopK, pack_bits, unpack_bits
from tests.test_sync import _cfg

REPO = Path(__file__).resolve().parents[1]
SPARSE = ("sparseloco", "hitopk_diloco")


def _frag(*shapes: tuple[int, ...]) -> nn.Module:
    m = nn.Module()
    m.params = nn.ParameterList([nn.Parameter(torch.zeros(s)) for s in shapes])
    return m


def _grads(frag: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(p.shape, generator=g) for n, p in frag.named_parameters()}


def _knobs(**kw: object) -> SimpleNamespace:
    base = {"density": 1 / 16, "ef_beta": 0.9, "chunk_size": 64, "quant_bits": 2}
    return SimpleNamespace(**{**base, "mstopk_method": "tiled", **kw})


ONE = SimpleNamespace(local_world=1, local_rank=0, node_group=None)  # one worker a node


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["sync=sparseloco", "sync.density=0"], "sync.density must be in (0, 1]"),
        (["sync=hitopk_diloco", "sync.density=1.5"], "sync.density must be in (0, 1]"),
        (["sync=hitopk_diloco", "sync.ef_beta=-0.1"], "sync.ef_beta must be in [0, 1]"),
        (["sync=sparseloco", "sync.chunk_size=1"], "sync.chunk_size must be >= 2"),
        (["sync=sparseloco", "sync.quant_bits=9"], "sync.quant_bits must be 0"),
        (["sync=sparseloco", "sync.outer_momentum=0.9"], "set sync.outer_momentum=0"),
        (["sync=sparseloco", "sync.fragments=2"], "synchronises the whole model"),
    ],
)
def test_a_bad_knob_is_refused_in_one_line_before_launch(overrides: list[str], says: str) -> None:
    from bench.launch.run import validate
    from bench.registry import ConfigError

    with pytest.raises(ConfigError) as e:
        validate(_cfg(overrides), create_results=False)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_bits_pack_and_unpack() -> None:
    g = torch.Generator().manual_seed(0)
    for bits in (1, 2, 3, 12):
        codes = torch.randint(0, 1 << bits, (37,), generator=g)
        buf = pack_bits(codes, bits)
        assert buf.dtype == torch.uint8 and buf.numel() == -(-37 * bits // 8)
        assert torch.equal(unpack_bits(buf, bits, 37), codes)


def _sparseloco_sent(ex: ChunkTopK, packet: torch.Tensor) -> dict[str, torch.Tensor]:
    """What one packet carries, per tensor, dense."""
    pos, vals = ex.decode(packet)
    acc = torch.zeros(ex.padded).index_add_(0, pos, vals)
    return {t.name: acc[t.base : t.base + t.numel] for t in ex.chunks}


@pytest.mark.parametrize("bits", [0, 2])
def test_sparseloco_sends_plus_keeps_its_buffer(bits: int) -> None:
    frag = _frag((40, 50), (50,), (7,))
    ex = ChunkTopK(ONE, frag, _knobs(quant_bits=bits))
    for step in range(3):
        grads = _grads(frag, step)
        want = {n: 0.9 * ex.error[n] + g if ex.error else g for n, g in grads.items()}
        sent = _sparseloco_sent(ex, ex.encode(grads))
        for n, g in want.items():
            got = sent[n] + ex.error[n].view(-1)
            if bits == 0:  # float32 values: the sent coordinates keep exactly nothing
                assert torch.equal(got, g.view(-1))
                assert (ex.error[n].view(-1)[sent[n] != 0] == 0).all()
            else:  # the quantised value's rounding stays in the buffer
                torch.testing.assert_close(got, g.view(-1), rtol=0, atol=1e-6)
        # k of each chunk: 4 of every 64 (a partial last chunk too), 4 of 50, 1 of 7
        assert [int((s != 0).sum()) for s in sent.values()] == [32 * 4, 4, 1]


def test_hitopk_sends_plus_keeps_its_shard() -> None:
    frag = _frag((300, 200), (200,))
    for j in range(2):  # two local ranks of a node, each its shard
        node = SimpleNamespace(local_world=2, local_rank=j, node_group=None)
        ex = ShardTopK(node, frag, _knobs(density=0.01, ef_beta=1.0))
        assert ex.shard == 30100 and ex.k == 301
        for step in range(2):
            grads = _grads(frag, step)
            flat = torch.cat([g.view(-1) for g in grads.values()])[j * 30100 : (j + 1) * 30100]
            want = (ex.error["shard"] + flat) if ex.error else flat.clone()
            vals, idx = unpack(ex.encode(grads), 1, ex.k, ex.shard, torch.float32)
            sent = torch.zeros(ex.shard).index_put_((idx[0],), vals[0])
            assert torch.equal(sent + ex.error["shard"], want)
            assert idx.unique().numel() == ex.k


def test_the_packet_has_the_bytes_the_formula_says() -> None:
    """Per tensor of d elements: w = min(chunk, d) wide chunks, r = ceil(d / w) of them,
    k = ceil(density w) of each; K = sum r k values, R = sum r chunks: indices
    ceil(K ceil(log2 chunk) / 8) bytes, values ceil(K b / 8) (4 K as float32), scales
    4 R 2^(b-1) (none as float32)."""
    frag = _frag((100, 50), (50,), (7,))  # 5000 (79 chunks of 64, k 4), 50 (k 4), 7 (k 1)
    k, r = 79 * 4 + 4 + 1, 79 + 1 + 1
    two = ChunkTopK(ONE, frag, _knobs()).packet
    assert (two.indices, two.values, two.scales) == (-(-k * 6 // 8), -(-k * 2 // 8), 4 * r * 2)
    assert two.total == 241 + 81 + 648
    full = ChunkTopK(ONE, frag, _knobs(quant_bits=0)).packet
    assert (full.indices, full.values, full.scales) == (241, 4 * k, 0)
    ex = ChunkTopK(ONE, frag, _knobs())
    assert ex.encode(_grads(frag, 0)).numel() == two.total
    hi = ShardTopK(SimpleNamespace(local_world=2, local_rank=1, node_group=None), frag, _knobs())
    assert (hi.packet.indices, hi.packet.values) == (4 * 159, 4 * 159)  # ceil(2529 / 16)


# -- two nodes (one worker each) in one process: torchft Managers on gloo -----------------


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 300), nn.Tanh(), nn.Linear(300, 2))


def _node(lighthouse: str, node: int, nnodes: int, cfg) -> SimpleNamespace:
    """One node's replica of :func:`_net` under the sync config ``cfg``."""
    from bench.sync.replica import ReplicaState, open_manager

    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = open_manager(
        node=node,
        nnodes=nnodes,
        local_rank=0,
        local_world=1,
        lighthouse=lighthouse,
        store=("127.0.0.1", store.port),
        hostname="127.0.0.1",
        timeout_s=60,
        quorum_timeout_s=60,
    )
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    strategy = build(cfg, manager, model, opt)
    return SimpleNamespace(
        model=model, opt=opt, strategy=strategy, manager=manager, store=store,
        state=ReplicaState(strategy, manager, model, opt),
    )  # fmt: skip


def _steps(n, first: int, count: int, node: int) -> None:
    for i in range(first, first + count):
        g = torch.Generator().manual_seed(1000 * node + i)  # each node its own data
        x, y = torch.randn(16, 6, generator=g), torch.randn(16, 2, generator=g)
        n.opt.zero_grad()
        nn.functional.mse_loss(n.model(x), y).backward()
        n.opt.step()  # the strategy's hooks: an outer step every H steps


def _params(n) -> list[torch.Tensor]:
    return [p.detach().clone() for p in n.model.parameters()]


def _global(n) -> list[torch.Tensor]:
    return [v.clone() for f in n.strategy._fragments for v in f.original_parameters.values()]


def _two_nodes(overrides: list[str], periods: int, h: int) -> list[list[dict]]:
    """``periods`` outer steps of two nodes, each in a thread; per node, after each, its
    weights, its global weights and its Manager's statistics."""
    from bench.cluster.lighthouse import Lighthouse

    cfg = _cfg([*overrides, f"sync.sync_every={h}"]).sync
    out: list[list[dict]] = [[], []]
    errors: list[BaseException] = []
    with Lighthouse(min_replicas=2, host="127.0.0.1") as lh:
        nodes = [_node(lh.address, i, 2, cfg) for i in range(2)]  # alike: seeded in turn

        def run(i: int) -> None:
            n = nodes[i]
            try:
                for p in range(periods):
                    _steps(n, p * h, h, i)
                    stats = n.manager.pop_stats()
                    out[i].append({"params": _params(n), "global": _global(n), "stats": stats})
            except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
                errors.append(e)
            finally:
                n.strategy.__exit__(None, None, None)
                n.manager.shutdown(wait=False)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    if errors:
        raise errors[0]
    return out


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", SPARSE)
def test_two_nodes_end_every_outer_step_with_equal_replicas(name: str) -> None:
    overrides = [f"sync={name}", "sync.density=0.05"]
    a, b = _two_nodes(overrides, periods=3, h=3)
    numel = sum(p.numel() for p in _net().parameters())  # 2702: 2 x 1200 + 300 + 2 bias
    for p, (x, y) in enumerate(zip(a, b, strict=True)):
        assert _same(x["params"], y["params"]) and _same(x["global"], y["global"])
        assert _same(x["params"], x["global"])  # every replica continues from it
        if p:  # the global weights moved
            assert not _same(x["global"], a[p - 1]["global"])
        s = x["stats"]
        assert s["sync/outer_syncs"] == 1
        packet = s["sync/packet_values_bytes"] + s["sync/packet_indices_bytes"]
        packet += s["sync/packet_scales_bytes"]
        assert s["sync/outer_bytes_per_sync"] == packet  # one ring step: to the other node
        if name == "hitopk_diloco":  # one worker a node: one shard, k = ceil(0.05 n)
            assert packet == 8 * -(-numel // 20)


def test_sparseloco_at_density_one_is_diloco_bit_for_bit() -> None:
    """Without selection, quantisation or error feedback, the mean of the packets is the
    allreduced mean, and a plain outer SGD of rate 1 steps the global weights alike."""
    common = ["sync.outer_lr=1.0", "sync.outer_momentum=0"]
    dense = _two_nodes(["sync=diloco", *common], periods=3, h=2)
    sparse = _two_nodes(
        ["sync=sparseloco", *common, "sync.density=1", "sync.quant_bits=0", "sync.ef_beta=0"],
        periods=3,
        h=2,
    )
    for node in range(2):
        for d, s in zip(dense[node], sparse[node], strict=True):
            assert _same(d["params"], s["params"]) and _same(d["global"], s["global"])
    assert dense[0][-1]["stats"]["sync/outer_bytes_per_sync"] > 0


@pytest.mark.parametrize("name", SPARSE)
def test_a_checkpoint_in_the_middle_of_a_period_resumes_bit_for_bit(name: str) -> None:
    """The error-feedback buffers are in the checkpoint: without them the run differs."""
    from bench.cluster.lighthouse import Lighthouse

    over = _cfg([f"sync={name}", "sync.sync_every=4", "sync.density=0.05"]).sync
    with Lighthouse(min_replicas=1, host="127.0.0.1") as lh:
        n = _node(lh.address, 0, 1, over)
        _steps(n, 0, 7, 0)  # outer steps at 4 and 8: mid-period at 7
        buf = io.BytesIO()
        torch.save(n.state.state_dict(), buf)
        _steps(n, 7, 6, 0)
        want = _params(n)
        n.strategy.__exit__(None, None, None)
        n.manager.shutdown(wait=False)
    for forget in (False, True):
        with Lighthouse(min_replicas=1, host="127.0.0.1") as lh:
            n = _node(lh.address, 0, 1, over)
            buf.seek(0)
            n.state.load_state_dict(torch.load(buf, weights_only=True))
            (ex,) = n.strategy.exchanges
            assert all(e.abs().sum() > 0 for e in ex.error.values())  # in flight
            if forget:
                ex.error = {}
            _steps(n, 7, 6, 0)
            assert _same(want, _params(n)) is not forget
            n.strategy.__exit__(None, None, None)
            n.manager.shutdown(wait=False)


# -- 2 nodes x 2 workers through the local launcher ------------------------------------

BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def _saved(path: Path) -> dict[str, torch.Tensor]:
    model = torch.load(path, weights_only=True)["replica"]["model"]
    return {k: v for k, v in model.items() if not k.endswith(BUFFERS)}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", SPARSE)
def test_two_nodes_of_two_workers_end_each_outer_step_equal(name: str, tmp_path: Path) -> None:
    """3 steps an epoch, H = 3: every epoch ends with an outer step, each worker's
    checkpoint right after it; the curve's bytes are the packets' (formula: docs)."""
    res = tmp_path / "runs"
    cmd = [
        sys.executable, "-m", "reproduce", "train", "experiment=dawnbench_digits",
        f"sync={name}", "sync.sync_every=3", "cluster.nnodes=2", "cluster.nproc_per_node=2",
        "train.epochs=2", "train.max_steps_per_epoch=3", "train.stop_at_target=false",
        "cluster.threads_per_worker=1",
        "train.progress=false", "results.plot=false", f"results.dir={res}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=800)
    assert out.returncode == 0, out.stderr[-3000:]
    (run,) = (res / "checkpoints").iterdir()
    for epoch in ("epoch-0001", "epoch-0002"):
        w = [_saved(run / epoch / f"rank{r}.pt") for r in range(4)]
        assert all(_same(list(w[0].values()), list(x.values())) for x in w[1:])
    import pandas as pd

    curve = pd.read_csv(next((res / "curves").glob("*.csv")))
    assert curve["sync/outer_syncs"].tolist() == [1, 1]
    packet = sum(curve[f"sync/packet_{k}_bytes"] for k in ("values", "indices", "scales"))
    sent = curve["sync/outer_bytes_per_sync"]
    link = curve["comm/inter_node_bytes_per_step"] * curve["data/steps"]
    if name == "sparseloco":  # each local rank all-gathers its node's whole packet
        assert sent.tolist() == packet.tolist() and link.tolist() == (2 * packet).tolist()
    else:  # each its shard's between the nodes, then 2 packets to its node's other worker
        assert sent.tolist() == (3 * packet).tolist() and link.tolist() == (2 * packet).tolist()


# -- bytes against the emulated link's interface counters ------------------------------
# 2 emulated nodes x 1 worker, 3 epochs of 12 digits steps, H = 2: 18 outer exchanges, at a
# density whose packets outweigh torchft's own quorum and heartbeat traffic (about 2-3 kB a
# step a node here, which no method's bytes count: docs/algorithms.md, section 11)
LINK = {
    "sparseloco": ["sync=sparseloco", "sync.density=0.25"],
    "hitopk_diloco": ["sync=hitopk_diloco", "sync.density=0.25"],
}


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.timeout(1800)
@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("tc"), reason="needs root and iproute2 (ip, tc)"
)
@pytest.mark.parametrize("name", SPARSE)
def test_logged_bytes_match_the_link_counters_within_10_percent(name: str, tmp_path: Path):
    import json

    from tests.conftest import run_cli

    p = run_cli(
        "train", "experiment=dawnbench_digits", "cluster=emulated", "cluster.nnodes=2",
        "cluster.nproc_per_node=1", "cluster.link_check=false", "train.epochs=3",
        "train.max_steps_per_epoch=12", "train.stop_at_target=false", "sync.sync_every=2",
        "train.checkpoint_every=0", "train.progress=false", "results.plot=false",
        f"results.dir={tmp_path}", *LINK[name], timeout=1500,
    )  # fmt: skip
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    lb = json.loads((tmp_path / "runs.jsonl").read_text().splitlines()[-1])["link_bytes"]
    print(json.dumps(lb, indent=1))
    assert lb["steps"] >= 30 and lb["link_bytes_per_node"] > 0
    assert abs(lb["ratio"] - 1) < 0.10, lb
