"""fp16 compression of every bucket (torch's fp16_compress_hook's idea): a 2020 peer."""

from bench.methods.spec import MethodSpec, register

register(
    MethodSpec(
        "fp16",
        "fp16",
        "#1f77b4",
        "peer 2020",
        order=10,
        doc="fp16 all-reduce",
        benched=True,
        default=True,
        wire_bytes=2,
    )
)
