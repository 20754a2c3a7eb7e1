"""DeMo (Peng et al. 2024): an optimizer that exchanges the top-k of DCT chunks of its
momentum, with DDP's all-reduce off."""

from bench.methods.kinds import OptimizerMethod
from bench.methods.spec import Space, register

# DeMo's rate on digits, from a scan on tuning seed 1000 (the recipe's SGD rate 0.4 never
# reached the target: its update is a sign step per coordinate, AdamW's scale)
IMAGE_LR = 0.1


def space(workload: str, ref: int) -> Space:
    pairs = ((64, 32), (32, 4))
    return {
        "chunk": tuple(
            (f"c{c}k{k}", {"optim.demo_chunk": c, "optim.demo_topk": k}) for c, k in pairs
        )
    }


register(
    OptimizerMethod(
        "demo",
        "DeMo",
        "#e377c2",
        "peer 2026",
        order=60,
        doc="top-k of DCT chunks of the momentum",
        shapes_why="DeMo chunks each tensor",
        hook="nocomm",
        optim="demo",
        default=True,
        spaces=space,
        lr_centre={"classification": IMAGE_LR},
    )
)
