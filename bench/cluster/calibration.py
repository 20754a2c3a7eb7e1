"""The performance model's constants, read from the rows ``python -m
bench.gpucheck.calibrate`` measured on a device (``results/calibration/<device>.csv``: one
row per model and quantity, in seconds per step, element, pair, flop, call or byte).
Standard library only.
"""

from __future__ import annotations

import csv
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

CALIBRATION_DIR = Path(__file__).resolve().parents[2] / "results" / "calibration"
FIELDS = ("device", "model", "quantity", "value", "per", "n", "batch", "density", "rank",
          "precision", "hardware", "git_sha", "date", "torch", "threads", "loadavg_1m")  # fmt: skip
SELECT = "select_s["  # select_s[<selector>]: a selector of bench.comm.selection.SELECTORS
DCT = "dct"  # DeMo's transform, priced as its selection (Costs.selectors key)
LOOPBACK = "loopback"  # the model column of the intra-node path's rows (any model)


@dataclass(frozen=True)
class Costs:
    select_s: float = 0.0  # selection stage (error feedback + top-k), per element scanned
    scatter_s: float = 0.0  # scatter-add, per received pair
    dense_s: float = 0.0  # one elementwise pass (zero, add residual, scale), per element
    reduce_s: float = 0.0  # summation inside a reduction, per element added
    # PowerSGD's rank-r products (P = M Q, Q = M^T P, the rebuild P Q^T): per flop, per call
    matmul_s: float = 0.0
    matmul_call_s: float = 0.0
    # its orthogonalisation of P (torch.linalg.qr of n x r): per flop (2 n r^2), per call
    qr_s: float = 0.0
    qr_call_s: float = 0.0
    # per selector (and DCT: DeMo's transform), per element: select_s where one is missing
    selectors: Mapping[str, float] = field(default_factory=dict, hash=False, compare=False)

    def using(self, selector: str) -> Costs:
        return replace(self, select_s=self.selectors.get(selector, self.select_s))

    def scaled(self, factor: float) -> Costs:
        """Every cost ``factor`` times slower (workers sharing a host's cores)."""
        out = {
            f.name: getattr(self, f.name) * factor for f in fields(self) if f.name != "selectors"
        }
        return Costs(**out, selectors={k: v * factor for k, v in self.selectors.items()})


def device_slug(name: str) -> str:
    """A device's name as a file name: ``NVIDIA H200`` -> ``nvidia-h200``."""
    name = re.sub(r"\((r|tm|c)\)", "", name.lower())
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "unknown"


def devices(root: Path = CALIBRATION_DIR) -> list[str]:
    return sorted(p.stem for p in Path(root).glob("*.csv"))


def load(source: str | Path, root: Path = CALIBRATION_DIR) -> list[dict[str, Any]]:
    """The rows of a CSV path, or of a device (``cpu``: this machine's CPU) under ``root``;
    FileNotFoundError names the devices there are and how to measure this one."""
    if str(source) == "cpu":
        from bench.results.env import cpu_model  # deferred: only "cpu" needs this host's name

        source = cpu_model()
    path = Path(source)
    if not path.is_file():
        path = Path(root) / f"{device_slug(str(source))}.csv"
    if not path.is_file():
        have = ", ".join(devices(root)) or "none"
        raise FileNotFoundError(
            f"no calibration rows for {source!r} ({path}); measured: {have} (measure this "
            "CPU with: python -m bench.gpucheck.calibrate --cpu)"
        )
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for key in ("value", "n", "batch", "density", "rank"):
            r[key] = float(r[key]) if r.get(key) not in (None, "") else None
    return rows


def constants(
    model: str, source: str | Path, density: float = 0.01, root: Path = CALIBRATION_DIR
) -> dict[str, Any]:
    """Every quantity of ``model`` (s per step, element, pair, flop or call; ``select_s``
    per selector).  The latest row of each wins; the per-density ones at the measured
    density nearest ``density``."""
    rows = [r for r in load(source, root) if r["model"] == model]
    if not rows:
        raise KeyError(f"no calibration rows for model {model!r} in {source}")
    dens = {r["density"] for r in rows if r["density"] is not None}
    near = min(dens, key=lambda d: abs(d - density)) if dens else None
    out: dict[str, Any] = {"select_s": {}, "density": near, "numel": 0}
    for r in rows:
        if r["density"] is not None and r["density"] != near:
            continue
        q, v = r["quantity"], r["value"]
        if q.startswith(SELECT):
            out["select_s"][q[len(SELECT) : -1]] = v
        elif q == "fwd_bwd_s":
            out.update(compute_s=v, batch=int(r["batch"]), precision=r.get("precision", ""),
                       numel=int(r["n"] or 0))  # fmt: skip
        else:
            out[q] = v
    return out


def costs(
    device: str | Path = "cpu", model: str | None = None, density: float = 0.01,
    root: Path = CALIBRATION_DIR,
) -> Costs:  # fmt: skip
    """The :class:`Costs` measured on ``device``: ``model``'s rows, or (None) the median over
    its models.  A selector's cost includes the error-feedback addition; DeMo's transform
    (:data:`DCT`) is less the three elementwise passes its price charges beside.  KeyError
    names a quantity not measured."""
    rows = load(device, root)
    models = [model] if model else sorted({r["model"] for r in rows} - {LOOPBACK})
    per = [constants(m, device, density, root) for m in models]

    def med(q: str) -> float:
        got = [c[q] for c in per if c.get(q) is not None]
        if not got:
            raise KeyError(f"no {q} measured on {device} ({', '.join(models)}): rerun "
                           "python -m bench.gpucheck.calibrate there")  # fmt: skip
        return statistics.median(got)

    reduce, dense = med("reduce_s"), med("dense_s")
    sel = {s: statistics.median(c["select_s"][s] for c in per if s in c["select_s"]) + reduce
           for s in {s for c in per for s in c["select_s"]}}  # fmt: skip
    # a selection that names no selector: the median one
    select = statistics.median(sel.values()) if sel else 0.0
    dct = [c["dct_s"] / c["numel"] - 3 * dense for c in per if c.get("dct_s") and c["numel"]]
    if dct:
        sel[DCT] = max(0.0, statistics.median(dct))
    return Costs(
        select_s=select, scatter_s=med("scatter_s"),
        dense_s=dense, reduce_s=reduce, matmul_s=med("matmul_s"),
        matmul_call_s=med("matmul_call_s"), qr_s=med("qr_s"), qr_call_s=med("qr_call_s"),
        selectors=sel,
    )  # fmt: skip


def loopback(device: str | Path = "cpu", root: Path = CALIBRATION_DIR) -> tuple[float, float]:
    """(s per message step, bytes/s) between two workers of one emulated node on ``device``."""
    c = constants(LOOPBACK, device, root=root)
    return c["loopback_lat_s"], 1.0 / c["loopback_s"]
