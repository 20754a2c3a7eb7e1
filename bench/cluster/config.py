"""Schema of the ``cluster`` config group (conf/cluster/*.yaml)."""

from dataclasses import dataclass


@dataclass
class ClusterConfig:
    name: str = "local"  # local | multinode | emulated
    nnodes: int = 1
    nproc_per_node: int = 2  # workers per node (CPU default 2; set to the GPU count on GPU nodes)
    node_rank: int = 0  # multinode: this node's rank
    rdzv_endpoint: str = ""  # host:port of the c10d rendezvous; "" = localhost on a free port
    rdzv_timeout_s: int = 300  # give up when the rendezvous is not complete after this long
    max_restarts: int = 0  # elastic restarts of the worker group
    backend: str = "auto"  # auto (nccl with CUDA, else gloo) | nccl | gloo
    threads_per_worker: int = 0  # torch intra-op threads per worker; 0 = cores / local workers
