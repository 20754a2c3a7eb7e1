"""The method specs (bench/methods/): the one place that knows a method.  Outside that
folder no string literal names a method and no module lists method names; every spec
prices, recognises and describes itself."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import bench.methods as methods
from bench.cluster import perfmodel as pm
from bench.registry import ConfigError

REPO = Path(__file__).resolve().parents[1]

# The component packages below the methods (a comm hook, a selector, an optimizer, a sync
# strategy) define the pieces a method is built from, registered under their conf stems,
# which the methods share; everything else asks the method specs.
COMPONENTS = ("comm", "optim", "sync", "methods")
# where a name is registered (its first argument): a benchmark (``bench topk``), a step
REGISTRATIONS = {"register", "BenchRun", "Step", "_bench"}


def _ambiguous() -> set[str]:
    """Method names that are also another thing's own name (a precision of train.amp, a
    benchmark, a top-k selector): alone they are not counted; in a list with another
    method name they are."""
    from bench.benchmarks import load_all
    from bench.comm.selection import SELECTORS
    from bench.config import Amp

    return set(Amp.values()) | set(load_all()) | set(SELECTORS)


def _literals(path: Path, names: set[str], ambiguous: set[str] = frozenset()) -> list[str]:
    """``file:line: 'name'`` for each string constant naming a method outside a
    registration, and each literal collection holding two method names or more."""
    tree = ast.parse(path.read_text(), str(path))
    allowed: set[int] = set()
    lists: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if called in REGISTRATIONS and node.args:
                allowed.add(id(node.args[0]))
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            lists.append(node)
    rel = path.relative_to(REPO)
    hits = {
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and n.value in names - ambiguous and id(n) not in allowed
    }
    for node in lists:
        elts = node.keys if isinstance(node, ast.Dict) else node.elts
        named = [e for e in elts if isinstance(e, ast.Constant) and e.value in names]
        if len(named) >= 2:
            hits.update((e.lineno, e.value) for e in named)
    return [f"{rel}:{line}: {value!r}" for line, value in sorted(hits)]


def test_no_method_is_named_outside_the_methods_folder() -> None:
    names, ambiguous = set(methods.names()), _ambiguous()
    files = [
        p
        for root in ("bench", "reproduce")
        for p in sorted((REPO / root).rglob("*.py"))
        if not (root == "bench" and p.relative_to(REPO / root).parts[0] in COMPONENTS)
    ]
    found = [hit for p in files for hit in _literals(p, names, ambiguous)]
    assert not found, "method names outside bench/methods/:\n" + "\n".join(found)


def test_the_name_check_finds_a_literal(tmp_path: Path) -> None:
    p = REPO / "bench" / "_probe_for_test.py"
    p.write_text('SPARSE = ("mstopk", "hitopk")\nHOOKS.register("dense")(x)\nA = "bf16"\n'
                 'B = "fp16"\nC = ("bf16", "fp16")\nD = "dense"\n')  # fmt: skip
    try:
        got = [h.split(": ")[1] for h in _literals(p, set(methods.names()), _ambiguous())]
        assert got == ["'hitopk'", "'mstopk'", "'bf16'", "'fp16'", "'dense'"]  # by line
    finally:
        p.unlink()


def test_a_spec_is_found_by_name_and_by_record() -> None:
    for spec in methods.specs():
        assert methods.get(spec.name) is spec
        assert spec.colour.startswith("#") and len(spec.colour) == 7
    assert len({s.colour for s in methods.specs()}) == len(methods.specs())  # one each
    with pytest.raises(ConfigError, match="unknown method"):
        methods.get("no-such-method")
    for spec in methods.specs():
        over = dict(o.split("=", 1) for o in spec.overrides())
        rec = {"comm": over.get("comm", "dense"), "config": {}}
        for group in ("optim", "sync"):
            if group in over:
                rec["config"][group] = {"name": over[group]}
        assert methods.method_of(rec) == spec.name


def test_a_duplicate_name_is_refused() -> None:
    spec = methods.get(methods.defaults()[0])
    with pytest.raises(KeyError, match="already registered"):
        methods.register(spec)


def test_every_spec_prices_itself_on_a_slow_and_a_fast_cluster() -> None:
    shapes = ((1024, 256), (256,), (256, 10), (10,))
    numel = sum(a * (b[0] if b else 1) for a, *b in shapes)
    wl = pm.Workload(buckets=(numel,), compute_s=0.05, shapes=((shapes),))
    costs = pm.Costs(select_s=1e-9, scatter_s=1e-9, dense_s=1e-10, reduce_s=1e-10)
    for c in (pm.Cluster(2, 2, inter_bw=1e6), pm.Cluster(16, 8, inter_bw=3e9)):
        for spec in methods.specs():
            k = spec.knobs_of({"comm": {"density": 0.01}})
            t = spec.step_time(wl, c, costs, k)
            assert wl.compute_s <= t < 100, (spec.name, t)


def test_knobs_read_a_trial_and_a_record_alike() -> None:
    for spec in methods.specs():
        for opts in spec.space("classification", 60).values():
            for _, values in opts:
                nested: dict = {}
                for path, v in values.items():
                    group, key = path.split(".", 1)
                    nested.setdefault(group, {})[key] = v
                assert spec.knobs_of(values) == spec.knobs_of(nested), spec.name


NEW = ("sparseloco", "hitopk_diloco")  # the methods added as one file each


@pytest.mark.parametrize("name", NEW)
def test_a_method_added_as_one_file_is_in_the_plan_the_model_advise_and_the_figures(
    name: str, capsys
) -> None:
    from bench.sweeps import protocol as pr
    from bench.sweeps import scaling_model as sm
    from reproduce.advise import main as advise

    spec = methods.get(name)
    assert name in methods.defaults() and spec.colour == methods.colour(name)
    plan = pr.Plan(sweep_id="x", comms=("dense", name), results_dir="/nonexistent")
    trials = plan._space(name)
    assert len(trials) == len(plan._space("dense")) > 1  # the same budget as dense
    jobs = [j for j in plan.tune_jobs() if j.comm == name]
    assert jobs and f"sync={name}" in plan.overrides(jobs[0])
    assert any(j.comm == name for j in plan.timing_jobs())
    cal = sm.Calibration(
        buckets=(200_000,), shapes=(((200_000,),),), reduce_s=1e-9, dense_s=1e-9,
        scatter_s=1e-9, select_s={}, update_s=1e-3, msg_lat_s=1e-4, intra_bw=1e9,
    )  # fmt: skip
    dense = sm.predict(methods.baseline(), 2, 2, 0.05, 50e6, cal)["predicted_step_s"]
    mine = sm.predict(name, 2, 2, 0.05, 50e6, cal)["predicted_step_s"]
    assert 0.05 < mine < dense  # its bytes every H steps, at 1-5 % density, on a slow link
    advise(["--profile", "paper-b64"])
    assert f"\n{name:>17}" in "\n" + capsys.readouterr().out or name in capsys.readouterr().out


def test_the_outer_exchanges_price_the_packets_they_build() -> None:
    from bench.sync.sparse import ChunkTopK, ShardTopK

    frag = torch.nn.Linear(300, 70)
    cfg = SimpleNamespace(density=1 / 64, ef_beta=0.95, chunk_size=256, quant_bits=2,
                          mstopk_method="tiled")  # fmt: skip
    one = SimpleNamespace(local_world=2, local_rank=0, node_group=None)
    numels = {n: p.numel() for n, p in frag.named_parameters()}
    spec = methods.get("sparseloco")
    k = spec.knobs_of({"sync.density": 1 / 64, "sync.chunk_size": 256, "sync.quant_bits": 2})
    built = ChunkTopK(one, frag, cfg).packet
    assert spec.packet(numels, k) == built
    wl = pm.Workload(
        buckets=tuple(numels.values()), shapes=((tuple((n,) for n in numels.values())),)
    )
    stage = spec.sync_traffic(wl, 3, 2, k).stages[0]
    assert stage.worker_bytes == 2 * built.total and stage.link_bytes == 4 * built.total
    outer = methods.get("hitopk_diloco")
    k2 = outer.knobs_of({"sync.density": 0.01})
    shard = ShardTopK(one, frag, SimpleNamespace(**{**vars(cfg), "density": 0.01})).packet
    inter = outer.sync_traffic(wl, 3, 2, k2).stages[0]
    assert inter.worker_bytes == 2 * shard.total and inter.link_bytes == 4 * shard.total
