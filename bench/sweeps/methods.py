"""The tuning protocol's methods: a name plus the Hydra overrides that select it, and the
one function that reads a run record's method back (every grouping by method uses it).
A comm hook's name selects itself; DeMo and the sync strategies are selected otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.comm import HOOKS

COMMS = ("dense", "fp16", "powersgd", "topk", "mstopk", "hitopk")
#: the methods that are not a comm hook: name -> the overrides that select it (a comm hook's
#: name selects itself, ``comm=<name>``).  DeMo replaces the optimizer and exchanges its own
#: compressed momentum, so DDP's all-reduce is switched off (its runs record comm=nocomm);
#: the sync strategies average replicas every H inner steps and need 2 nodes or more.
METHODS: dict[str, tuple[str, ...]] = {
    "demo": ("optim=demo", "comm=nocomm"),
    "localsgd": ("sync=localsgd",),
    "diloco": ("sync=diloco",),
    "streaming_diloco": ("sync=streaming_diloco",),
}
#: what a user would pick instead of dense fp32: the peers of 2020, then of 2023-2025 (every
#: table's and the composition's "best peer" is the fastest of these)
PEERS = ("fp16", "bf16", "powersgd", "demo", "localsgd", "diloco", "streaming_diloco")
#: what a protocol sweep runs by default, on both workloads: dense, the peers of 2020, the
#: paper's two, then the peers of 2023-2025.  Left out to fit the sweep in 180 minutes on 2
#: cores (each is a --comm away): the exact flat topk (mstopk's reference, compared in the
#: benchmarks) and Local SGD (DiLoCo with an outer SGD step of rate 1 and no momentum)
DEFAULT_METHODS = (
    "dense", "fp16", "powersgd", "mstopk", "hitopk", "demo", "diloco", "streaming_diloco"
)  # fmt: skip
#: methods the per-cluster step-time model (bench.cluster.perfmodel) cannot price: they
#: would be selected on the check cluster's clock alone, with no time at the ratios (none:
#: DeMo and the sync strategies are priced by pm.demo_step_time and pm.sync_step_time)
UNPRICED: tuple[str, ...] = ()


def method_overrides(method: str) -> list[str]:
    """The Hydra overrides that select ``method``: its :data:`METHODS` entry, else the comm
    hook of that name (ConfigError for neither, listing the known ones)."""
    if method in METHODS:
        return list(METHODS[method])
    HOOKS.get(method)
    return [f"comm={method}"]


def method_comm(method: str) -> str:
    """The comm hook ``method`` runs (a :data:`METHODS` entry: its ``comm=``, else dense)."""
    over = [o.removeprefix("comm=") for o in METHODS.get(method, ()) if o.startswith("comm=")]
    return over[0] if over else ("dense" if method in METHODS else method)


def method_of(rec: Mapping[str, Any]) -> str:
    """The protocol method a run record ran: ``demo`` when its optimizer is DeMo, its sync
    strategy when that is not ddp, else its comm hook.  Every grouping of records by
    method (tables, selection, status, report) goes through this one function."""
    cfg = rec.get("config") or {}
    if ((cfg.get("optim") or {}).get("name")) == "demo":
        return "demo"
    sync = (cfg.get("sync") or {}).get("name")
    if sync and sync != "ddp":
        return str(sync)
    return str(rec.get("comm"))
