"""``python -m reproduce advise``: ranks the methods, prints every input it used with its
source, names the hardware of each measurement, refuses bad input in one line."""

import math
import subprocess
import sys

import pandas as pd
import pytest

from bench import methods
from bench.methods import defaults
from reproduce import advise


def _run(capsys, *args: str) -> tuple[int, str, str]:
    try:
        advise.main(list(args))
        rc = 0
    except SystemExit as e:
        rc = int(e.code or 0)
    out = capsys.readouterr()
    return rc, out.out, out.err


def _table(out: str) -> dict[str, tuple[float, float]]:
    rows = {}
    for ln in out.splitlines():
        if ln.startswith(("the answer for", "per step only")):
            break  # the ranking ends; the answer's own table follows
        f = ln.split()
        if len(f) == 5 and f[0] in defaults():
            rows[f[0]] = (float(f[1]), float(f[2]))
    return rows


def _measurements(tmp_path):
    """A bench cluster CSV as a CPU run leaves it: overlap shares and a calibration."""
    (tmp_path / "bench").mkdir()
    hw = "CPU AMD EPYC (2 cores), no GPU"
    rows = [
        {"kind": "overlap", "bench_id": "b1", "method": m, "hidden": h, "hardware": hw}
        for m, h in (("dense", 0.13), ("hitopk", 0.0), ("mstopk", 0.0))
    ]
    cal = {f"model_{n}": 1.0 for n in ("select_ns_per_elem", "dense_ns_per_elem")}
    cal.update(model_scatter_ns_per_pair=50.0, model_reduce_ns_per_elem=1.5)
    rows.append({"kind": "measured", "bench_id": "b1", "hardware": hw, **cal})
    pd.DataFrame(rows).to_csv(tmp_path / "bench" / "cluster.csv", index=False)
    return hw


def test_the_paper_profile_ranks_2020s_baselines_with_every_source(capsys, tmp_path):
    hw = _measurements(tmp_path)
    rc, out, _ = _run(capsys, "--profile", "paper", "--results-dir", str(tmp_path))
    assert rc == 0
    t = _table(out)
    assert set(methods.defaults()) == set(t)  # every default method is ranked
    steps = [v[0] for v in t.values()]
    assert steps == sorted(steps) and t["fp16"][0] < t["dense"][0]
    assert "NVIDIA DeepLearningExamples" in out and "Shi et al." in out
    # the overlap assumption is what was used; the CPU measurement is named and not used
    assert "hidden = 1 for every method (band 0..1): assumed" in out
    assert f"not used: the overlap measurement of run b1 on {hw}" in out
    for why in ("bf16", "topk", "randomk"):
        assert f"not ranked: {why}: " in out


def test_given_values_are_the_ones_printed_and_used(capsys, tmp_path):
    base = ["--nodes", "2", "--workers", "2", "--inter-gbps", "0.1", "--results-dir", str(tmp_path)]
    rc, out, _ = _run(capsys, *base, "--intra-gbps", "1")
    assert rc == 0
    intra = [ln for ln in out.splitlines() if ln.startswith("intra_bw")]
    assert intra == ["intra_bw = 1 Gbit/s: given (--intra-gbps)"]
    assert "inter_bw = 0.1 Gbit/s: given (--inter-gbps)" in out
    assert "25 Gbit/s line rate" not in out
    rc, slow, _ = _run(capsys, *base, "--nic-efficiency", "0.35")
    assert "nic_efficiency = 0.35: given (--nic-efficiency)" in slow
    assert _table(slow)["dense"][0] > _table(out)["dense"][0]  # half the NIC efficiency
    rc, out, _ = _run(capsys, *base, "--compute-ms", "500", "--hidden", "0")
    assert "compute = 500 ms per step: given (--compute-ms)" in out
    assert "hidden = 0 for every method: given (--hidden)" in out


def test_model_parameters_and_compute_are_the_models_or_refused(capsys, tmp_path):
    base = ["--profile", "paper", "--results-dir", str(tmp_path)]
    rc, _, err = _run(capsys, *base, "--model", "transformer_base")
    assert rc == 2 and err.count("\n") == 1
    assert "no cited compute time for transformer_base" in err and "resnet50" in err
    rc, out, _ = _run(capsys, *base, "--model", "transformer_base", "--compute-ms", "300")
    assert rc == 0 and "25,557,032" not in out and "72.3 ms" not in out
    assert "counted from transformer_base's parameters" in out
    rc, out, _ = _run(capsys, *base, "--batch", "64", "--px", "224")
    assert "(64 images at 224 px)" in out and f"{64 / 1156 * 1e3:.1f} ms" in out
    rc, _, err = _run(capsys, *base, "--params", "1000000")
    assert rc == 2 and "give --compute-ms" in err


@pytest.mark.parametrize(
    "args",
    [
        ["--workers", "2"],
        ["--nodes", "0", "--workers", "2", "--inter-gbps", "1"],
        ["--profile", "paper", "--compute-ms", "0"],
        ["--profile", "paper", "--compute-ms", "-1"],
        ["--profile", "paper", "--inter-gbps", "-3"],
        ["--profile", "paper", "--nodes", "1000000000"],
        ["--profile", "paper", "--density", "0"],
        ["--profile", "paper", "--nic-efficiency", "1.5"],
        ["--profile", "paper", "--hidden", "2"],
        ["--profile", "paper", "--params", "0", "--compute-ms", "10"],
        ["--profile", "paper", "--results-dir", "/nonexistent/results"],
        ["--profile", "paper", "--model", "resnet50", "--params", "10"],
    ],
)
def test_bad_input_is_refused_in_one_line(capsys, args):
    rc, out, err = _run(capsys, *args)
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: advise: ")
    assert out == ""


