"""Schema of the ``model`` config group (conf/model/*.yaml)."""

from dataclasses import dataclass


@dataclass
class ModelConfig:
    name: str = "resnet9"  # registry key in bench.models
    width: int = 64  # resnet9 base channel count (64 = the DAWNBench ResNet-9)
    zero_init_residual: bool = False  # zero the last BN gamma in each residual block
    channels_last: bool = True  # memory format on CUDA (ignored on CPU)
    # --- transformer_* (dimensions by name, see bench/models/transformer.py) ---
    dropout: float = 0.1
    pre_norm: bool = False  # layer norm before each sub-layer (post-norm is the paper's)
    max_positions: int = 1024  # longest sequence the sinusoidal positions cover
