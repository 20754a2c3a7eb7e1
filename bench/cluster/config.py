"""Schema of the ``cluster`` config group (conf/cluster/*.yaml): ``local`` (this machine),
``multinode`` (one node of a real cluster) or ``emulated`` (network namespaces joined by
a ``tc``-shaped bridge on this machine)."""

from dataclasses import dataclass

from bench.registry import Choice


class Backend(Choice):
    auto = "auto"  # nccl with CUDA, else gloo
    nccl = "nccl"
    gloo = "gloo"


@dataclass
class ClusterConfig:
    name: str = "local"  # bench.launch.run.LAUNCHERS: local | multinode | emulated
    nnodes: int = 1
    nproc_per_node: int = 2  # workers per node (CPU default 2; set to the GPU count on GPU nodes)
    node_rank: int = 0  # multinode: this node's rank
    rdzv_endpoint: str = ""  # host:port of the c10d rendezvous; "" = localhost on a free port
    rdzv_id: str = ""  # multinode: the same on every node of one job ("" = launcher default)
    # multinode: the address the other nodes reach this node at (its agent's, and node 0's
    # store for the workers); "" = what its host name resolves to, right where host names
    # name the nodes, not where the nodes share one host name (namespaces, some containers)
    local_addr: str = ""
    rdzv_timeout_s: int = 300  # give up when the rendezvous is not complete after this long
    max_restarts: int = 0  # elastic restarts of the worker group
    backend: Backend = Backend.auto  # of torch.distributed
    # torch intra-op threads per worker; 0 = $OMP_NUM_THREADS, else cores / workers on this host
    threads_per_worker: int = 0
    # --- emulated cluster (cluster=emulated) ---
    # each node's link rate, each way (tc tbf; bucket 4 frames, queue 64 KiB/2 ms)
    inter_node_bandwidth: str = "1gbit"
    inter_node_latency: str = "0.2ms"  # one-way node-to-node delay (tc netem, if the kernel has it)
    link_check: bool = True  # measure every link both ways; refuse when off by > link_tolerance
    link_tolerance: float = 0.25  # allowed relative deviation of bandwidth and small-message time
    link_check_s: float = 0.5  # seconds of traffic the bandwidth check sends at the nominal rate
    # a named link profile (bench.launch.profile): ``paper`` sets inter_node_bandwidth so
    # that dense communication / compute per step is the paper's cluster's ratio
    profile: str | None = None
    profile_compute_s: float | None = None  # the profile's compute time per step; None = timed
    subnet: str = "10.213.0.0/24"  # private addresses of the emulated nodes (node i gets .i+1)
    rdzv_port: int = 29400  # c10d rendezvous port on node 0 (inside its namespace)
