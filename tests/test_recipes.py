"""The experiment recipes: each opens with how to run it and the hardware it assumes,
composes and passes the run's checks, and trains a few steps on the CPU in a tiny form;
the DAWNBench ImageNet recipe is the paper's, and its dense baseline differs from it only
in the communication."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from bench.sweeps.common import compose, options
from tests.conftest import TINY, make_cifar_dir, make_jpeg_folder, run_cli

RECIPES = options("experiment")
CONF = Path(__file__).resolve().parents[1] / "conf" / "experiment"


def _tiny(name: str, tmp_path: Path) -> list[str]:
    """Overrides that shrink recipe ``name`` to a few CPU steps on data made in tmp_path."""
    base = [*TINY, f"results.dir={tmp_path / 'res'}", f"experiment={name}"]
    if name.startswith("dawnbench_imagenet"):
        root = make_jpeg_folder(tmp_path / "imgs", classes=3, per_class=4, size=40)
        return [
            f"results.dir={tmp_path / 'res'}",
            f"experiment={name}",
            *[o for o in TINY if not o.startswith(("model.", "data."))],
            f"data.root={root}",
            "data.num_classes=3",
            "data.batch_size=4",
            "data.eval_batch_size=6",
            "data.image_size=32",
            "data.eval_image_size=32",
            "data.progressive=[[0,24],[1,32]]",  # a size change between the 2 epochs
            "data.num_workers=1",
            "data.dali_threads=1",
            f"cache.dir={tmp_path / 'cache'}",
            "cache.memory_gb=0.01",
            "cluster.nnodes=2",  # hitopk needs 2 nodes
            "cluster.nproc_per_node=1",
            "comm.min_numel=0",
            "comm.density_schedule=[0.5]",  # epoch 1 dense, epoch 2 at density 0.5
            "train.epochs=2",
            "train.max_steps_per_epoch=1",
        ]
    if name == "dawnbench_cifar10":
        return [*base, f"data.root={make_cifar_dir(tmp_path / 'cifar')}", "train.epochs=1"]
    if name.startswith("transformer_"):
        from bench.data.corpus import write_corpus

        corpus = write_corpus(tmp_path / "corpus", train=200, valid=20, test=20)
        tiny = [o for o in base if not o.startswith(("model.", "data."))]
        return [*tiny, f"data.root={corpus}", "data.max_tokens=512", "train.epochs=1"]
    return [*base, "train.epochs=1", "cluster.nproc_per_node=1"]


def test_the_recipes_are_the_listed_ones() -> None:
    for name in (
        "dawnbench_imagenet",
        "dawnbench_imagenet_dense",
        "dawnbench_cifar10",
        "dawnbench_digits",
        "transformer_embedded",
    ):
        assert name in RECIPES


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_says_how_to_run_it_and_on_what(name: str) -> None:
    lines = (CONF / f"{name}.yaml").read_text().splitlines()
    assert lines[0] == "# @package _global_"
    assert lines[1].startswith("# to run:")
    head = "\n".join(ln for ln in lines if ln.startswith("#"))
    assert "Hardware it assumes:" in head


@pytest.mark.parametrize("name", RECIPES)
def test_tiny_recipe_passes_the_run_checks(name: str, tmp_path: Path) -> None:
    from bench.config import to_object
    from bench.launch.run import validate

    cfg = to_object(compose(_tiny(name, tmp_path)))
    validate(cfg)
    assert cfg.experiment == name


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@pytest.fixture(scope="module")
def imagenet_recipes() -> dict[str, dict]:
    """The two ImageNet recipes, composed once, as plain dicts."""
    from omegaconf import OmegaConf

    from bench.sweeps.common import compose_all

    names = ("dawnbench_imagenet", "dawnbench_imagenet_dense")
    cfgs = compose_all([[f"experiment={n}"] for n in names])
    return {n: OmegaConf.to_container(c, enum_to_str=True) for n, c in zip(names, cfgs)}


def test_imagenet_recipe_is_the_papers(imagenet_recipes: dict[str, dict]) -> None:
    cfg = imagenet_recipes["dawnbench_imagenet"]
    assert cfg["model"]["name"] == "resnet50"  # torchvision's: v1.5
    assert 28 <= cfg["train"]["epochs"] <= 35
    assert [s for _, s in cfg["data"]["progressive"]] == [128, 224, 288]
    assert cfg["data"]["progressive"][0][0] == 0
    assert cfg["optim"]["name"] == "lars" and cfg["optim"]["update"] == "flat"
    assert cfg["optim"]["label_smoothing"] > 0 and cfg["optim"]["warmup_epochs"] > 0
    assert cfg["data"]["batch_size"] >= 4096  # large batch
    assert cfg["train"]["amp"] == "auto"  # bf16 on CUDA
    assert cfg["comm"]["name"] == "hitopk" and cfg["comm"]["warmup_epochs"] >= 1
    assert cfg["data"]["loader"] == "dali" and cfg["cache"]["name"] == "multilevel"
    assert (cfg["train"]["target_metric"], cfg["train"]["target_value"]) == ("top5", 0.93)


def test_imagenet_dense_baseline_differs_only_in_the_communication(
    imagenet_recipes: dict[str, dict],
) -> None:
    a, b = (_flat(imagenet_recipes[n]) for n in ("dawnbench_imagenet", "dawnbench_imagenet_dense"))
    diff = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    assert diff == {"experiment", "comm.name"}
    assert b["comm.name"] == "dense"


def _one_record(res: Path) -> dict:
    (line,) = (res / "runs.jsonl").read_text().splitlines()
    return json.loads(line)


@pytest.mark.slow
@pytest.mark.parametrize("name", RECIPES)
def test_tiny_recipe_trains_a_few_steps(name: str, tmp_path: Path) -> None:
    p = run_cli("train", *_tiny(name, tmp_path), timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = _one_record(tmp_path / "res")
    assert rec["experiment"] == name and rec["status"] in ("ok", "target_missed")
    curve = pd.read_csv(rec["curve"])
    assert curve["loss/train"].notna().all() and (curve["data/steps"] >= 1).all()
    if name == "dawnbench_imagenet":
        assert rec["comm"] == "hitopk" and rec["loader"] == "dali" and rec["update"] == "flat"
        assert rec["comm_inter_node_bytes_per_step"] > 0
