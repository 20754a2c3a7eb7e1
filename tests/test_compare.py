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
