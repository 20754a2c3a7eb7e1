"""The paper's HiTopKComm: reduce-scatter inside a node, MSTopK of each shard exchanged
between the nodes, all-gather inside the node."""

from bench.methods.kinds import HierarchicalMethod, sparse_space
from bench.methods.spec import register

register(
    HierarchicalMethod(
        "hitopk",
        "hitopk",
        "#d62728",
        "paper",
        order=50,
        doc="HiTopKComm: intra reduce-scatter, inter top-k",
        benched=True,
        default=True,
        spaces=sparse_space,
        width=2.4,
    )
)
