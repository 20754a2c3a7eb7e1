"""``compare``: the first run is the user's, each run is labelled by its role, run id,
method and hardware, and a line says how the other runs differ from the user's."""

from __future__ import annotations

import json
from pathlib import Path

from reproduce.__main__ import main
from tests.test_figures import _curve, _record


def test_compare_says_which_run_is_yours_and_how_the_other_differs(tmp_path: Path, capsys) -> None:
    mine, ref = tmp_path / "runs", tmp_path / "ref"
    a = _record("a", "hitopk", 0, 5.0, hardware="CPU Intel Xeon (2 cores), no GPU")
    b = _record("b", "dense", 0, 10.0, hardware="CPU AMD EPYC (2 cores), no GPU")
    for d, r in ((mine, a), (ref, b)):
        d.mkdir()
        (d / "runs.jsonl").write_text(json.dumps(r) + "\n")
        _curve(d / "curves" / f"{r['run_id']}.csv", r["time_to_target_s"])
    png = tmp_path / "c.png"
    main(["compare", "a", "b", "--results-dir", str(mine), "--results-dir", str(ref),
          "--out", str(png)])  # fmt: skip
    out = capsys.readouterr().out
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith(("yours", "compared"))}
    assert " a " in rows["yours"] and "hitopk" in rows["yours"] and "Intel" in rows["yours"]
    assert " b " in rows["compared"] and "dense" in rows["compared"] and "EPYC" in rows["compared"]
    assert "yours reached the target in 0.50x its time" in out and "other hardware" in out
    assert "comm.name: hitopk vs dense" in out
    assert png.is_file()


def test_compare_draws_each_method_in_its_palette_colour(tmp_path: Path, monkeypatch) -> None:
    """Each run's line takes its method's colour; two runs of one method differ by style."""
    import pandas as pd
    from matplotlib.colors import to_hex

    from bench.methods import colour
    from bench.results import plots

    drawn = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.setdefault("fig", fig))
    curve = pd.DataFrame(
        {
            plots.EPOCH: [1, 2],
            plots.TRAIN_TIME: [1.0, 2.0],
            plots.metric_column("top1"): [0.5, 0.99],
        }
    )
    plots.plot_time_to_accuracy(
        [("yours", curve), ("reference", curve), ("other", curve)],
        metric="top1", target=0.98, path=tmp_path / "x.png", title="t",
        colours=[colour("dense"), colour("dense"), colour("hitopk")],
    )  # fmt: skip
    lines = [
        ln for ln in drawn["fig"].axes[0].get_lines() if not ln.get_label().startswith("target")
    ]
    assert [to_hex(ln.get_color()) for ln in lines] == [
        colour("dense"),
        colour("dense"),
        colour("hitopk"),
    ]
    assert lines[0].get_linestyle() != lines[1].get_linestyle()
    # identical curves stay visible: the later run drawn over the first, thinner, with
    # open markers of another shape
    assert lines[1].get_zorder() > lines[0].get_zorder()
    assert lines[1].get_linewidth() < lines[0].get_linewidth()
    assert lines[1].get_marker() != lines[0].get_marker() and lines[1].get_mfc() == "white"


def test_the_differences_that_matter_come_first(tmp_path: Path, capsys) -> None:
    """Settings that change learning or timing are listed, comm and optim first; those
    that change neither (train.progress) only as bookkeeping; a busy machine is named."""
    from reproduce.compare import _differences

    a = _record("a", "dense", 0, 5.0, machine_load={"busy": True})
    b = _record("b", "dense", 0, 6.0)
    a["config"] |= {"train": {"seed": 0, "progress": True}, "optim": {"lr": 0.4}}
    b["config"] |= {"train": {"seed": 1, "progress": False}, "optim": {"lr": 0.2}}
    (line,) = _differences([a, b])
    assert "settings differ: optim.lr: 0.4 vs 0.2, train.seed: 0 vs 1" in line
    assert line.endswith("(bookkeeping only: train.progress)")
    assert "yours ran on a busy machine" in line
    b["config"] = json.loads(json.dumps(a["config"])) | {"train": {"seed": 0, "progress": False}}
    (line,) = _differences([a, b])
    assert "same training settings (bookkeeping only: train.progress)" in line
