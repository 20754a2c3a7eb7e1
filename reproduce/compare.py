"""``python -m reproduce compare RUN_ID [RUN_ID ...] --out PNG [--label KEY]``

Accuracy curves of recorded runs side by side (per epoch and against training time), from
the records and curve CSVs alone, with each run's time to target as a table.  The first run
id is yours; a line per other run says how it differs from yours (time ratio, hardware, a
busy machine, the settings that differ).  Each run id is looked up in the
``--results-dir`` directories in order (by default ``runs/``, then ``results/``), so that a
user's run compares with a reference one by naming both.
"""

from __future__ import annotations

from pathlib import Path

from reproduce._cli import REFERENCE, RESULTS, Parser, fail

USAGE = """compare RUN_ID... --out PNG [--dry-run]
                          accuracy curves of recorded runs side by side"""


def main(argv: list[str]) -> None:
    from bench.methods import colour, method_of
    from bench.results import records
    from bench.results.env import REPO_ROOT
    from bench.results.plots import plot_time_to_accuracy

    ap = Parser(
        "compare",
        summary="Draws the accuracy curves of recorded runs side by side and prints their "
        "times to target; a user's runs and the reference ones compare by run id.",
        example="python -m reproduce compare <your run id> 20261130-222143-510ca9 --out cmp.png",
        details=__doc__,
    )
    ap.add_argument("run_ids", nargs="+")
    ap.add_argument(
        "--out", required=True, help="PNG to write (refuses to replace an existing file)"
    )
    ap.add_argument(
        "--results-dir",
        action="append",
        help=f"where to look for the runs, repeatable, in order (default: {RESULTS}, "
        f"then {REFERENCE})",
    )
    ap.add_argument(
        "--label",
        default="comm",
        help="record field(s) naming each run after its role and run id, comma-separated "
        "(default: its method)",
    )
    ap.add_argument("--title", default="")
    ap.add_argument("--dry-run", action="store_true", help="say what would be drawn; write nothing")
    args = ap.parse_args(argv)
    if Path(args.out).exists():
        fail(f"{args.out} exists; choose another --out")
    dirs = args.results_dir or [RESULTS, REFERENCE]
    runs, recs, roles = [], [], []
    for i, rid in enumerate(args.run_ids):
        found = [(d, r) for d in dirs if (r := records.find_record(d, rid)) is not None]
        if not found:
            where = ", ".join(str(records.runs_path(d)) for d in dirs)
            fail(f"no record {rid!r} in {where}")
        where, rec = found[0]
        if not records.curve_path(where, rid).is_file():
            why = "; ".join(str(v) for v in (rec.get("status"), rec.get("reason")) if v)
            fail(f"run {rid} has no curve to draw (it ended {why})")
        w = Path(where)  # the committed results: reference runs
        ref = w == Path(REFERENCE) or w.resolve() == (REPO_ROOT / REFERENCE).resolve()
        roles.append("yours" if i == 0 else "reference" if ref else "compared")
        runs.append((_label(roles[-1], rec, args.label), records.load_curve(where, rid)))
        recs.append(rec)
    metric, target = recs[0]["target_metric"], recs[0]["target_value"]
    if any((r["target_metric"], r["target_value"]) != (metric, target) for r in recs):
        fail("the runs have different targets")
    if args.dry_run:
        for (label, curve), r in zip(runs, recs):
            print(f"{r['run_id']}: {label.splitlines()[0]!r}, {len(curve)} epoch(s), "
                  f"{r.get('hardware', '')}")  # fmt: skip
        print(f"would draw {args.out} ({metric} >= {target}); nothing written (--dry-run)")
        return
    hw = list(dict.fromkeys(str(r.get("hardware") or "unknown hardware") for r in recs))
    title = args.title or f"{recs[0]['experiment']}: {metric} >= {100 * target:g} %"
    plot_time_to_accuracy(
        runs,
        metric=metric,
        target=target,
        path=args.out,
        title=title,
        # one machine: named under the title; several: each run's is in its legend entry
        hardware=hw[0] if len(hw) == 1 else "hardware per run in the legend",
        per_epoch=True,
        colours=[colour(method_of(r)) for r in recs],
    )
    _table(runs, recs, roles)
    for line in _differences(recs):
        print(line)
    print(f"figure: {args.out}")


