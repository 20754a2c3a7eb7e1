"""DeMo (Peng et al. 2024): an optimizer that exchanges the top-k of DCT chunks of its
momentum, with DDP's all-reduce off."""

from bench.methods.kinds import OptimizerMethod
from bench.methods.spec import Space, register

# DeMo's rate on digits, fixed before the sweep from a scan on tuning seed 1000 (chunk 32,
# top-k 4, 2 x 2): 0.05 reached 98 % in 98 steps, 0.1 in 94; the recipe's SGD rate 0.4
# (chunk 64, top-k 32) never did (89 %).  Its update is the sign of its averaged compressed
# momentum, a step per coordinate (AdamW's scale); on translation the recipe's AdamW rate
# is DeMo's own default (conf/optim/demo.yaml).
IMAGE_LR = 0.1


def space(workload: str, ref: int) -> Space:
    """(chunk, top-k) per chunk."""
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
