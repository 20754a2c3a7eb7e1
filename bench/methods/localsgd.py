"""Local SGD (Lin et al. 2018) through torchft: the replicas' weights averaged every H steps."""

from bench.methods.kinds import SyncMethod
from bench.methods.spec import Space, register


def space(workload: str, ref: int) -> Space:
    hs = (20, 50) if workload == "translation" else (5, 10, 20, 40)
    return {"H": tuple((f"H{h}", {"sync.sync_every": h}) for h in hs)}


register(
    SyncMethod(
        "localsgd",
        "Local SGD",
        "#bcbd22",
        "peer 2026",
        order=65,
        doc="average the weights every H steps",
        spaces=space,
    )
)