def test_every_method_it_cannot_rank_gets_a_note(capsys, tmp_path):
    rc, out, _ = _run(
        capsys,
        "--nodes",
        "1",
        "--workers",
        "8",
        "--inter-gbps",
        "25",
        "--results-dir",
        str(tmp_path),
    )
    assert "hitopk" not in _table(out) and "not ranked: hitopk: it needs 2 or more nodes" in out
    rc, out, _ = _run(
        capsys, "--profile", "paper", "--params", "10000000", "--compute-ms", "50",
        "--results-dir", str(tmp_path),
    )  # fmt: skip
    assert "powersgd" not in _table(out) and "not ranked: powersgd: --params" in out


def test_cpu_costs_name_the_hardware_they_were_measured_on(capsys, tmp_path):
    hw = _measurements(tmp_path)
    rc, out, _ = _run(
        capsys, "--profile", "paper", "--costs", "cpu", "--results-dir", str(tmp_path)
    )
    assert rc == 0
    assert f"measured (overlap case), run b1 on {hw}" in out
    assert f"scatter_s = 5e-08 s per pair: measured, bench cluster run b1 on {hw}" in out
    assert "not ranked: fp16: no overlap measurement" in out  # not measured in that run
    rc, _, err = _run(capsys, "--profile", "paper", "--costs", "cpu", "--results-dir", "/tmp")
    assert rc == 2 and "needs a bench cluster run's calibration" in err


def test_every_flag_has_help_with_its_unit():
    for act in advise._parser()._actions:
        assert act.help, act.option_strings
    text = advise._parser().format_help()
    for unit in ("Gbit/s", "ms", "px", "count"):
        assert unit in text


def test_the_command_line_entry(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "reproduce", "advise", "--nodes", "2", "--workers", "2"]
        + ["--inter-gbps", "1", "--dry-run", "--results-dir", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0 and "step ms" not in p.stdout and "compute = " in p.stdout


def test_band_beside_each_estimate_and_runs_by_default(capsys) -> None:
    """Each ranked method's efficiency with its band (the assumptions at their ends); the
    CSVs are looked for in a user's runs/ by default, like every other command."""
    from reproduce._cli import RESULTS

    assert advise._parser().get_default("results_dir") in (None, RESULTS)
    assert "default runs/" in " ".join(advise._parser().format_help().split())
    rc, out, _ = _run(capsys, "--profile", "paper")
    assert rc == 0 and "band" in out.splitlines()[1]
    for m, (_, eff) in _table(out).items():
        row = next(ln.split() for ln in out.splitlines() if ln.split()[:1] == [m])
        lo, hi = (float(x) for x in row[3].split("-"))
        assert lo <= eff <= hi and lo < hi, row  # an assumed hidden share: a real band
    # --hidden and --nic-efficiency given: the band narrows
    rc, out2, _ = _run(capsys, "--profile", "paper", "--hidden", "0.5", "--nic-efficiency", "0.9")

    def band(text: str) -> tuple[float, ...]:  # dense's row of the ranking (the first table)
        row = next(ln.split() for ln in text.splitlines() if ln.split()[:1] == ["dense"])
        return tuple(map(float, row[3].split("-")))

    w, n = band(out), band(out2)
    assert n[1] - n[0] < w[1] - w[0]


def _answer(tmp_path, cluster="paper-b64"):
    """A v2 protocol table: hitopk has the shortest step there but needs many more steps."""
    rows = [
        ("dense", "b25-lr1x", 60, 6.0, math.nan, ""),
        ("hitopk", "d0.001-grad-lr1x", 400, 9.0, 0.66, "slower"),
        ("diloco", "H20-olr0.7-lr1x", 70, 3.0, 2.0, "faster"),
    ]
    df = pd.DataFrame(
        [
            {
                "experiment": "dawnbench_digits", "for_cluster": cluster, "ratio": 5.37,
                "comm": c, "trial": t, "n_runs": 10, "steps_to_target_mean": n,
                "time_to_target_mean_s": s, "speedup_vs_dense": x,
                "speedup_vs_dense_ci_low": x * 0.9, "speedup_vs_dense_ci_high": x * 1.1,
                "verdict_vs_dense": v,
            }
            for c, t, n, s, x, v in rows
        ]
    )  # fmt: skip
    (tmp_path / "ablation").mkdir(exist_ok=True)
    df.to_csv(tmp_path / "ablation" / "ablation-20261203-000000-aaaaaa.csv", index=False)


@pytest.mark.parametrize("profile", ["paper", "paper-224", "paper-b64", "paper-fp16"])
def test_every_profile_the_answer_names_is_advised(capsys, tmp_path, profile):
    rc, out, _ = _run(capsys, "--profile", profile, "--results-dir", str(tmp_path))
    assert rc == 0 and set(_table(out)) >= {"dense", "hitopk", "diloco", "demo"}
    assert f"per step only: no protocol sweep tuned for {profile}" in out


def test_advise_reads_the_answer_and_says_why_its_ranking_differs(capsys, tmp_path):
    _answer(tmp_path)
    rc, out, _ = _run(capsys, "--profile", "paper-b64", "--results-dir", str(tmp_path))
    assert rc == 0
    assert "the answer for this profile, dawnbench_digits" in out
    # the answer's selected density and period are what the step times use
    ranked = _table(out)
    first = min(ranked, key=lambda m: ranked[m][0])
    why = [ln for ln in out.splitlines() if ln.startswith("why the ranking differs")]
    assert first != "diloco" and why and "first to the target: diloco" in why[0]
    if first == "hitopk":
        assert "needs 400 steps to the target against dense's 60" in why[0]
