"""comm config group: every conf/comm/*.yaml composes and validates; bad input is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from bench.comm import COMPRESSORS, HOOKS, SELECTORS, is_sparse
from bench.comm.compressors import ResidualMemory
from bench.comm.config import CommConfig, HookOptions, Selector
from bench.registry import ConfigError
from bench.train.comm import CommController, validate

CONF = Path(__file__).resolve().parents[1] / "conf" / "comm"


def _cfg(**kw) -> CommConfig:
    return OmegaConf.merge(OmegaConf.structured(CommConfig), kw)  # type: ignore[return-value]


@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_comm_yaml_is_a_registered_valid_config(path: Path) -> None:
    cfg = OmegaConf.merge(OmegaConf.structured(CommConfig), OmegaConf.load(path))
    assert cfg.name == path.stem and cfg.name in HOOKS
    validate(cfg, world_size=4, nnodes=2)


def test_every_hook_has_a_yaml() -> None:
    assert {p.stem for p in CONF.glob("*.yaml")} >= set(HOOKS.names())


@pytest.mark.parametrize(
    "kw, world, nnodes, match",
    [
        ({"name": "mstopk", "density": 0.0}, 2, 1, "density"),
        ({"name": "mstopk", "density": 1.5}, 2, 1, "density"),
        ({"name": "topk", "density_schedule": [0.25, 0.0]}, 2, 1, "density_schedule"),
        ({"name": "nope"}, 2, 1, "unknown comm"),
        ({"name": "hitopk"}, 2, 1, "at least 2 nodes"),
        ({"name": "hitopk", "procs_per_node": 3}, 4, 2, "do not divide"),
        ({"name": "dense"}, 4, 3, "do not divide"),
        ({"name": "mstopk", "warmup_epochs": -1}, 2, 1, "warmup"),
    ],
)
def test_bad_config_is_refused(kw: dict, world: int, nnodes: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        validate(_cfg(**kw), world, nnodes)


BAD_CHOICES = [
    ({"value_dtype": "int8"}, "value_dtype", "float32, float16, bfloat16"),
    ({"mstopk_method": "x"}, "mstopk_method", "tiled, sampled, hist, paper"),
    ({"selector": "dense"}, "selector", "topk, mstopk, randomk"),
]


@pytest.mark.parametrize("kw, what, allowed", BAD_CHOICES)
def test_bad_choice_is_refused_at_composition(kw: dict, what: str, allowed: str) -> None:
    with pytest.raises(ValidationError, match=allowed):
        _cfg(name="hitopk", **kw)


@pytest.mark.parametrize("kw, what, allowed", BAD_CHOICES)
def test_bad_choice_string_from_python_is_refused(kw: dict, what: str, allowed: str) -> None:
    # make_hook's options (public API) and validate() on a plain, unchecked dataclass
    with pytest.raises(ConfigError, match=f"{what}.*{allowed}"):
        HookOptions(**kw)
    with pytest.raises(ConfigError, match=f"{what}.*{allowed}"):
        validate(CommConfig(name="hitopk", **kw), 4, 2)


def test_hook_specs_agree_with_their_pieces() -> None:
    for name in HOOKS:
        spec = HOOKS.get(name)
        assert spec.name == name and is_sparse(name) == spec.sparse
        if name in COMPRESSORS:  # the hook of a compressor's name sends what it sends
            assert spec.sparse == COMPRESSORS.get(name).sparse, name
    assert {n for n in HOOKS if is_sparse(n)} == {"topk", "mstopk", "randomk", "hitopk"}
    # hitopk's selector option names both a selector and a sparse compressor
    for sel in Selector:
        assert sel in SELECTORS and COMPRESSORS.get(sel).sparse


def test_hitopk_single_node_allowed_with_one_proc_per_node() -> None:
    validate(_cfg(name="hitopk", procs_per_node=1), 2, 1)


def test_controller_warmup_and_schedule() -> None:
    class S:
        force_dense = False
        density = 0.0

    cfg = _cfg(name="hitopk", warmup_epochs=1, density_schedule=[0.25, 0.0625, 0.001])
    c = CommController(S(), cfg, steps_per_epoch=10)
    got = []
    for epoch in range(5):
        c.set_epoch(epoch)
        got.append((c.state.force_dense, c.state.density))
    assert got[0][0] is True and all(not fd for fd, _ in got[1:])
    assert [d for _, d in got[1:]] == [0.25, 0.0625, 0.001, 0.001]


@pytest.mark.parametrize("name", ["dense", "fp16", "bf16", "powersgd"])
def test_controller_leaves_density_of_whole_bucket_hooks(name: str) -> None:
    class S:
        force_dense = False
        density = 0.5

    c = CommController(S(), _cfg(name=name, density_schedule=[0.25]), steps_per_epoch=10)
    c.set_epoch(0)
    assert c.state.density == 0.5


@pytest.mark.parametrize(
    "name, kw, allowed",
    [
        ("topk", {"method": "tiled"}, "none"),
        ("randomk", {"generator": None}, "seed"),
        ("mstopk", {"itres": 3}, "method, iters"),
    ],
)
def test_compressor_refuses_unknown_options(name: str, kw: dict, allowed: str) -> None:
    (opt,) = kw
    with pytest.raises(ConfigError, match=f"unknown option '{opt}' of compressor '{name}'"):
        COMPRESSORS.get(name)("float32", **kw)
    with pytest.raises(ConfigError, match=f"allowed: {allowed}"):
        COMPRESSORS.get(name)("float32", **kw)


def test_seeded_randomk_draws_on_the_buckets_device() -> None:
    import torch

    x = torch.randn(5000)
    a, b = COMPRESSORS.get("randomk")("float32", seed=3), COMPRESSORS.get("randomk")(seed=3)
    ia, ib = a.compress(x, 0.01).indices, b.compress(x, 0.01).indices
    assert torch.equal(ia, ib)  # the seed reproduces the selection
    assert [g.device for g in a._generators.values()] == [x.device]


def test_memory_sweep_frees_buckets_a_step_did_not_use() -> None:
    import torch

    mem = ResidualMemory()
    for key in ("old", "kept"):
        mem.compensate(torch.ones(4), key)
    mem.sweep()
    mem.sweep()  # a step without sparse buckets (dense warm-up) frees nothing
    assert set(mem.buffers) == {"old", "kept"}
    mem.compensate(torch.ones(4), "kept")  # DDP rebuilt its buckets: "old" is gone
    mem.sweep()
    assert set(mem.buffers) == {"kept"} and float(mem.buffers["kept"][0]) == 2.0


def test_process_groups_are_made_again_after_reinitialisation(tmp_path) -> None:
    import torch.distributed as dist

    from bench.comm.topology import Topology, groups

    made = []
    for i in range(2):
        store = dist.FileStore(str(tmp_path / f"store{i}"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            topo = Topology(world_size=1, procs_per_node=1, rank=0)
            made.append(groups(topo))
            assert groups(topo) is made[-1]  # cached within one world
        finally:
            dist.destroy_process_group()
    assert made[0] is not made[1]


def test_the_config_holds_every_hook_option_under_its_name_and_default():
    """HookOptions is the one list of what a hook can be told; the comm group carries each
    option a training run sets (all but the per-call seed and the step-axis warm-up, which
    the controller derives) with the same default, except ``timing`` (off in training)."""
    from dataclasses import MISSING, fields

    derived = {"seed", "warmup_steps"}
    config = {f.name: f for f in fields(CommConfig)}
    for f in fields(HookOptions):
        if f.name in derived:
            continue
        assert f.name in config, f"CommConfig lacks the hook option {f.name}"
        if f.name != "timing":
            c = config[f.name]
            default = c.default if c.default is not MISSING else c.default_factory()
            assert default == f.default, f.name
