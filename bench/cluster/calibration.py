"""The performance model's constants, read from rows measured on a device.

``results/calibration/<device>.csv`` holds what ``python -m bench.gpucheck.calibrate``
measured there (the ``calibrate`` step of ``reproduce gpucheck``): one row per model and
quantity, in seconds, per step, element or pair.  :func:`costs` gives the per-element
costs that :class:`bench.cluster.perfmodel.Costs` takes, :func:`workload` the per-step
times of :class:`bench.cluster.perfmodel.Workload`, :func:`constants` every quantity of
one model.  Standard library only.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

CALIBRATION_DIR = Path(__file__).resolve().parents[2] / "results" / "calibration"
FIELDS = ("device", "model", "quantity", "value", "per", "n", "batch", "density", "rank",
          "precision", "hardware", "git_sha", "date", "torch", "threads", "loadavg_1m")  # fmt: skip
SELECT = "select_s["  # select_s[<selector>]: a selector of bench.comm.selection.SELECTORS


def device_slug(name: str) -> str:
    """A device's name as a file name: ``NVIDIA H200`` -> ``nvidia-h200``."""
    name = re.sub(r"\((r|tm|c)\)", "", name.lower())
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "unknown"


def devices(root: Path = CALIBRATION_DIR) -> list[str]:
    """The devices with calibration rows under ``root``."""
    return sorted(p.stem for p in Path(root).glob("*.csv"))


def load(source: str | Path, root: Path = CALIBRATION_DIR) -> list[dict[str, Any]]:
    """The rows of a CSV path, or of a device (its name or file name) under ``root``;
    values as floats.  FileNotFoundError names the devices there are."""
    path = Path(source)
    if not path.is_file():
        path = Path(root) / f"{device_slug(str(source))}.csv"
    if not path.is_file():
        have = ", ".join(devices(root)) or "none"
        raise FileNotFoundError(f"no calibration rows for {source!r} ({path}); devices: {have}")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for key in ("value", "n", "batch", "density", "rank"):
            r[key] = float(r[key]) if r.get(key) not in (None, "") else None
    return rows


def constants(
    model: str, source: str | Path, density: float = 0.01, root: Path = CALIBRATION_DIR
) -> dict[str, Any]:
    """Every quantity of ``model`` (seconds): ``compute_s`` (forward-backward, at ``batch``
    samples), ``update_s``, ``lowrank_s`` (PowerSGD's P, Q and orthogonalisation) and
    ``dct_s`` (DeMo's transform), per step; ``reduce_s``, ``dense_s`` and ``select_s``
    (per selector, as a hook runs it) per element; ``scatter_s`` per pair.  The latest row
    of each wins; the per-density ones at the measured density nearest ``density``."""
    rows = [r for r in load(source, root) if r["model"] == model]
    if not rows:
        raise KeyError(f"no calibration rows for model {model!r} in {source}")
    dens = {r["density"] for r in rows if r["density"] is not None}
    near = min(dens, key=lambda d: abs(d - density)) if dens else None
    out: dict[str, Any] = {"select_s": {}, "density": near}
    for r in rows:
        if r["density"] is not None and r["density"] != near:
            continue
        q, v = r["quantity"], r["value"]
        if q.startswith(SELECT):
            out["select_s"][q[len(SELECT) : -1]] = v
        elif q == "fwd_bwd_s":
            out.update(compute_s=v, batch=int(r["batch"]), precision=r.get("precision", ""))
        else:
            out[q] = v
    return out


def costs(
    model: str, source: str | Path, selector: str, density: float = 0.01,
    root: Path = CALIBRATION_DIR,
) -> dict[str, float]:  # fmt: skip
    """Keyword arguments of :class:`bench.cluster.perfmodel.Costs` for a top-k method of
    ``selector``: its selection plus the error-feedback addition (one summation pass) per
    element scanned, the scatter-add per pair, the elementwise and summation passes."""
    c = constants(model, source, density, root)
    if selector not in c["select_s"]:
        have = ", ".join(sorted(c["select_s"])) or "none"
        raise KeyError(f"no selection rows of {selector!r} for {model}; measured: {have}")
    return {"select_s": c["select_s"][selector] + c["reduce_s"], "scatter_s": c["scatter_s"],
            "dense_s": c["dense_s"], "reduce_s": c["reduce_s"]}  # fmt: skip


def workload(
    model: str, source: str | Path, batch: int | None = None, root: Path = CALIBRATION_DIR
) -> dict[str, float]:
    """``compute_s`` and ``update_s`` of :class:`bench.cluster.perfmodel.Workload`: the
    measured forward-backward scaled linearly to ``batch`` samples (None: as measured),
    and the update; plus ``lowrank_s`` and ``dct_s``, per step."""
    c = constants(model, source, root=root)
    scale = 1.0 if batch is None else batch / c["batch"]
    return {"compute_s": c["compute_s"] * scale, "update_s": c["update_s"],
            "lowrank_s": c["lowrank_s"], "dct_s": c["dct_s"]}  # fmt: skip
