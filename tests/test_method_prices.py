"""Every registered method spec priced by the performance model on a small and on the
paper's cluster: a finite, positive step time, bytes that make sense, and the sparse
methods' link bytes below dense's."""

import math

import pytest

from bench import methods
from bench.cluster import projection

DENSITY = 0.01
CLUSTERS = {"2x2": (2, 2), "16x8": (16, 8)}


def _setting(nodes: int, procs: int):
    wl = projection.paper_workload(projection.ASSUMPTIONS["compute_s"].value, {})
    return wl, projection.paper_cluster(nodes, 25, 0.7, procs), projection.GPU_COSTS


def _link_bytes(spec, wl, nodes: int, procs: int, density: float = DENSITY) -> float:
    k = spec.knobs_of({"comm.density": density})
    return spec.traffic(wl.buckets, nodes, procs, k, wl.shapes).link_bytes


@pytest.mark.parametrize("where", list(CLUSTERS))
@pytest.mark.parametrize("name", methods.names())
def test_every_spec_prices_a_step_and_its_bytes(name: str, where: str) -> None:
    spec = methods.get(name)
    nodes, procs = CLUSTERS[where]
    wl, c, costs = _setting(nodes, procs)
    step = spec.step_time(wl, c, costs, spec.knobs_of({"comm.density": DENSITY}))
    alone = wl.compute_s + wl.update_s
    assert math.isfinite(step) and step > 0
    # sending never makes a step shorter than computing it (the reference sends nothing)
    assert step >= alone * (1 - 1e-12)
    if spec.kind == "reference":
        assert step == pytest.approx(alone) and _link_bytes(spec, wl, nodes, procs) == 0
    link = _link_bytes(spec, wl, nodes, procs)
    assert math.isfinite(link) and link >= 0


def test_sparse_link_bytes_against_dense() -> None:
    """Below dense's on 2 x 2 at density 0.01; on 16 x 8 the hierarchical exchange stays
    below it, while a flat all-gather of 127 workers' pairs passes it at 0.01 (each pair is
    8 B against dense's 2 x 4 B per element) and is below it again at 0.001."""
    wl, _, _ = _setting(2, 2)
    base = methods.get(methods.names(group="baseline")[0])
    sparse = [s for s in methods.specs() if s.sparse]
    assert sparse
    for s in sparse:
        assert _link_bytes(s, wl, 2, 2) < _link_bytes(base, wl, 2, 2), s.name
    dense = _link_bytes(base, wl, 16, 8)
    for s in sparse:
        at = {d: _link_bytes(s, wl, 16, 8, d) for d in (0.01, 0.001)}
        assert at[0.001] < dense, s.name
        assert (at[0.01] < dense) == (s.min_nodes > 1), s.name


def test_half_precision_halves_the_bytes_and_the_sync_strategies_amortise() -> None:
    wl, _, _ = _setting(16, 8)
    dense = _link_bytes(methods.get("dense"), wl, 16, 8)
    assert _link_bytes(methods.get("fp16"), wl, 16, 8) == pytest.approx(dense / 2)
    for s in methods.specs(kind="sync"):
        every = {h: s.knobs_of({"sync.sync_every": h}) for h in (10, 40)}
        link = {h: s.traffic(wl.buckets, 16, 8, k).link_bytes for h, k in every.items()}
        assert link[40] == pytest.approx(link[10] / 4) and link[10] < dense
