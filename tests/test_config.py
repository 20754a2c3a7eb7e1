"""Every config composes; wrong keys and types are refused by the structured schema."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, ValidationError

from bench.config import register_configs, to_object

CONF = Path(__file__).resolve().parents[1] / "conf"
register_configs()


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.mark.parametrize(
    "group", ["model", "data", "cache", "optim", "comm", "cluster", "experiment"]
)
def test_every_group_option_composes(group: str) -> None:
    opts = group_options(group)
    assert opts, f"conf/{group} is empty"
    for opt in opts:
        cfg = _compose([f"{group}={opt}"])
        obj = to_object(cfg)  # typed: every value matches the schema
        if group not in ("experiment",):
            assert getattr(obj, group).name == opt, f"{group}/{opt}.yaml must set name: {opt}"


def test_experiment_sets_its_name_and_target() -> None:
    cfg = _compose(["experiment=dawnbench_digits"])
    assert cfg.experiment == "dawnbench_digits"
    assert cfg.train.target_metric == "top1" and cfg.train.target_value == 0.98
    cfg = _compose(["experiment=dawnbench_imagenet", "data.root=/x"])
    assert cfg.model.name == "resnet50" and cfg.train.target_metric == "top5"
    assert cfg.train.target_value == 0.93


def test_unknown_key_is_refused() -> None:
    with pytest.raises((ConfigCompositionException, ConfigKeyError)):
        _compose(["optim.learning_rate=0.1"])


def test_wrong_type_is_refused() -> None:
    with pytest.raises((ConfigCompositionException, ValidationError)):
        _compose(["train.epochs=many"])


def test_unknown_group_choice_is_refused() -> None:
    with pytest.raises(Exception, match="nosuchmodel"):
        _compose(["model=nosuchmodel"])


def _choice_fields(node, prefix: str = ""):
    """(dotted key, Choice class) of every typed-choice field of the structured config."""
    import dataclasses
    import typing

    from bench.registry import Choice

    hints = typing.get_type_hints(type(node))
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from _choice_fields(value, f"{key}.")
        elif isinstance(hints.get(f.name), type) and issubclass(hints[f.name], Choice):
            yield key, hints[f.name]


def test_every_choice_field_refuses_a_bad_value_naming_the_choices() -> None:
    from bench.config import Config

    fields = list(_choice_fields(Config()))
    keys = {k for k, _ in fields}
    assert {"train.amp", "train.device", "optim.update", "data.loader"} <= keys, keys
    for key, cls in fields:
        with pytest.raises((ConfigCompositionException, ValidationError)) as e:
            _compose([f"{key}=no_such_value"])
        msg = str(e.value) + str(e.value.__cause__ or "")
        assert "no_such_value" in msg and all(v in msg for v in cls.values()), (key, msg)
