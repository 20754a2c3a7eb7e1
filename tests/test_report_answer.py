"""REPORT.md answers first and its figures can be read: on a fixture sweep of the current
protocol (5 evaluation seeds of five methods, with curves, quoted for the emulated check
cluster and the paper's cluster), ``figures`` writes a report whose first screen holds the
answer with intervals, and every figure it draws is at most 2400 px wide with a title,
labelled axes and a legend (or direct labels)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import matplotlib.figure
import pandas as pd
import pytest
from PIL import Image

from bench.results.plots import MAX_WIDTH_PX
from bench.sweeps import intervals as iv
from bench.sweeps import protocol as pr
from bench.sweeps.common import write_table
from reproduce.figures import main

SWEEP = "ablation-20990101-000000-abcdef"
OLD = "ablation-20980101-000000-abcdef"  # a sweep of an earlier protocol, of translation
HW = "CPU Test CPU (2 cores), no GPU"
# method -> (trial, seconds to target per seed); hitopk clearly sooner than dense, about
# as soon as fp16 (so: faster than dense, no difference against the best peer)
METHODS = {
    "dense": ("b25", [30.0, 31.0, 29.5, 30.5, 30.2]),
    "fp16": ("b25", [20.0, 21.0, 19.0, 22.0, 20.5]),
    "powersgd": ("rank8-start2", [24.0, 25.0, 23.0, 24.5, 26.0]),
    "hitopk": ("d0.01-grad", [19.5, 22.5, 18.5, 21.0, 21.5]),
    "mstopk": ("d0.01-warmup15-grad", [23.0, 24.0, None, 22.0, 23.5]),  # seed 2 missed
}
BUDGET = 40.0  # a miss counts at its whole run
CLUSTERS = {"emulated": math.nan, "paper": 1.34}  # the paper's cluster: half the time


def _record(run_id: str, comm: str, trial: str, seed: int, tt: float | None) -> dict:
    density = 0.01 if comm in ("hitopk", "mstopk") else 1.0
    return {
        "run_id": run_id,
        "status": "ok" if tt is not None else "target_missed",
        "experiment": "dawnbench_digits",
        "data": "digits",
        "comm": comm,
        "comm_density": density,
        "comm_warmup_epochs": 0,
        "comm_density_schedule": [0.1, 0.05, 0.03, 0.01] if density < 1 else [],
        "cache": "none",
        "update": "foreach",
        "world_size": 4,
        "nnodes": 2,
        "target_metric": "top1",
        "target_value": 0.98,
        "time_to_target_s": tt,
        "train_time_s": tt if tt is not None else BUDGET,
        "hardware": HW,
        "link_check": {"bandwidth_gbps": 0.089},
        "cluster_profile": {"profile": "paper", "target_ratio": 1.34},
        "protocol": {"name": pr.NAME, "role": "eval", "trial": trial, "selected": True},
        "config": {
            "experiment": "dawnbench_digits",
            "comm": {"name": comm, "density": density, "powersgd_rank": 8},
            "cluster": {"name": "emulated", "nnodes": 2, "nproc_per_node": 2},
            "train": {"seed": seed},
            "results": {"sweep_id": SWEEP},
        },
    }


def _curve(path: Path, tt: float | None) -> None:
    end = tt if tt is not None else BUDGET
    top1 = [0.5, 0.8, 0.93, 0.97, 0.985 if tt is not None else 0.96]
    rows = [
        {"epoch": e, "clock/train_s": end * e / 5, "acc/top1": top1[e - 1], "data/steps": 11}
        | {"time/data_s": 0.01, "time/compute_s": 0.3, "time/select_s": 0.01}
        | {"time/comm_s": 0.1, "time/update_s": 0.01}
        for e in range(1, 6)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)


def _table() -> pd.DataFrame:
    """The sweep's table as bench.sweeps.protocol_table writes it: per cluster, each
    method's time to target and its speedups over dense and over the best peer (fp16)."""
    rows = []
    for cluster, ratio in CLUSTERS.items():
        scale = 1.0 if ratio != ratio else 0.5
        times = {c: [scale * (t or BUDGET) for t in ts] for c, (_, ts) in METHODS.items()}
        for comm, (trial, raw) in METHODS.items():
            m, lo, hi = iv.mean_interval(times[comm])
            row = {"sweep_id": SWEEP, "protocol": pr.NAME, "experiment": "dawnbench_digits",
                   "for_cluster": cluster, "ratio": ratio, "comm": comm, "trial": trial,
                   "n_runs": 5, "n_reached": sum(t is not None for t in raw),
                   "time_to_target_mean_s": m, "time_to_target_ci_low_s": lo,
                   "time_to_target_ci_high_s": hi, "best_peer": "fp16", "target_metric": "top1",
                   "target_value": 0.98, "seeds": "0 1 2 3 4",
                   "run_ids": " ".join(f"{comm}-{s}" for s in range(5))}  # fmt: skip
            for ref, tag in (("dense", "dense"), ("fp16", "peer")):
                r, lo, hi = iv.log_t_interval(times[ref], times[comm])
                verdict = iv.verdict(lo, hi, 5)
                if ref == comm:
                    r = lo = hi = math.nan
                    verdict = ""
                row |= {f"speedup_vs_{tag}": r, f"speedup_vs_{tag}_ci_low": lo,
                        f"speedup_vs_{tag}_ci_high": hi, f"verdict_vs_{tag}": verdict}  # fmt: skip
            rows.append(row)
    return pd.DataFrame(rows)


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    d = tmp_path / "results"
    recs = []
    for comm, (trial, times) in METHODS.items():
        for seed, tt in enumerate(times):
            r = _record(f"{comm}-{seed}", comm, trial, seed, tt)
            recs.append(r)
            _curve(d / "curves" / f"{r['run_id']}.csv", tt)
    (d / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    plan = {"name": pr.NAME, "sweep_id": SWEEP, "tune_seeds": [1000, 1001],
            "eval_seeds": list(range(5))}  # fmt: skip
    (d / "ablation").mkdir()
    (d / "ablation" / f"{SWEEP}.plan.json").write_text(json.dumps(plan))
    write_table(_table(), d / "ablation" / f"{SWEEP}.csv")
    tuning = [{"cluster": c, "comm": m, "trial": t, "overrides": "", "n_runs": 2, "n_reached": 2,
               "median_steps": 60, "median_time_s": 20.0, "selected": True}
              for c in CLUSTERS for m, (t, _) in METHODS.items()]  # fmt: skip
    write_table(pd.DataFrame(tuning), d / "ablation" / f"{SWEEP}-tuning.csv")
    # an earlier protocol's sweep of translation: linked in the appendix, never the answer
    old = {"name": "equal-budget-v1", "sweep_id": OLD}
    (d / "ablation" / f"{OLD}.plan.json").write_text(json.dumps(old))
    pd.DataFrame({"experiment": ["transformer_protocol"], "comm": ["dense"]}).to_csv(
        d / "ablation" / f"{OLD}.csv", index=False
    )
    return d


class _Checked:
    """Every figure saved, checked before it is written."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.n = 0

    def check(self, fig: matplotlib.figure.Figure, name: str) -> None:
        self.n += 1
        axes = [a for a in fig.axes if a.axison and a.has_data()]
        titled = bool(fig._suptitle and fig._suptitle.get_text()) or any(
            a.get_title() for a in axes
        )
        if not titled:
            self.problems.append(f"{name}: no title")

        def y_named(a) -> bool:
            return bool(a.get_ylabel()) or any(t.get_text() for t in a.get_yticklabels())

        for a in axes:
            if not a.get_xlabel():
                self.problems.append(f"{name}: an x axis without a label")
            if not any(y_named(b) for b in a.get_shared_y_axes().get_siblings(a)):
                self.problems.append(f"{name}: a y axis without a label")
        legend = fig.legends or any(a.get_legend() for a in fig.axes)
        labelled = any(a.texts for a in fig.axes) or any(
            t.get_text() for a in axes for t in a.get_yticklabels()
        )
        if not (legend or labelled):
            self.problems.append(f"{name}: no legend and no direct labels")


@pytest.fixture
def checked(monkeypatch) -> _Checked:
    c = _Checked()
    real = matplotlib.figure.Figure.savefig

    def savefig(self, fname, *a, **kw):
        c.check(self, str(fname))
        return real(self, fname, *a, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    return c


def test_the_report_opens_with_the_answer(sweep: Path, checked: _Checked) -> None:
    main(["--results-dir", str(sweep)])
    text = (sweep / "REPORT.md").read_text()
    first = "\n".join(text.splitlines()[:45])
    assert "## The answer" in first and "**Setting:**" in first
    assert "5 evaluation seeds [0, 1, 2, 3, 4]" in first
    assert "89 Mbit/s" in first and HW in first
    rows = [ln for ln in first.splitlines() if ln.startswith("| **hitopk** (paper) |")]
    assert len(rows) == 1 and re.search(r"\d+\.\d+x \[\d+\.\d+, \d+\.\d+\] faster", rows[0])
    # one verdict per workload, the measured column first: hitopk and mstopk cannot be told
    # from fp16 (the first) on their clock, so the three tie for first
    (line,) = [ln for ln in first.splitlines() if ln.startswith("- **dawnbench_digits**")]
    measured, projected = line.split("; projected at 1.34: ")
    assert measured.endswith("measured: fp16, hitopk and mstopk tie for first")
    assert "tie for first" in projected or " first," in projected
    # the small table: measured before projected, the paper's methods against dense (the
    # measured cell is the long table's interval), a band beside each projected interval
    head = next(ln for ln in first.splitlines() if "**measured**" in ln)
    assert head.index("**measured**") < head.index("**projected**")
    (cells,) = [ln for ln in first.splitlines() if ln.startswith("| hitopk vs dense |")]
    assert cells.split(" | ")[1] == rows[0].split(" | ")[1].split(" faster")[0]
    assert re.search(r"\d\.\d\dx \[[\d.]+, [\d.]+\] band \[[\d.]+, [\d.]+\] \|$", cells)
    assert "| **dawnbench_digits**: first to target | tie: fp16, hitopk, mstopk |" in first
    # the paper's claims: one row each, a verdict each, evidence with its link
    from bench.report.claims import CLAIMS

    claims = text.split("## The paper's claims beside ours")[1].split("Public records")[0]
    rows = [ln for ln in claims.splitlines() if ln.startswith("| ") and "**" in ln]
    assert len(rows) == len(CLAIMS)
    verdicts = [ln.split(" | ")[1].strip("*") for ln in rows]
    allowed = ("reproduced", "not reproduced", "not testable here", "partly reproduced")
    assert all(v in allowed or v.startswith("reproduced ") for v in verdicts), verdicts
    speed = rows[0].split(" | ")[2]
    assert "measured (2 x 2): hitopk vs fp16" in speed and "projected at 1.34" in speed
    assert f"(ablation/{SWEEP}.csv)" in speed
    assert "| **not testable here** | no run of `python -m reproduce bench topk`" in claims
    assert "| **mstopk** (paper) |" in first and "`d0.01-warmup15-grad`" in first
    assert "| dense | 1 (baseline, " in first
    # the answer table has one row per method
    assert len([ln for ln in first.splitlines() if ln.startswith("| ") and ln.endswith("` |")]) == 5
    # a workload without a sweep of the current protocol says so and names the command;
    # the earlier protocol's sweep of it is linked in the appendix, not the answer
    assert "No protocol sweep of transformer_protocol" in text
    assert "ablation --workload translation" in text
    appendix = (sweep / "REPORT-appendix.md").read_text()
    assert f"`equal-budget-v1`: [ablation/{OLD}.csv](ablation/{OLD}.csv)" in appendix
    assert f"From `ablation/{SWEEP}.csv` (10 configurations). Protocol v2" in appendix
    assert "| paper | dawnbench_digits | hitopk | d0.01-grad | 5/5 | 10.3 [" in appendix
    assert f"Its tuning trials (`{SWEEP}-tuning.csv`)" in appendix
    assert "| paper | hitopk | d0.01-grad |  | 2 | 2 | 60 | 20.0 | True |" in appendix
    assert checked.n >= 3 and not checked.problems, checked.problems


def test_every_linked_image_exists_and_is_readable_in_width(sweep: Path, checked) -> None:
    main(["--results-dir", str(sweep)])
    text = (sweep / "REPORT.md").read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert any("speedup_" in x for x in links) and any("tta_" in x for x in links)
    for link in links:
        png = sweep / link
        assert png.is_file(), link
        assert Image.open(png).size[0] <= MAX_WIDTH_PX, link
    assert not checked.problems, checked.problems


def test_the_setting_gives_the_ratio_dense_measured() -> None:
    from bench.report.answer import measured_ratio_text

    recs = [
        {"comm": "dense", "step_time_s": 0.5, "comm_s_per_step": 0.3},
        {"comm": "dense", "step_time_s": 0.7, "comm_s_per_step": 0.3},
        {"comm": "hitopk", "step_time_s": 0.3, "comm_s_per_step": 0.05},
    ]
    text = measured_ratio_text(recs)
    # means over dense's runs only: 300 ms of 600 ms, 1.00 x the remaining 300 ms
    assert "dense's 2 runs" in text and "300 ms of a 600 ms step, 1.00 x" in text
    assert measured_ratio_text(recs[2:]) == ""
    assert measured_ratio_text([{"comm": "dense", "step_time_s": 0.5}]) == ""


def test_the_ratio_dense_measured_is_dense_ddp_over_the_shaped_link() -> None:
    from bench.report.answer import measured_ratio_text

    link = {"link_check": {"bandwidth_gbps": 0.07}}
    diloco = {"comm": "dense", "config": {"sync": {"name": "diloco"}}}
    recs = [
        {"comm": "dense", "step_time_s": 0.6, "comm_s_per_step": 0.4, **link},
        {"comm": "dense", "step_time_s": 0.2, "comm_s_per_step": 0.05},  # local: loopback
        {**diloco, "step_time_s": 0.2, "comm_s_per_step": 0.01, **link},
    ]
    # DiLoCo's inner DDP is dense but is not the method dense; the local run has no link
    assert "dense's 1 runs: communication 400 ms of a 600 ms step, 2.00 x" in measured_ratio_text(
        recs
    )


def test_the_speedup_figure_draws_each_cluster_against_its_own_best_peer() -> None:
    from bench.report.figures import _speedup_blocks

    nan = float("nan")
    rows = [
        ("emulated", nan, "dense", 1.0, "streaming_diloco"),
        ("emulated", nan, "streaming_diloco", 1.9, "streaming_diloco"),
        ("emulated", nan, "hitopk", 1.6, "streaming_diloco"),
        ("paper", 1.34, "dense", 1.0, "fp16"),
        ("paper", 1.34, "hitopk", 1.1, "fp16"),
        ("paper", 1.34, "fp16", 1.65, "fp16"),
    ]
    df = pd.DataFrame(
        rows, columns=["for_cluster", "ratio", "comm", "speedup_vs_dense", "best_peer"]
    )
    blocks = _speedup_blocks(df)
    assert [(h, p) for h, p, _ in blocks] == [
        ("emulated 2 x 2 (measured)", "streaming_diloco"),
        ("paper (projected, ratio 1.34)", "fp16"),
    ]
    # within a cluster, by speedup over dense
    assert list(blocks[1][2]["comm"]) == ["fp16", "hitopk", "dense"]


def test_without_a_protocol_sweep_the_appendix_says_how_to_run_one(tmp_path: Path) -> None:
    from bench.report.tables import is_protocol, protocol_section

    grid = tmp_path / "ablation" / "grid-sweep.csv"
    grid.parent.mkdir()
    pd.DataFrame({"comm": ["dense"]}).to_csv(grid, index=False)
    assert not is_protocol(grid)
    assert protocol_section([grid], tmp_path)[0].startswith("No protocol sweep yet")


def test_first_to_target_is_claimed_only_where_the_interval_and_the_band_exclude_1() -> None:
    """A method is first alone only where every other's interval against it, and where
    projected its band over the model's corners, lies above 1; else the tied group is
    named, in order of mean time."""
    from bench.report.versus import Column

    fast, slow = [10.0, 10.5, 9.8, 10.2, 10.1], [14.0, 14.5, 13.8, 14.2, 14.1]
    near = [10.3, 10.9, 10.0, 10.6, 10.4]
    measured = Column("emulated", math.nan, {"a": [fast], "b": [slow], "c": [near]})
    assert measured.order() == ["a", "c", "b"]
    assert measured.tied_first() == ["a", "c"]  # c's interval holds 1, b's does not
    v = measured.versus("b", "a")
    assert v.verdict == "faster" and v.low > 1 and "band" not in v.text()
    # projected: the seed interval excludes 1 at the central corner, but at another
    # corner b is as fast as a, so the band holds 1: a tie, not a first
    corner = [t * 10.0 / 14.0 for t in slow]
    proj = Column("paper", 1.34, {"a": [fast, fast], "b": [slow, corner]})
    v = proj.versus("b", "a")
    assert v.low > 1 and v.band_low < 1 and v.verdict == "tie"
    assert proj.tied_first() == ["a", "b"] and "band [" in v.text()
    assert Column("paper", 1.34, {"a": [fast, fast], "b": [slow, slow]}).tied_first() == ["a"]


def test_the_short_answer_recomputes_the_committed_tables() -> None:
    """The short answer's comparisons come from the runs each committed protocol table
    counts: against dense they give the table's own speedups and intervals where measured
    (the newest committed protocol table, read as a file whichever rules made it; a projected
    column is priced by the model as it is now: PowerSGD's compute, the Transformer's shapes)."""
    from bench.report.versus import columns
    from bench.results.records import load_records

    res = Path(__file__).resolve().parents[1] / "results"
    records = load_records(res)
    tables = sorted((res / "ablation").glob("ablation-*.csv"))
    tables = [t for t in tables if t.with_suffix(".plan.json").is_file()]
    assert tables
    for t in tables[-1:]:
        df = pd.read_csv(t)
        cols = {c.cluster: c for c in columns(res, df, records)}
        assert any(c.measured for c in cols.values()) and len(cols) == df["for_cluster"].nunique()
        for _, r in df[df["comm"] != "dense"].iterrows():
            v = cols[r["for_cluster"]].versus("dense", r["comm"])
            assert v.band_low <= v.low and v.band_high >= v.high
            if not v.measured:
                continue
            assert (v.speedup, v.low, v.high) == pytest.approx(
                (r["speedup_vs_dense"], r["speedup_vs_dense_ci_low"], r["speedup_vs_dense_ci_high"])
            )
