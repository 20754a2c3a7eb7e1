"""Schema of the ``optim`` config group (conf/optim/*.yaml) and its typed choices.

``name`` is a registry key (:data:`bench.optim.OPTIMIZERS`); the fields with a fixed set
of values are :class:`~bench.registry.Choice` enums, refused at composition otherwise.
"""

from dataclasses import dataclass, field

from bench.registry import Choice


class UpdateMode(Choice):
    """How the same arithmetic is computed (see :mod:`bench.optim`)."""

    naive = "naive"  # a per-tensor Python loop
    foreach = "foreach"  # torch's multi-tensor _foreach_* ops
    fused = "fused"  # torch's fused per-tensor kernels
    flat = "flat"  # this package's flat-buffer optimizers (bench.optim.flat)

    @property
    def torch_kwargs(self) -> dict[str, bool] | None:
        """Keyword arguments that select this mode in a torch optimizer; None for ``flat``."""
        return {
            "naive": {"foreach": False},
            "foreach": {"foreach": True},
            "fused": {"fused": True},
        }.get(self.value)


class MasterWeights(Choice):
    """Low-precision model copy kept beside fp32 master weights (update=flat only)."""

    off = "off"
    bf16 = "bf16"
    fp16 = "fp16"

    @property
    def dtype(self):  # torch.dtype | None
        # deferred: the config schema is composed (Hydra, the launcher) without torch,
        # whose import takes seconds; only a worker building its optimizer asks this
        import torch

        return {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[self.value]


class Schedule(Choice):
    """Learning-rate decay after the warm-up."""

    cosine = "cosine"
    step = "step"
    constant = "constant"
    inverse_sqrt = "inverse_sqrt"  # lr * sqrt(warm-up steps / step) (the Transformer's)


@dataclass
class OptimConfig:
    name: str = "sgd"  # registry key in bench.optim: sgd | lars | adam | adamw | demo
    update: UpdateMode = UpdateMode.foreach  # how the update is computed
    lr: float = 0.4  # peak learning rate for the GLOBAL batch
    momentum: float = 0.9  # sgd, lars; demo: the decay of its momentum, in [0, 1)
    nesterov: bool = True  # sgd, lars
    weight_decay: float = 5e-4  # L2 (sgd, lars, adam) or decoupled (adamw), per unit lr
    # exclude BN parameters and biases from weight decay (and from LARS adaptation)
    no_decay_bn_bias: bool = True
    trust_coefficient: float = 0.001  # lars: eta in trust = eta * |p| / (|g| + wd * |p| + eps)
    eps: float = 1e-8  # adam/adamw: denominator epsilon; lars: trust-ratio epsilon
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # adam/adamw
    # keep fp32 master weights in the flat buffer and a bf16/fp16 model copy that the
    # forward/backward use (update=flat only; run the forward under autocast)
    master_weights: MasterWeights = MasterWeights.off
    label_smoothing: float = 0.0
    clip_norm: float = 0.0  # > 0: clip the global gradient norm to this before each update
    warmup_epochs: float = 1.0  # linear warm-up from warmup_start_factor * lr to lr
    warmup_start_factor: float = 0.1
    schedule: Schedule = Schedule.cosine  # after the warm-up
    final_lr_factor: float = 0.0  # cosine: lr at the end = final_lr_factor * lr
    # step: fractions of the run at which the lr is multiplied by gamma
    milestones: list[float] = field(default_factory=lambda: [0.5, 0.75])
    gamma: float = 0.1  # step: factor at each milestone
    # demo: side of its square DCT chunks (a matrix in chunks of demo_chunk x demo_chunk
    # elements, a vector in rows of demo_chunk) and the coefficients sent per chunk
    demo_chunk: int = 64
    demo_topk: int = 32
