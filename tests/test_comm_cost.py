"""The one cost function of aggregation bytes (bench.comm.cost) on hand-computed cases."""

import pytest

from bench import methods as M
from bench.comm import cost
from bench.registry import ConfigError
from tests.helpers.cost_checks import inter_worker_bytes


def _bucket(name, numel, density, n, m, shapes=None):
    """One bucket's traffic under method ``name`` (its spec's)."""
    s = M.get(name)
    return s.bucket_traffic(numel, n, m, s.knobs_of({"comm.density": density}), shapes)


def test_dense_ring_allreduce_bytes_and_link():
    t = cost.allreduce(1000, n=2, m=2)
    # 2 (w-1)/w * 4000 B = 6000 B per worker; one ring edge leaves each node
    assert t.worker_bytes == 6000 and t.link_bytes == 6000 and inter_worker_bytes(t) == 6000
    assert cost.allreduce(1000, n=1, m=4).link_bytes == 0
    assert _bucket("fp16", 1000, 1.0, 2, 2).worker_bytes == 3000


def test_flat_topk_packet_and_ring():
    # k = 10 pairs of int32 + fp32 = 80 B (already a multiple of 8); 3 ring steps
    t = cost.flat_topk(100_000, 1e-4, 2, 2)
    assert t == _bucket("mstopk", 100_000, 1e-4, 2, 2)
    assert t.worker_bytes == 240 and t.link_bytes == 240
    assert cost.packet_bytes(3, 100, value_bytes=2) == 24  # 18 B padded to 24
    assert cost.packet_bytes(1, 2**31, value_bytes=4) == 16  # int64 indices


def test_hitopk_counts_all_workers_of_a_node_on_its_link():
    # 2 nodes x 2: shard 50_000, k_s = 50 pairs = 400 B
    t = cost.hitopk(100_000, 0.001, n=2, m=2)
    names = [s.name for s in t.stages]
    assert names == ["intra_reduce_scatter", "inter_allgather", "intra_allgather"]
    rs, inter, ag = t.stages
    assert rs.worker_bytes == 200_000 and rs.link_bytes == 0
    assert inter.worker_bytes == 400 and inter.link_bytes == 800  # both workers at once
    assert ag.worker_bytes == 800 and ag.link_bytes == 0
    dense = cost.allreduce(100_000, 2, 2).link_bytes  # 600_000 B
    assert dense / t.link_bytes == pytest.approx(750)  # not 1500


def test_powersgd_compresses_matrices_only():
    # 64x300: (64 + 300) * 4 = 1456 < 19200 / 2 -> P, Q; a bias of 64 goes as it is
    plain, pq = cost.powersgd_sizes([(64, 300), (64,)], rank=4)
    assert (plain, pq) == (64, 1456)
    # too small to be worth it: 4x4 at rank 4 -> allreduced whole
    assert cost.powersgd_sizes([(4, 4)], rank=4) == (16, 0)
    t = _bucket("powersgd", 19264, 1.0, 2, 2, shapes=[(64, 300), (64,)])
    assert t.worker_bytes == pytest.approx(1.5 * (64 + 1456) * 4)


def test_small_buckets_go_dense_and_bad_method_is_refused():
    assert _bucket("hitopk", 1000, 0.01, 2, 2).stages[0].name == "allreduce"
    with pytest.raises(ConfigError, match="unknown method"):
        _bucket("nope", 1000, 0.01, 2, 2)


def test_on_wire_adds_headers_and_acks():
    # 1448 B payload: one 66 B header; 2896 B received: 2 segments -> one ACK
    assert cost.on_wire(1448, 2896) == 1448 + 66 + 66
    assert cost.on_wire(0, 0) == 0
