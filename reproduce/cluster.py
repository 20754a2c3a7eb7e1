"""``python -m reproduce cluster slurm-up|slurm-down|list|cleanup``

``slurm-up`` makes a real Slurm cluster on this machine (``bench/cluster/slurm.py``) of
``--nodes`` emulated nodes, prints the ``export SLURM_CONF=...`` line and holds it until
Ctrl-C or ``slurm-down``.  ``list`` and ``cleanup`` show and remove the emulated clusters of
dead owners.  Needs root, iproute2, and Debian's ``slurm-wlm`` and ``munge``.
"""

from __future__ import annotations

import json
from pathlib import Path

from reproduce._cli import Parser, fail

USAGE = """cluster slurm-up [--nodes N] [--inter-node-bandwidth BW] [--inter-node-latency T]
        [--cpus C] [--mem-mb M] [--partition P] [--results-dir DIR] [--dry-run]
        | cluster slurm-down [--id ID] | cluster list | cluster cleanup
                          a real local Slurm cluster, one slurmd per emulated node
                          (root, slurm-wlm, munge); prints the SLURM_CONF to export"""


def _parser() -> Parser:
    p = Parser(
        "cluster",
        summary="cluster: a local Slurm cluster on emulated nodes, and the emulated clusters "
        "of this machine.",
        example="python -m reproduce cluster slurm-up --nodes 2 --inter-node-bandwidth 1gbit",
    )
    p.add_argument(
        "cmd",
        choices=("slurm-up", "slurm-down", "list", "cleanup"),
        help="slurm-up: start the cluster and hold it until "
        "Ctrl-C; slurm-down: stop it; list, cleanup: the emulated clusters",
    )
    up = p.add_argument_group("slurm-up")
    up.add_argument("--nodes", type=int, default=1, help="emulated nodes, one slurmd each")
    up.add_argument("--inter-node-bandwidth", default="1gbit", help="each node's link")
    up.add_argument("--inter-node-latency", default="0", help="each node's added latency")
    up.add_argument("--cpus", type=int, default=0, help="CPUs per node (default: this machine's)")
    up.add_argument("--mem-mb", type=int, default=0, help="MiB per node (default: a share)")
    up.add_argument("--partition", default="cpu", help="the one partition's name")
    up.add_argument("--results-dir", default=None,
                    help="on stop, keep the daemons' logs under DIR/slurm-logs/")  # fmt: skip
    up.add_argument("--dry-run", action="store_true",
                    help="print the slurm.conf it would write; nothing started")  # fmt: skip
    p.add_argument("--id", default=None, help="slurm-down: only this cluster (default: all)")
    return p


def main(argv: list[str]) -> None:
    from bench.cluster import netns, slurm
    from bench.registry import ConfigError

    args = _parser().parse_args(argv)
    try:
        if args.cmd == "slurm-up":
            if not 1 <= args.nodes <= 16:
                raise ConfigError(f"--nodes must be in 1..16, got {args.nodes}")
            cluster = slurm.SlurmCluster(
                args.nodes,
                netns.parse_bandwidth(args.inter_node_bandwidth),
                netns.parse_latency(args.inter_node_latency),
                cpus=args.cpus,
                mem_mb=args.mem_mb,
                partition=args.partition,
                keep_logs=Path(args.results_dir) if args.results_dir else None,
            )
            if args.dry_run:
                print(cluster.plan())
                return
            slurm.require_slurm()
            try:
                slurm.serve(cluster)
            except (KeyboardInterrupt, SystemExit):
                print("# stopped: every daemon, namespace and link removed", flush=True)
        elif args.cmd == "slurm-down":
            stopped = slurm.stop(args.id)
            print(f"stopped {', '.join(stopped)}" if stopped else "no local Slurm cluster running")
        elif args.cmd == "cleanup":
            print("\n".join(netns.cleanup_leftovers()) or "nothing to remove")
        else:
            print(json.dumps(netns.describe_all(), indent=1))
    except ConfigError as e:
        fail(f"cluster: {e}")
    except RuntimeError as e:
        fail(f"cluster: {e}", code=1)
