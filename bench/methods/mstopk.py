"""The paper's MSTopK: approximate top-k by multiple sampling thresholds, error feedback,
flat all-gather of the pairs."""

from bench.methods.kinds import SparseMethod, sparse_space
from bench.methods.spec import register

register(
    SparseMethod(
        "mstopk",
        "mstopk",
        "#ff7f0e",
        "paper",
        order=40,
        doc="MSTopK selection, flat all-gather",
        benched=True,
        default=True,
        spaces=sparse_space,
        width=2.4,
    )
)
