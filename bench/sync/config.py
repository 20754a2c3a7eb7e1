"""Schema of the ``sync`` config group (conf/sync/*.yaml): how the replicas of a run meet
(``ddp``: every step; the others: every ``sync_every`` (H) inner steps, :mod:`bench.sync`)."""

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
    # Streaming DiLoCo: inner steps a fragment's allreduce overlaps before its outer step
    # is applied (< H / fragments)
    fragment_sync_delay: int = 0
    # seconds a replica group waits for the others at an outer synchronisation (a period
    # of H inner steps on the slowest node must fit)
    quorum_timeout_s: float = 1800.0
    # sparse outer exchanges (sparseloco, hitopk_diloco): the fraction of the error-feedback
    # buffer's elements sent per outer step, in (0, 1] (per chunk, or per node shard)
    density: float = 0.015625
    # sparse outer exchanges: the error-feedback buffer's decay, e <- ef_beta * e + delta,
    # in [0, 1] (1: nothing unsent is forgotten; 0: no error feedback)
    ef_beta: float = 0.95
    # sparseloco: elements per chunk, each chunk its own top-k (a smaller tensor is one chunk)
    chunk_size: int = 4096
    # sparseloco: bits per value sent, 1 to 8 (a sign and a magnitude level, with each
    # chunk's float32 level scales), or 0 for float32 values
    quant_bits: int = 2
    # hitopk_diloco: how MSTopK finds its threshold (bench.comm.selection.mstopk)
    mstopk_method: MSTopKMethod = MSTopKMethod.tiled
