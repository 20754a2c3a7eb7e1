"""One line of numbers per gpucheck step, read from what the step itself recorded.

:func:`snapshot` notes how many rows each results CSV and ``runs.jsonl`` held before a step;
:func:`headline` reads the rows the step added and condenses them.  A step that recorded
nothing gets the last line of its log instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.gpucheck.rows import read
from bench.results.paths import bench_csv

if TYPE_CHECKING:
    import pandas as pd

BENCH_OF_STEP = {
    "topk": "topk",
    "update-bench": "update",
    "input": "input_gpu",
    "throughput": "throughput",
}


def _runs(results_dir: str) -> Path:
    return Path(results_dir) / "runs.jsonl"


def snapshot(results_dir: str) -> dict[str, int]:
    """Rows per benchmark CSV and lines of runs.jsonl, right now."""
    try:  # deferred: the device machine may lack pandas (the torch-only steps need none)
        import pandas as pd
    except ImportError:
        pd = None
    out: dict[str, int] = {}
    for name in BENCH_OF_STEP.values():
        p = bench_csv(results_dir, name)
        has = pd is not None and p.is_file() and p.stat().st_size
        out[name] = len(pd.read_csv(p)) if has else 0
    p = _runs(results_dir)
    out["runs"] = len(p.read_text().splitlines()) if p.is_file() else 0
    return out


def _new_rows(results_dir: str, name: str, before: dict[str, int]) -> pd.DataFrame:
    import pandas as pd

    p = bench_csv(results_dir, name)
    if not p.is_file():
        return pd.DataFrame()
    return pd.read_csv(p).iloc[before.get(name, 0) :]


def _last_line(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1][:200] if lines else "no output"


def _spec_headline(name: str, df: pd.DataFrame) -> str:
    """The benchmark's own headline of the rows this step added: one definition of what
    a top-k or update result says (strongest baseline of the same run first)."""
    from bench.benchmarks import load_all

    spec = load_all().get(name)
    return "; ".join(spec.headline(df)) if spec.headline is not None else ""


def _images(df: pd.DataFrame, key: str) -> str:
    import pandas as pd

    col = "images_per_s"
    return "; ".join(
        f"{r[key]} {r[col]:.0f} img/s" for _, r in df.iterrows() if pd.notna(r.get(col))
    )


def _throughput(df: pd.DataFrame) -> str:
    """ResNet-50 images/s, then the Transformer's tokens/s, per case."""
    import pandas as pd

    model = df["model"].fillna("resnet50") if "model" in df else pd.Series("resnet50", df.index)
    parts = [_images(df[model == "resnet50"], "case")]
    parts += [
        f"{r['model']} {r['case']} {r['tokens_per_s']:.0f} tok/s"
        for _, r in df[model != "resnet50"].iterrows()
    ]
    return "; ".join(p for p in parts if p)


def _train(results_dir: str, before: dict[str, int]) -> str:
    p = _runs(results_dir)
    if not p.is_file():
        return ""
    recs: list[dict[str, Any]] = [
        json.loads(ln) for ln in p.read_text().splitlines()[before.get("runs", 0) :] if ln.strip()
    ]
    return "; ".join(
        f"run {r['run_id']} {r['status']}: best {r['target_metric']} "
        f"{(r.get('best_value') or float('nan')):.4f}, time to target "
        f"{r.get('time_to_target_s') or float('nan'):.1f} s, "
        f"{(r.get('throughput_samples_per_s') or float('nan')):.0f} samples/s"
        for r in recs
    )


JSON_STEPS = ("hooks", "select", "update", "profile", "step", "calibrate")  # bench.gpucheck


def _from_json(step: str, path: Path) -> str:
    """One line from a torch-only step's JSON file, or from the rows it appended before it
    was stopped (then said first)."""
    data, complete = read(path)
    rows = data.get("rows", [])
    if not complete and not rows:
        return ""
    head = "" if complete else f"stopped: {len(rows)} rows kept; "
    return head + _json_line(step, data, rows)


def _json_line(step: str, data: dict[str, Any], rows: list[dict]) -> str:
    if step == "hooks":
        bad = data.get("failed") or [r for r in rows if r.get("why")]
        why = "; ".join(f"{b.get('layout', '')} {b['hook']}: {b['why'][0]}" for b in bad[:3])
        return f"{len(rows)} cases, {len(bad)} failed" + (f": {why}" if why else "")
    failed = "; ".join(data.get("failed", [])[:3])
    if step == "select":
        done = "; ".join(data.get("targets", [])) or f"{len(rows)} rows"
        return done + (f"; FAILED: {failed}" if failed else "")
    if step == "update":
        return "; ".join(
            f"{r['model']} {r['optimizer']} {r['mode']} {r.get('grads', 'own')} {r['ms']:.2f} ms"
            f" ({r['x_floor']:.1f}x floor, {r['kernels']} kernels)"
            for r in rows
            if "model" in r
        )
    if step == "step":
        prof = {r["hook"]: r for r in rows if r.get("what") == "profile"}
        return "; ".join(
            f"{r['hook']} {r['step_ms']:.1f} ms ({r['x_dense_step']:.2f}x dense),"
            f" tail {r['tail_ms']:.2f} ms"
            + (f", peak {r['peak_mib']:.0f} MiB" if r.get("peak_mib") is not None else "")
            + _adds(prof.get(r["hook"], {}))
            for r in rows
            if "x_dense_step" in r
        )
    if step == "calibrate":
        fb = [r for r in rows if r.get("quantity") == "fwd_bwd_s"]
        return f"{len(rows)} rows in {data.get('csv', '?')}; " + "; ".join(
            f"{r['model']} forward-backward {1e3 * r['value']:.1f} ms at {r['batch']}" for r in fb
        )
    compute = [r for r in rows if r.get("what") == "compute"]
    buckets = [r for r in rows if r.get("what") == "bucket"]
    parts = [f"{r['images']} img {r['px']} px {r['img_s']:.0f} img/s" for r in compute]
    if buckets:
        parts.append(
            "buckets ready at " + ", ".join(f"{r['ready_ms']:.1f}" for r in buckets) + " ms"
        )
    return "; ".join(parts)


def _adds(prof: dict[str, Any]) -> str:
    """What a profiled step adds to dense's, its largest three kernels (ops)."""
    more = prof.get("added") or []
    return (
        (", adds " + ", ".join(f"{n[:30]} +{ms:.2f} ms" for n, ms, _ in more[:3])) if more else ""
    )


def headline(step: str, results_dir: str, before: dict[str, int], log: Path) -> str:
    """The step's result in one line (never raises: a summary must not end the check)."""
    try:
        if step.startswith("train"):
            text = _train(results_dir, before)
        elif step in BENCH_OF_STEP:
            df = _new_rows(results_dir, BENCH_OF_STEP[step], before)
            if df.empty:
                text = ""
            elif step in ("topk", "update-bench"):
                text = _spec_headline(BENCH_OF_STEP[step], df)
            elif step == "throughput":
                text = _throughput(df)
            else:
                text = _images(df, next(c for c in ("case", "loader") if c in df))
        elif step in JSON_STEPS:
            text = _from_json(step, Path(results_dir) / "gpucheck" / f"{step}.json")
        else:
            text = ""
    except Exception as e:  # noqa: BLE001 - report, do not stop
        text = f"(summary failed: {type(e).__name__}: {e})"
    return (text or _last_line(log)).replace("|", "/")
