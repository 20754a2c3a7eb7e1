"""python -m reproduce <command> [args]

commands:
  train [overrides]       one training run (Hydra overrides; -m for a multirun sweep)
  train resume=RUN_ID [results.dir=DIR] [train.epochs=N ...]
                          continue a stopped, interrupted or killed run from its last
                          checkpoint, into the same run id (also: dawnbench resume=RUN_ID)
  train|dawnbench --dry-run [overrides]
                          print the resolved config and what would be launched; run nothing
  dawnbench [overrides]   the DAWNBench-style time-to-accuracy recipe for the chosen data
                          (digits by default; data=cifar10|imagenet data.root=... for the real ones;
                          data=translation: a Transformer on the embedded corpus or data.root=...)
"""

from __future__ import annotations

import sys

DAWNBENCH = {
    "digits": "dawnbench_digits",
    "cifar10": "dawnbench_cifar10",
    "imagenet": "dawnbench_imagenet",
    "translation": "transformer_embedded",
}


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def _precheck(overrides: list[str]) -> None:
    """Compose the config once to turn Hydra's errors into one clear line (single runs)."""
    if any(o in ("-m", "--multirun") for o in overrides) or any(
        o.startswith("-") for o in overrides
    ):
        return  # sweeps and Hydra flags: Hydra reports its own errors
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from reproduce.train import CONF_DIR

    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        from reproduce._dryrun import hydra_error

        _fail(hydra_error(e))  # one line; an unknown group option lists the known ones


def _resume(overrides: list[str]) -> None:
    """``resume=<run_id>``: the checkpoint's config, not Hydra's composition."""
    from bench.launch.run import resume
    from bench.registry import ConfigError

    run_id = next(o.split("=", 1)[1] for o in overrides if o.startswith("resume="))
    rest = [o for o in overrides if not o.startswith(("resume=", "experiment=", "data="))]
    try:
        rc, _ = resume(run_id, rest)
    except ConfigError as e:
        _fail(str(e))
    sys.exit(rc)


def _hydra(overrides: list[str]) -> None:
    if "--dry-run" in overrides:
        from reproduce._dryrun import dry_run

        dry_run([o for o in overrides if o != "--dry-run"])
        return
    if any(o.startswith("resume=") for o in overrides):
        _resume(overrides)
    _precheck(overrides)
    from reproduce.train import app

    sys.argv = [sys.argv[0], *overrides]
    app()


def _commands() -> dict[str, str]:
    """Every command module of this package: ``reproduce/<name>.py`` with ``USAGE`` and
    ``main(argv)``; the module's first docstring line is its help."""
    import importlib
    import pkgutil

    import reproduce

    out = {}
    for m in pkgutil.iter_modules(reproduce.__path__):
        if m.name.startswith("_") or m.name == "train":
            continue
        mod = importlib.import_module(f"reproduce.{m.name}")
        if hasattr(mod, "USAGE") and hasattr(mod, "main"):
            out[m.name] = mod.USAGE
    return out


def _help() -> str:
    extra = "".join(f"  {usage}\n" for usage in _commands().values())
    return __doc__.rstrip() + "\n" + extra


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_help())
        sys.exit(0 if argv else 2)
    cmd, rest = argv[0], argv[1:]
    if cmd == "train":
        _hydra(rest)
    elif cmd == "dawnbench":
        data = next((o.split("=", 1)[1] for o in rest if o.startswith("data=")), "digits")
        if data not in DAWNBENCH:
            _fail(f"dawnbench has recipes for data={', '.join(DAWNBENCH)}; got data={data}")
        if not any(o.startswith("experiment=") for o in rest):
            rest = [
                f"experiment={DAWNBENCH[data]}",
                *[o for o in rest if not o.startswith("data=")],
            ]
        _hydra(rest)
    elif cmd in (commands := _commands()):
        import importlib

        importlib.import_module(f"reproduce.{cmd}").main(rest)
    else:
        names = ", ".join(["train", "dawnbench", *sorted(commands)])
        _fail(f"unknown command {cmd!r}; choose one of: {names}")


if __name__ == "__main__":
    main(sys.argv[1:])
