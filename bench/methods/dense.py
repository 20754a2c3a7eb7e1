"""Dense fp32 all-reduce of every gradient bucket (DDP's default): the baseline."""

from bench.methods.spec import MethodSpec, register

register(
    MethodSpec(
        "dense",
        "dense",
        "#555555",
        "baseline",
        order=0,
        doc="fp32 all-reduce of every bucket",
        benched=True,
        default=True,
    )
)
