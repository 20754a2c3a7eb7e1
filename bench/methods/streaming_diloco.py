"""Streaming DiLoCo (Douillard et al. 2025) through torchft: DiLoCo over fragments in
turn, each all-reduce overlapping inner steps."""

from dataclasses import dataclass

from bench.methods.diloco import space
from bench.methods.kinds import SyncKnobs, SyncMethod
from bench.methods.spec import key, register


@dataclass(frozen=True)
class StreamingKnobs(SyncKnobs):
    """Its own defaults (conf/sync/streaming_diloco.yaml): 2 fragments, 1 step of delay."""

    fragments: int = key("sync.fragments", 2)
    fragment_sync_delay: int = key("sync.fragment_sync_delay", 1)


register(
    SyncMethod(
        "streaming_diloco",
        "Streaming DiLoCo",
        "#6b6ecf",
        "peer 2026",
        order=80,
        doc="DiLoCo over fragments in turn, overlapped",
        default=True,
        knob_type=StreamingKnobs,
        spaces=lambda workload, ref: space(workload, ref, streaming=True),
    )
)
