"""DiLoCo (Douillard et al. 2023) through torchft: an outer Nesterov step on the averaged
pseudo-gradient every H inner steps."""

from bench.methods.kinds import SyncMethod
from bench.methods.spec import Space, register


def space(workload: str, ref: int, streaming: bool = False) -> Space:
    """H x outer learning rate, outer momentum 0.5; streaming: 2 fragments, each
    synchronised with a delay of 1 inner step."""
    hs = (20, 50) if workload == "translation" else (10, 20)
    extra = {"sync.fragments": 2, "sync.fragment_sync_delay": 1} if streaming else {}
    return {
        "H": tuple((f"H{h}", {"sync.sync_every": h}) for h in hs),
        "outer": tuple(
            (f"olr{o:g}", {"sync.outer_lr": o, "sync.outer_momentum": 0.5, **extra})
            for o in (0.5, 0.7)
        ),
    }


register(
    SyncMethod(
        "diloco",
        "DiLoCo",
        "#393b79",
        "peer 2026",
        order=70,
        doc="outer Nesterov step every H steps",
        default=True,
        spaces=space,
    )
)
