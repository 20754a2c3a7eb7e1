"""Exact top-k (torch.topk) per bucket with error feedback, flat all-gather: MSTopK's
reference."""

from bench.methods.kinds import SparseMethod, sparse_space
from bench.methods.spec import register

register(
    SparseMethod(
        "topk",
        "topk",
        "#9467bd",
        "variant",
        order=30,
        doc="exact top-k, flat all-gather",
        benched=True,
        not_modelled="the model's selection cost is MSTopK's; torch.topk's was not measured on "
        "the projected GPU (its bytes are mstopk's)",
        spaces=sparse_space,
    )
)
