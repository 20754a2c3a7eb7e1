"""Schema of the ``comm`` config group (conf/comm/*.yaml)."""

from dataclasses import dataclass, field


@dataclass
class CommConfig:
    name: str = "dense"  # registry key: dense | fp16 | bf16 | topk | mstopk | randomk | hitopk | powersgd
    density: float = 0.01  # fraction of gradient elements sent (top-k family)
    error_feedback: bool = True  # keep what was not sent and add it to the next step
    warmup_epochs: int = 0  # dense epochs before compression starts
    density_schedule: list[float] = field(default_factory=list)  # per-epoch densities after warm-up
    min_numel: int = 16384  # buckets smaller than this go through dense allreduce
    bucket_cap_mb: float = 25.0  # DDP bucket size (MB)
