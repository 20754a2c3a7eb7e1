"""The command behind a report's number: a recorded run's ``python -m reproduce train`` line
recovered from its config (:class:`CommandMaker`), and a recipe's ``to run:`` command."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bench import methods
from bench.config import register_configs
from bench.results.env import REPO_ROOT

CONF_DIR = REPO_ROOT / "conf"
GROUPS = ("model", "data", "cache", "optim", "comm", "cluster")
# keys that differ between runs of one command without being asked for; results.dir too, so
# that a command copied from the report writes to the reader's default results directory
_IGNORE = {
    "cluster.rdzv_id",
    "cluster.rdzv_port",
    "cluster.node_rank",
    "cluster.local_addr",
    "train.progress",
    "results.dir",
}


def known_experiments() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d.value if isinstance(d, enum.Enum) else d}


def _text(v: Any) -> str:
    if isinstance(v, str) and v.startswith(str(REPO_ROOT) + "/"):
        v = v[len(str(REPO_ROOT)) + 1 :]  # a path inside the checkout, as typed from its root
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "'[" + ",".join(_text(x) for x in v) + "]'"
    if v is None:
        return "null"
    s = str(v)
    return f"'{s}'" if (not s or any(c in s for c in " ,[]{}()'\"=")) else s


class CommandMaker:
    """Recovers commands, composing each distinct recipe once (composition takes seconds)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, ...], dict[str, Any] | None] = {}

    def _compose(self, choices: tuple[str, ...]) -> dict[str, Any] | None:
        if choices not in self._cache:
            register_configs()
            try:
                with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                    cfg = compose(config_name="config", overrides=list(choices))
                self._cache[choices] = _flat(OmegaConf.to_container(cfg, resolve=True))
            except (HydraException, OmegaConfBaseException, ValueError):
                self._cache[choices] = None
        return self._cache[choices]

    def choices(self, record: dict[str, Any]) -> list[str]:
        """``experiment=...`` and the group options a record's config names."""
        config = record.get("config") if isinstance(record.get("config"), dict) else {}
        exp = record.get("experiment") or config.get("experiment")
        out = [f"experiment={exp}"] if exp in known_experiments() else []
        for g in GROUPS:
            name = (config.get(g) or {}).get("name") if isinstance(config.get(g), dict) else None
            if name in {p.stem for p in (CONF_DIR / g).glob("*.yaml")}:
                out.append(f"{g}={name}")
        return out

    def overrides(self, record: dict[str, Any]) -> list[str] | None:
        """The overrides that make this record's config; None when it cannot be composed."""
        choices = self.choices(record)
        base = self._compose(tuple(choices))
        if base is None or not isinstance(record.get("config"), dict):
            return None
        rec = _flat({k: v for k, v in record["config"].items() if k != "experiment"})
        diff = [
            f"{k}={_text(v)}"
            for k, v in rec.items()
            if k in base and k not in _IGNORE and base[k] != v and _text(base[k]) != _text(v)
        ]
        exp = [c for c in choices if c.startswith("experiment=")]
        groups = [c for c in choices if not c.startswith("experiment=")]
        recipe = self._compose(tuple(exp)) or {}
        kept = [c for c in groups if recipe.get(c.split("=")[0] + ".name") != c.split("=")[1]]
        return exp + kept + diff

    def command(self, record: dict[str, Any]) -> str:
        """``python -m reproduce train ...`` that makes a run like this record's."""
        ov = self.overrides(record)
        if ov is None:
            return "(not recoverable from the record: its config does not compose today)"
        return " ".join(["python -m reproduce train", *ov])

    def command_with(self, record: dict[str, Any], method: str) -> str:
        """The command of ``record`` run with ``method`` instead: its comm keys kept only
        for a sparse method, which needs them (density, warm-up)."""
        spec = methods.get(method)
        ov = self.overrides(record)
        if ov is None:
            ov = [f"experiment={record.get('experiment')}"]
        ov = [o for o in ov if not o.startswith(("comm=", "results.sweep_id="))]
        if not spec.sparse:
            ov = [o for o in ov if not o.startswith("comm.")]
        keep = [o for o in ov if o.startswith("results.")]
        ov = [o for o in ov if not o.startswith("results.")]
        return " ".join(["python -m reproduce train", *ov, *spec.overrides(), *keep])


def recipe_command(exp: str) -> str:
    """The ``to run:`` comment of a recipe's config file as Markdown: the command (its lines
    joined) in backticks, then any words before it."""
    path = CONF_DIR / "experiment" / f"{exp}.yaml"
    lines = path.read_text().splitlines() if path.is_file() else []
    start = next((i for i, ln in enumerate(lines) if re.match(r"#\s*to run:", ln)), None)
    if start is None:
        return f"`python -m reproduce train experiment={exp}`"
    text = [re.sub(r"^#\s*(to run:)?\s*", "", ln) for ln in lines[start : start + 6]]
    first = next((i for i, t in enumerate(text) if "python -m reproduce" in t), None)
    if first is None:
        return f"`python -m reproduce train experiment={exp}` ({text[0]})"
    note, _, cmd = text[first].partition("python -m reproduce")
    parts = ["python -m reproduce" + cmd]
    for t in text[first + 1 :]:
        if not parts[-1].rstrip().endswith("\\"):
            break
        parts[-1] = parts[-1].rstrip()[:-1].rstrip()
        parts.append(t.strip())
    # words after the command in parentheses are a note (or an alternative: "(or: ...)"),
    # never part of what is pasted; an override's own "choice(a,b)" has no space before it
    cmd, _, after = " ".join(parts).partition(" (")
    after = after.strip().removesuffix(")").strip()
    note = (text[0] if first else note).strip(" (") or ("" if after.startswith("or:") else after)
    return f"`{cmd.strip()}`" + (f" ({note})" if note else "")


def unrun_experiments(ran: Iterable[str]) -> list[str]:
    """``- <recipe>: <its command>`` per recipe with no record among ``ran``."""
    done = set(ran)
    return [f"- {e}: {recipe_command(e)}" for e in known_experiments() if e not in done]


def runs_dir(report_dir: str | Path) -> str:
    """The results directory a report's commands write to: the one it was made from (for
    ``<dir>/with-reference/``, the user's ``<dir>``)."""
    d = Path(report_dir)
    return str(d.parent if d.name == "with-reference" else d)
