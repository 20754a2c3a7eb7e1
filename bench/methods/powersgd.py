"""PowerSGD (Vogels et al. 2019) through torch's powerSGD_hook: a 2020 peer."""

from bench.methods.kinds import LowRankMethod
from bench.methods.spec import Space, register

START_SHARE = 0.10  # the later start: torch's "about 10 % of the steps to target"


def space(workload: str, ref: int) -> Space:
    """rank {4, 8} x start {step 2, START_SHARE of dense's steps}."""
    late = max(3, round(START_SHARE * ref))
    return {
        "rank": tuple((f"rank{r}", {"comm.powersgd_rank": r}) for r in (4, 8)),
        "start": (
            ("start2", {"comm.warmup_steps": 0}),
            (f"start{late}", {"comm.warmup_steps": late}),
        ),
    }


register(
    LowRankMethod(
        "powersgd",
        "PowerSGD",
        "#2ca02c",
        "peer 2020",
        order=20,
        doc="rank-r P and Q all-reduces",
        benched=True,
        shapes_why="PowerSGD compresses matrices",
        default=True,
        spaces=space,
    )
)
