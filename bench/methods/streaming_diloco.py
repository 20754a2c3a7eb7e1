"""Streaming DiLoCo (Douillard et al. 2025) through torchft: DiLoCo over fragments in
turn, each all-reduce overlapping inner steps."""

from bench.methods.diloco import space
from bench.methods.kinds import SyncMethod
from bench.methods.spec import register

register(
    SyncMethod(
        "streaming_diloco",
        "Streaming DiLoCo",
        "#6b6ecf",
        "peer 2026",
        order=80,
        doc="DiLoCo over fragments in turn, overlapped",
        default=True,
        spaces=lambda workload, ref: space(workload, ref, streaming=True),
    )
)