def _label(role: str, rec: dict, fields: str) -> str:
    """``yours: <run id> <method>`` over its hardware (``--label``: other fields)."""
    from bench.methods import method_of

    what = (
        method_of(rec) if fields == "comm" else " ".join(str(rec.get(k)) for k in fields.split(","))
    )
    hw = str(rec.get("hardware") or "unknown hardware").replace("(R)", "").replace("(TM)", "")
    return f"{role}: {rec['run_id']} {what}\n{hw}"


def _table(runs: list, recs: list[dict], roles: list[str]) -> None:
    from bench.methods import method_of

    print(
        f"{'run':<10} {'run_id':<24} {'method':<10} {'status':<14} {'time_to_target_s':>16} "
        f"{'epochs':>6} {'train_time_s':>12}  hardware"
    )
    for role, r in zip(roles, recs):
        tt = r.get("time_to_target_s")
        print(
            f"{role:<10} {r['run_id']:<24} {method_of(r):<10} {r['status']:<14} "
            f"{tt if tt is None else round(tt, 1)!s:>16} {r.get('epochs_to_target')!s:>6} "
            f"{round(r.get('train_time_s') or 0, 1):>12}  {r.get('hardware') or 'unknown'}"
        )


def _differences(recs: list[dict]) -> list[str]:
    """How each other run differs from the user's: time to target, hardware, settings."""
    from bench.train.checkpoint import MAY_DIFFER

    mine, out = recs[0], []
    for r in recs[1:]:
        head = f"{r['run_id']} against yours ({mine['run_id']}):"
        t0, t1 = mine.get("time_to_target_s"), r.get("time_to_target_s")
        if t0 is not None and t1 is not None and t1 > 0:
            head += f" yours reached the target in {t0 / t1:.2f}x its time"
        else:
            head += " no time ratio (a run missed the target)"
        if mine.get("hardware") != r.get("hardware"):
            head += "; other hardware, so the times compare machines as well as recipes"
        busy = [
            w for w, x in (("yours", mine), ("its", r)) if (x.get("machine_load") or {}).get("busy")
        ]
        if busy:
            head += f"; {' and '.join(busy)} ran on a busy machine (timings unreliable)"
        diff = _config_diff(mine.get("config") or {}, r.get("config") or {})
        # what a resumed run may change, but its schedule and NaN check: neither learning nor timing
        cosmetic = set(MAY_DIFFER) - {"train.epochs", "train.nan_check"}
        matter = [d for d in diff if d[0] not in cosmetic]
        shown = ", ".join(f"{k}: {a} vs {b}" for k, a, b in matter[:8])
        more = f" (and {len(matter) - 8} more)" if len(matter) > 8 else ""
        head += f"; settings differ: {shown}{more}" if matter else "; same training settings"
        rest = [k for k, _, _ in diff if k in cosmetic]
        out.append(head + (f" (bookkeeping only: {', '.join(rest)})" if rest else ""))
    return out


# config groups in the order their differences are listed: learning and timing first
_ORDER = ("comm", "sync", "optim", "train", "data", "model", "cache", "cluster")
# record fields that differ from run to run whatever the recipe
_RUN_KEYS = ("results", "hydra", "resume", "experiment_dir")


def _config_diff(a: dict, b: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """(dotted key, yours, theirs) of the config settings both records have that differ."""
    out = []
    # a key one record lacks is of an older format; the groups in the order of _ORDER
    for k in sorted(set(a) & set(b), key=lambda k: (_ORDER.index(k) if k in _ORDER else 99, k)):
        if not prefix and k in _RUN_KEYS:
            continue
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _config_diff(x, y, f"{prefix}{k}.")
        elif x != y:
            out.append((f"{prefix}{k}", x, y))
    return out
