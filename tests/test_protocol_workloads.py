"""A workload's own search space: the Transformer's sparse trials reach density 0.05 (it
barely learns at 0.01), with the same number of trials as every other method, every
labelled density sent on the step axis well before dense's steps to target."""

from __future__ import annotations

from pathlib import Path

from bench.sweeps import protocol as pr
from bench.sweeps import trials as T


def test_the_translation_workload_tunes_density_005_with_an_equal_budget(tmp_path: Path) -> None:
    kw = {"sweep_id": "s", "results_dir": str(tmp_path), "cluster": "local"}
    image = pr.Plan(**kw, recipe_lr=0.4)
    text = pr.Plan(**kw, experiment=pr.WORKLOADS["translation"], recipe_lr=2e-3)
    for comm in ("topk", "mstopk", "hitopk"):
        img = {o[0] for o in pr.knobs(comm, "classification")["schedule"]}
        tr = dict(pr.knobs(comm, "translation")["schedule"])
        assert img == {"d0.01", "d0.01-warmup15", "d0.001", "d0.001-warmup15"}
        assert sorted(tr) == ["d0.01", "d0.01-warmup60", "d0.05", "d0.05-warmup60"]
        warm = tr["d0.05-warmup60"]
        assert warm["comm.density_schedule"] == [0.1, 0.05] and warm["comm.schedule_steps"] == 60
        # the v1 failure: 0.01 reached at step 60 of dense's 240, not never
        sent = T.schedule(tr["d0.01-warmup60"], comm, pr.REF_STEPS["translation"])[0]
        assert sent.index(0.01) == 60
    text.check()  # every method the same number of distinct trials
    image.check()
    assert {len(text._space(c)) for c in pr.COMMS} == {T.TRIALS}
    jobs = text.tune_jobs()
    assert {j.comm for j in jobs} == set(pr.COMMS)  # dense and fp16 are tuned too
    over = text.overrides(jobs[0])
    assert any(o.startswith("optim.lr=") for o in over) and "train.checkpoint_every=0" in over
