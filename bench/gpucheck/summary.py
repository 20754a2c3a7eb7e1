"""One line of numbers per gpucheck step, from the rows it added since its :func:`snapshot`
(else its log's last line)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.gpucheck.rows import read
from bench.results.paths import bench_csv

# the steps that run a benchmark, and its name
BENCH_OF_STEP = {
    "topk": "topk",
    "update-bench": "update",
    "input": "input_gpu",
    "throughput": "throughput",
}
JSON_STEPS = ("hooks", "select", "update", "profile", "step", "calibrate")  # bench.gpucheck


def snapshot(results_dir: str) -> dict[str, int]:
    try:  # deferred: the device machine may lack pandas (the torch-only steps need none)
        import pandas as pd
    except ImportError:
        pd = None
    out: dict[str, int] = {}
    for name in BENCH_OF_STEP.values():
        p = bench_csv(results_dir, name)
        has = pd is not None and p.is_file() and p.stat().st_size
        out[name] = len(pd.read_csv(p)) if has else 0
    p = Path(results_dir) / "runs.jsonl"
    out["runs"] = len(p.read_text().splitlines()) if p.is_file() else 0
    return out


def _bench(step: str, results_dir: str, before: dict[str, int]) -> str:
    """The rows a benchmark step added: its own headline, else images/s and tokens/s."""
    import pandas as pd

    from bench.benchmarks import load_all

    name = BENCH_OF_STEP[step]
    p = bench_csv(results_dir, name)
    df = pd.read_csv(p).iloc[before.get(name, 0) :] if p.is_file() else pd.DataFrame()
    if df.empty:
        return ""
    if step in ("topk", "update-bench"):
        spec = load_all().get(name)
        return "; ".join(spec.headline(df)) if spec.headline is not None else ""
    key = next(c for c in ("case", "loader") if c in df)
    tokens = df[df["model"].fillna("resnet50") != "resnet50"] if "model" in df else df.iloc[:0]
    images = df.drop(tokens.index)
    rates = images[images["images_per_s"].notna()] if "images_per_s" in images else images.iloc[:0]
    parts = [f"{r[key]} {r['images_per_s']:.0f} img/s" for _, r in rates.iterrows()]
    parts += [
        f"{r['model']} {r['case']} {r['tokens_per_s']:.0f} tok/s" for _, r in tokens.iterrows()
    ]
    return "; ".join(parts)


def _train(results_dir: str, before: dict[str, int]) -> str:
    p = Path(results_dir) / "runs.jsonl"
    if not p.is_file():
        return ""
    lines = p.read_text().splitlines()[before.get("runs", 0) :]
    return "; ".join(
        f"run {r['run_id']} {r['status']}: best {r['target_metric']} "
        f"{(r.get('best_value') or float('nan')):.4f}, time to target "
        f"{r.get('time_to_target_s') or float('nan'):.1f} s, "
        f"{(r.get('throughput_samples_per_s') or float('nan')):.0f} samples/s"
        for r in map(json.loads, filter(str.strip, lines))
    )


def _json_line(step: str, data: dict[str, Any], rows: list[dict]) -> str:
    """One line from a torch-only step's JSON file (or the rows it kept)."""
    if step == "hooks":
        bad = data.get("failed") or [r for r in rows if r.get("why")]
        why = "; ".join(f"{b.get('layout', '')} {b['hook']}: {b['why'][0]}" for b in bad[:3])
        return f"{len(rows)} cases, {len(bad)} failed" + (f": {why}" if why else "")
    if step == "select":
        failed = "; ".join(data.get("failed", [])[:3])
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
        adds = {}  # what a profiled step adds to dense's: its largest three kernels (ops)
        for r in rows:
            if r.get("what") == "profile" and r.get("added"):
                more = ", ".join(f"{n[:30]} +{ms:.2f} ms" for n, ms, _ in r["added"][:3])
                adds[r["hook"]] = f", adds {more}"
        return "; ".join(
            f"{r['hook']} {r['step_ms']:.1f} ms ({r['x_dense_step']:.2f}x dense),"
            f" tail {r['tail_ms']:.2f} ms"
            + (f", peak {r['peak_mib']:.0f} MiB" if r.get("peak_mib") is not None else "")
            + adds.get(r["hook"], "")
            for r in rows
            if "x_dense_step" in r
        )
    if step == "calibrate":
        fb = [r for r in rows if r.get("quantity") == "fwd_bwd_s"]
        return f"{len(rows)} rows in {data.get('csv', '?')}; " + "; ".join(
            f"{r['model']} forward-backward {1e3 * r['value']:.1f} ms at {r['batch']}" for r in fb
        )
    parts = [f"{r['images']} img {r['px']} px {r['img_s']:.0f} img/s" for r in rows if "img_s" in r]
    ready = [f"{r['ready_ms']:.1f}" for r in rows if r.get("what") == "bucket"]
    return "; ".join(parts + ([f"buckets ready at {', '.join(ready)} ms"] if ready else []))


def headline(step: str, results_dir: str, before: dict[str, int], log: Path) -> str:
    """The step's result in one line; never raises (a summary must not end the check)."""
    text = ""
    try:
        if step.startswith("train"):
            text = _train(results_dir, before)
        elif step in BENCH_OF_STEP:
            text = _bench(step, results_dir, before)
        elif step in JSON_STEPS:
            data, complete = read(Path(results_dir) / "gpucheck" / f"{step}.json")
            rows = data.get("rows", [])
            if complete or rows:  # a step stopped before its end says so first
                head = "" if complete else f"stopped: {len(rows)} rows kept; "
                text = head + _json_line(step, data, rows)
    except Exception as e:  # noqa: BLE001 - report, do not stop
        text = f"(summary failed: {type(e).__name__}: {e})"
    if not text:  # the log's last line
        try:
            lines = [
                ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()
            ]
            text = lines[-1][:200] if lines else "no output"
        except OSError:
            text = "no log"
    return text.replace("|", "/")
