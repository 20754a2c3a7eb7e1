"""Random-k per bucket with error feedback, flat all-gather: the selection's lower bound."""

from bench.methods.kinds import SparseMethod, sparse_space
from bench.methods.spec import register

register(
    SparseMethod(
        "randomk",
        "randomk",
        "#8c564b",
        "variant",
        order=31,
        doc="random-k, flat all-gather",
        not_modelled="its selection cost (random indices) is not in the model",
        spaces=sparse_space,
    )
)
