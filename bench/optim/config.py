"""Schema of the ``optim`` config group (conf/optim/*.yaml)."""

from dataclasses import dataclass, field


@dataclass
class OptimConfig:
    name: str = "sgd"  # registry key in bench.optim
    update: str = "foreach"  # naive | foreach | fused | flat: how the update is computed
    lr: float = 0.4  # peak learning rate for the GLOBAL batch
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 5e-4
    no_decay_bn_bias: bool = True  # exclude BN parameters and biases from weight decay
    label_smoothing: float = 0.0
    warmup_epochs: float = 1.0  # linear warm-up from warmup_start_factor * lr to lr
    warmup_start_factor: float = 0.1
    schedule: str = "cosine"  # cosine | step | constant, after the warm-up
    final_lr_factor: float = 0.0  # cosine: lr at the end = final_lr_factor * lr
    milestones: list[float] = field(default_factory=lambda: [0.5, 0.75])  # step: fractions of the run
    gamma: float = 0.1  # step: factor at each milestone
