"""A run's structured config: each group's schema (``bench/<group>/config.py``) in
:class:`Config`, Hydra's ``base_config``, so that a misspelt key or a mistyped value is
refused before anything starts."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from bench.cluster.config import ClusterConfig
from bench.comm.config import CommConfig
from bench.data.config import CacheConfig, DataConfig
from bench.models.config import ModelConfig
from bench.optim.config import OptimConfig
from bench.registry import Choice
from bench.results.paths import RUNS_DIR
from bench.sync.config import SyncConfig


class Amp(Choice):
    auto = "auto"  # bf16 on CUDA, off on CPU
    off = "off"
    bf16 = "bf16"
    fp16 = "fp16"  # with a GradScaler


class Device(Choice):
    auto = "auto"  # CUDA when present
    cpu = "cpu"
    cuda = "cuda"


class NanCheck(Choice):
    step = "step"  # every step: a reduced gradient bucket with NaN/Inf stops before the update
    epoch = "epoch"  # the epoch's mean training loss only
    off = "off"


@dataclass
class TrainConfig:
    epochs: int = 10  # epoch budget
    target_metric: str = "top1"  # one of the workload's metrics (classification: top1 | top5)
    target_value: float = 0.98  # fraction, e.g. 0.93 for 93 % top-5
    stop_at_target: bool = True  # stop at the first evaluation reaching the target
    seed: int = 0
    amp: Amp = Amp.auto
    max_steps_per_epoch: int = 0  # > 0 truncates epochs (smoke tests, throughput runs)
    eval_every: int = 1  # evaluate every N epochs (and always after the last)
    # > 0: also evaluate after every N-th optimizer step, time to target resolved to N steps
    eval_every_steps: int = 0
    # no evaluation but the last before this optimizer step: a sweep skips those that
    # cannot hit the target (a run that hits at its first is flagged in its record)
    eval_from_step: int = 0
    # > 1 with eval_every_steps: evaluate every eval_every_steps x this steps, keeping the
    # models between; once one reaches the target, the kept ones are evaluated oldest
    # first: the same first step at the target, for fewer evaluations
    eval_stride: int = 1
    progress: bool = True  # progress bar on rank 0
    device: Device = Device.auto
    time_phases: bool = True  # on CUDA, synchronise at phase boundaries to attribute step time
    workload: str = "classification"  # registry key in bench.train.workload
    checkpoint_every: int = 1  # checkpoint every N epochs and at the end; 0 = never
    keep_checkpoints: int = 2  # the newest N checkpoints are kept under <results>/checkpoints
    nan_check: NanCheck = NanCheck.step  # where a NaN/Inf stops the run as diverged


@dataclass
class ResultsConfig:
    # runs.jsonl, curves/, figures/; runs/ is git-ignored: a user's runs never change the
    # committed results (results/: written only when named)
    dir: str = RUNS_DIR
    plot: bool = True  # write a time-to-accuracy PNG beside the run's curve, <dir>/curves
    plot_sweeps: bool = False  # a sweep's runs (sweep_id set) draw theirs only with this
    # DAWNBench files (<dir>/dawnbench) and the MLPerf log (<dir>/mllog): author and e-mail
    # (DAWNBench wants both), the hardware's cost in USD per hour (costPerHour; null: left out)
    author: str = "unknown"
    author_email: str = "unknown"
    cost_per_hour: float | None = None
    sweep_id: str = ""  # set by `reproduce ablation|scaling`: the sweep this run belongs to
    # set by the tuning protocol, the record's `protocol`: its name ("": none), the run's
    # role (tune | eval), the trial's label, whether it was the one carried forward
    protocol: str = ""
    protocol_role: str = ""
    protocol_trial: str = ""
    protocol_selected: bool = False
    protocol_cluster: str = ""  # the measured cluster it ran on ("": the sweep's own)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    results: ResultsConfig = field(default_factory=ResultsConfig)
    experiment: str = "default"  # set by conf/experiment/*.yaml; stored in the record


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)


def hydra_value(text: str) -> str:
    """``text`` as a Hydra override's value that reads back as ``text`` (quoted unless plain)."""
    if re.fullmatch(r"[\w./+~@:-]+", text, flags=re.ASCII):
        return text
    body = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text.replace("${", "\\${"))
    return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, body) + "'"  # before a quote


def _literal(value: Any) -> Any:
    """A plain value's strings as OmegaConf literals (``${`` in a path is no interpolation)."""
    if isinstance(value, dict):
        return {k: _literal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_literal(v) for v in value]
    return value.replace("${", "\\${") if isinstance(value, str) else value


def to_container(cfg: DictConfig | Config) -> dict[str, Any]:
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.merge(OmegaConf.structured(type(cfg)), _literal(dataclasses.asdict(cfg)))
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True, enum_to_str=True)  # type: ignore[return-value]


def to_object(cfg: DictConfig | Config) -> Config:
    """Plain dataclasses (on a DictConfig, ``cfg.optim.update`` is ``dict.update``)."""
    if isinstance(cfg, Config):
        return cfg
    return OmegaConf.to_object(cfg)  # type: ignore[return-value]


def from_container(d: dict[str, Any]) -> Config:
    base = OmegaConf.structured(Config)
    return to_object(OmegaConf.merge(base, _literal(d)))  # type: ignore[arg-type]
