"""Networks by name (the MODELS registry): ResNet-9 of the DAWNBench CIFAR-10 entries
(Page, "How to train your ResNet", 2018), torchvision's ResNet-18/50 (v1.5), and the
Transformers of :mod:`bench.models.transformer`; see docs/internals/models.md."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable

import torch
from torch import nn

from bench.models.config import ModelConfig
from bench.registry import ConfigError, Registry

# name -> builder(cfg, num_classes, in_channels) -> the network
ModelBuilder = Callable[[ModelConfig, int, int], nn.Module]
MODELS: Registry[ModelBuilder] = Registry("model")


def conv_bn(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


class Residual(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.res1 = conv_bn(c, c)
        self.res2 = conv_bn(c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.res2(self.res1(x))


class ResNet9(nn.Module):
    """prep(w) -> layer1(2w, pool, residual) -> layer2(4w, pool) -> layer3(8w, pool, residual)
    -> global max pool -> linear, output scaled by 1/8 (as in the DAWNBench entry)."""

    def __init__(self, num_classes: int = 10, width: int = 64, in_channels: int = 3) -> None:
        super().__init__()
        w = width
        # one line per layer group, as in the docstring
        self.net = nn.Sequential(
            conv_bn(in_channels, w),
            conv_bn(w, 2 * w), nn.MaxPool2d(2), Residual(2 * w),
            conv_bn(2 * w, 4 * w), nn.MaxPool2d(2),
            conv_bn(4 * w, 8 * w), nn.MaxPool2d(2), Residual(8 * w),
            nn.AdaptiveMaxPool2d(1), nn.Flatten(),
        )  # fmt: skip
        self.fc = nn.Linear(8 * w, num_classes, bias=False)
        self.scale = 0.125

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.net(x)) * self.scale


@MODELS.register("resnet9")
def _resnet9(cfg: ModelConfig, num_classes: int, in_channels: int = 3) -> nn.Module:
    model = ResNet9(num_classes=num_classes, width=cfg.width, in_channels=in_channels)
    if cfg.zero_init_residual:  # the last BN gamma of each residual block
        for m in model.modules():
            if isinstance(m, Residual):
                nn.init.zeros_(m.res2[1].weight)
    return model


def _resnet(name: str, cfg: ModelConfig, num_classes: int, in_channels: int = 3) -> nn.Module:
    # deferred: torchvision is slow to load, and only the ResNet-18/50 runs need it
    import torchvision.models

    build = getattr(torchvision.models, name)
    return build(num_classes=num_classes, zero_init_residual=cfg.zero_init_residual)


def _transformer(name: str, cfg: ModelConfig, num_classes: int, in_channels: int = 3):
    # deferred: the config schema imports bench.models.config, which runs this __init__;
    # the Transformer's module loads only for the runs that train one
    from bench.models.transformer import build

    return build(name, cfg, num_classes)


for _name in ("resnet18", "resnet50"):
    MODELS.register(_name)(functools.partial(_resnet, _name))
for _name in ("transformer_base", "transformer_big", "transformer_tiny"):
    MODELS.register(_name)(functools.partial(_transformer, _name))


def build_model(cfg: ModelConfig, num_classes: int, in_channels: int = 3) -> nn.Module:
    return MODELS.get(cfg.name)(cfg, num_classes, in_channels)


def validate(cfg: ModelConfig) -> None:
    """What the schema's types cannot say: a registered name, a positive width."""
    MODELS.get(cfg.name)
    if cfg.width < 1:
        raise ConfigError(f"model.width must be >= 1, got {cfg.width}")
    if not 0 <= cfg.dropout < 1 or cfg.max_positions < 1:
        raise ConfigError(
            f"model.dropout must be in [0, 1) and model.max_positions >= 1, got "
            f"{cfg.dropout} and {cfg.max_positions}"
        )


@functools.lru_cache(maxsize=64)
def _probe(cfg: str, num_classes: int, channels: int, size: int) -> int | str:
    model_cfg = ModelConfig(**json.loads(cfg))
    with torch.device("meta"):  # shapes only: nothing is allocated, whatever the size
        model = build_model(model_cfg, num_classes, channels).eval()
    held = [0]

    def count(m: nn.Module, inp: object, out: object) -> None:
        if isinstance(out, torch.Tensor) and not getattr(m, "inplace", False):
            held[0] += out.numel() * out.element_size()

    for m in model.modules():
        if not any(m.children()):
            m.register_forward_hook(count)
    try:
        with torch.no_grad():
            model(torch.empty(1, channels, size, size, device="meta"))
    except (RuntimeError, ValueError) as e:
        return str(e).strip().splitlines()[0]
    return held[0]


def input_bytes(cfg: ModelConfig, num_classes: int, channels: int, size: int) -> int:
    """Bytes of every layer's output for one ``size`` x ``size`` image (at least what a step
    keeps for its backward), by a meta-device forward; ConfigError if it cannot take them."""
    got = _probe(json.dumps(dataclasses.asdict(cfg), sort_keys=True), num_classes, channels, size)
    if isinstance(got, str):
        raise ConfigError(f"model={cfg.name} cannot take {size} x {size} images ({got})")
    return got
