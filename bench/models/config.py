"""Schema of the ``model`` config group (conf/model/*.yaml)."""

from dataclasses import dataclass


@dataclass
class ModelConfig:
    name: str = "resnet9"  # registry key in bench.models
    width: int = 64  # resnet9 base channel count (64 = the DAWNBench ResNet-9)
    zero_init_residual: bool = False  # zero the last BN gamma in each residual block
    channels_last: bool = True  # memory format on CUDA (ignored on CPU)
