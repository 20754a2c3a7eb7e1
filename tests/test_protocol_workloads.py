"""A workload's own search space: the Transformer's sparse trials reach density 0.05 (it
barely learns at 0.01), with the same number of trials as every other tunable method."""

from __future__ import annotations

from pathlib import Path

from bench.sweeps import protocol as pr


def test_the_translation_workload_tunes_density_005_with_an_equal_budget(tmp_path: Path) -> None:
    image = pr.Plan(sweep_id="s", results_dir=str(tmp_path), cluster="local")
    text = pr.Plan(
        sweep_id="s",
        results_dir=str(tmp_path),
        cluster="local",
        experiment=pr.WORKLOADS["translation"],
    )
    for comm in ("topk", "mstopk", "hitopk"):
        img, tr = dict(image._space(comm)), dict(text._space(comm))
        assert sorted(img) == ["d0.001", "d0.001-warmup", "d0.01", "d0.01-warmup"]
        assert sorted(tr) == ["d0.01", "d0.01-warmup", "d0.05", "d0.05-warmup"]
        assert tr["d0.05-warmup"]["density_schedule"] == [0.1, 0.05]  # down to the final
        assert img["d0.01-warmup"]["density_schedule"] == [0.1, 0.05, 0.03, 0.01]
    text.check()  # every tunable method still has the same number of trials
    sizes = {len(text._space(c)) for c in pr.COMMS if len(pr.space(c)) > 1}
    assert sizes == {4}
    jobs = text.tune_jobs()
    assert any(j.trial == "d0.05-warmup" for j in jobs)
    assert "comm.density=0.05" in text.overrides(next(j for j in jobs if j.trial == "d0.05"))
