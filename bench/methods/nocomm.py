"""The compute-only step (the nocomm hook sends nothing): the scaling study's reference,
not a method."""

from bench.methods.kinds import ReferenceMethod
from bench.methods.spec import register

register(
    ReferenceMethod("nocomm", "compute only", "#bbbbbb", "reference", order=99, doc="sends nothing")
)
