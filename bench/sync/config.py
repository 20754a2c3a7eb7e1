"""Schema of the ``sync`` config group (conf/sync/*.yaml, :mod:`bench.sync`)."""

from __future__ import annotations

from dataclasses import dataclass

from bench.comm.config import MSTopKMethod


@dataclass
class SyncConfig:
    name: str = "ddp"  # a key of bench.sync.SYNCS (SYNCS.names() lists them)
    sync_every: int = 50  # H: inner optimizer steps between two outer synchronisations
    outer_lr: float = 0.7  # DiLoCo: the outer SGD's learning rate on the pseudo-gradient
    outer_momentum: float = 0.9  # DiLoCo: the outer SGD's momentum
    nesterov: bool = True  # DiLoCo: Nesterov momentum in the outer step
    fragments: int = 1  # Streaming DiLoCo: model fragments synchronised in turn (divides H)
    # Streaming DiLoCo: inner steps a fragment's allreduce overlaps (< H / fragments)
    fragment_sync_delay: int = 0
    # s a replica group waits for the others at an outer sync (H steps of the slowest node)
    quorum_timeout_s: float = 1800.0
    # sparse outer exchanges: the fraction of the error-feedback buffer sent per outer step,
    # in (0, 1] (per chunk, or per node shard)
    density: float = 0.015625
    # sparse outer exchanges: e <- ef_beta * e + delta (1: nothing unsent is forgotten)
    ef_beta: float = 0.95
    # sparseloco: elements per chunk, each chunk its own top-k (a smaller tensor is one chunk)
    chunk_size: int = 4096
    # sparseloco: bits per value, 1 to 8 (a sign and a level of the chunk's float32 scales),
    # or 0 for float32 values
    quant_bits: int = 2
    # hitopk_diloco: how MSTopK finds its threshold (bench.comm.selection.mstopk)
    mstopk_method: MSTopKMethod = MSTopKMethod.tiled
