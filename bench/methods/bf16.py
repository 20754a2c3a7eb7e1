"""bf16 compression of every bucket: the same 2-byte wire as fp16, a wider exponent."""

from bench.methods.spec import MethodSpec, register

register(
    MethodSpec(
        "bf16",
        "bf16",
        "#17becf",
        "peer 2020",
        order=11,
        doc="bf16 all-reduce",
        not_modelled="sends the same 2-byte elements as fp16: its row is fp16's",
        wire_bytes=2,
    )
)
