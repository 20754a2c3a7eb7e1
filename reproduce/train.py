"""``python -m reproduce train [overrides]``: the Hydra app (``-m`` for multirun sweeps)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from bench.config import register_configs

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
register_configs()
# set by ``python -m reproduce`` once it has made the run's checks, not to make them again
PRECHECKED = False


def task(cfg: DictConfig) -> float | None:
    """One Hydra job: the run of ``cfg`` (also each job a sweep submits through a launcher)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    experiment = hc.runtime.choices.get("experiment") or cfg.experiment
    return launch(cfg, experiment, hc.runtime.output_dir, hc.mode == RunMode.MULTIRUN)


def launch(cfg: DictConfig, experiment: str, output_dir: str, multirun: bool) -> float | None:
    """The run of ``cfg``; its time to target (a sweeper's objective), if reached."""
    from bench.launch.run import run
    from bench.registry import ConfigError

    try:
        checked = PRECHECKED and not multirun
        rc, rec = run(cfg, experiment=experiment, output_dir=output_dir, checked=checked)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except Exception as e:  # noqa: BLE001  (a launch that failed: recorded, one line here)
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    if rec is not None and not multirun:  # after the workers' closing lines
        import os

        from bench.results.outputs import WIDTH, comparison_lines

        out = output_dir  # relative when results.dir is, as the lines above
        out = out if os.path.isabs(str(cfg.results.dir)) else os.path.relpath(out)
        print(f"  {'launch files':<{WIDTH}}  {out}/ (Hydra's config, the workers' run JSON)")
        # the run against the reference record of its recipe, and what to do next
        lines = comparison_lines(rec, results_dir=str(cfg.results.dir))
        print("\n".join(after_stop(rec, cost_lines(rec) + lines, sys.argv[1:])), flush=True)
    if rc and not multirun:
        sys.exit(rc)
    return rec.get("time_to_target_s") if rec else None


def outside_hydra(cfg: DictConfig, overrides: list[str]) -> None:
    """The run of ``cfg`` with its launch folder made here as Hydra's would be: Hydra reads
    its output folder's path back as an OmegaConf string, which ``${`` in it breaks."""
    import datetime

    import yaml
    from omegaconf import OmegaConf

    stamp = datetime.datetime.now().strftime("%Y-%m-%d/%H-%M-%S-%f")  # as conf/config.yaml's
    out = Path(cfg.results.dir) / "hydra" / stamp
    (out / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, out / ".hydra" / "config.yaml")
    (out / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    chosen = [o.split("=", 1)[1] for o in overrides if o.startswith("experiment=")]
    launch(cfg, chosen[-1] if chosen else cfg.experiment, str(out), multirun=False)


def cost_lines(rec: dict) -> list[str]:
    """The cost to target of a run that reached it, or how to have it."""
    tt = rec.get("time_to_target_s")
    if tt is None:
        return []
    price = ((rec.get("config") or {}).get("results") or {}).get("cost_per_hour")
    if price is None:
        return [
            "cost to target: unknown; results.cost_per_hour=<USD per hour of this machine> "
            "gives it (the DAWNBench JSON's costToTargetUSD)"
        ]
    return [f"cost to target: {float(price) * tt / 3600:.4f} USD at {price} USD per hour"]


def after_stop(rec: dict, lines: list[str], argv: list[str]) -> list[str]:
    """``lines``; a run that stopped early without a checkpoint is told to run again."""
    if rec.get("status") not in ("interrupted", "error"):
        return lines
    lines = [ln for ln in lines if not ln.startswith("next: ")]
    if not rec.get("checkpoint"):
        again = " ".join(shlex.quote(a) for a in argv)
        lines.append(f"next: no checkpoint to continue from; run it again: "
                     f"python -m reproduce train {again}")  # fmt: skip
    return lines


app = hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")(task)
