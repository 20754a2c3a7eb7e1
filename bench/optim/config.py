"""Schema of the ``optim`` config group (conf/optim/*.yaml)."""

from dataclasses import dataclass, field


@dataclass
class OptimConfig:
    name: str = "sgd"  # registry key in bench.optim: sgd | lars | adam | adamw
    update: str = "foreach"  # naive | foreach | fused | flat: how the update is computed
    lr: float = 0.4  # peak learning rate for the GLOBAL batch
    momentum: float = 0.9  # sgd, lars
    nesterov: bool = True  # sgd, lars
    weight_decay: float = 5e-4  # L2 (sgd, lars, adam) or decoupled (adamw), per unit lr
    no_decay_bn_bias: bool = True  # exclude BN parameters and biases from weight decay (and LARS adaptation)
    trust_coefficient: float = 0.001  # lars: eta in trust = eta * |p| / (|g| + wd * |p| + eps)
    eps: float = 1e-8  # adam/adamw: denominator epsilon; lars: trust-ratio epsilon
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # adam/adamw
    # off | bf16 | fp16: keep fp32 master weights in the flat buffer and a bf16/fp16 model
    # copy that the forward/backward use (update=flat only; run the forward under autocast)
    master_weights: str = "off"
    label_smoothing: float = 0.0
    warmup_epochs: float = 1.0  # linear warm-up from warmup_start_factor * lr to lr
    warmup_start_factor: float = 0.1
    schedule: str = "cosine"  # cosine | step | constant, after the warm-up
    final_lr_factor: float = 0.0  # cosine: lr at the end = final_lr_factor * lr
    milestones: list[float] = field(default_factory=lambda: [0.5, 0.75])  # step: fractions of the run
    gamma: float = 0.1  # step: factor at each milestone
