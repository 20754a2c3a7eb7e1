"""Schema of the ``comm`` config group (conf/comm/*.yaml); checked by :func:`bench.comm.validate`."""

from dataclasses import dataclass, field


@dataclass
class CommConfig:
    name: str = (
        "dense"  # registry key: dense | fp16 | bf16 | topk | mstopk | randomk | hitopk | powersgd
    )
    density: float = 0.01  # fraction of gradient elements sent (top-k family), in (0, 1]
    error_feedback: bool = True  # keep what was not sent and add it to the next step
    warmup_epochs: int = 0  # dense epochs before compression starts
    density_schedule: list[float] = field(
        default_factory=list
    )  # per-epoch densities after warm-up (last one repeats)
    min_numel: int = 16384  # buckets with fewer elements go through dense allreduce
    bucket_cap_mb: float = 25.0  # DDP bucket size (MB)
    value_dtype: str = "float32"  # sparse values on the wire: float32 | float16 | bfloat16
    selector: str = "mstopk"  # hitopk's shard selector: mstopk | topk | randomk
    mstopk_method: str = "tiled"  # tiled | sampled | hist | paper (bench/comm/selection.py)
    procs_per_node: int = 0  # workers per node for hitopk; 0 = from the launcher (LOCAL_WORLD_SIZE)
    powersgd_rank: int = 4  # PowerSGD matrix_approximation_rank
