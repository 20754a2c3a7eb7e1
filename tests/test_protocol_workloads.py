"""A workload's own search space: the Transformer's sparse trials reach density 0.05 (it
barely learns at 0.01 with the gradient placement), with the same number of trials as every
other method, every labelled density sent on the step axis well before dense's steps to
target."""

from __future__ import annotations

from pathlib import Path

from bench import methods
from bench.sweeps import protocol as pr
from bench.sweeps import trials as T


def test_the_translation_workload_tunes_density_005_with_an_equal_budget(tmp_path: Path) -> None:
    kw = {"sweep_id": "s", "results_dir": str(tmp_path), "cluster": "local"}
    image = pr.Plan(**kw, recipe_lr=0.4)
    text = pr.Plan(**kw, experiment=pr.WORKLOADS["translation"], recipe_lr=2e-3)
    for comm in ("topk", "mstopk", "hitopk"):
        spec, ref = methods.get(comm), pr.REF_STEPS["translation"]
        img = {
            o[0] for o in spec.space("classification", pr.REF_STEPS["classification"])["schedule"]
        }
        assert img == {"d0.01", "d0.01-warmup15", "d0.001", "d0.001-warmup15"}
        # translation (AdamW): density {0.05, 0.01} x placement {grad, update}, each after
        # the same dense warm-up on the step axis (update freezes Adam's variance there)
        tr = spec.space("translation", ref)
        dens, place = dict(tr["density"]), dict(tr["placement"])
        assert sorted(dens) == ["d0.01", "d0.05"] and sorted(place) == ["grad", "update"]
        warm = {v["comm.warmup_steps"] for v in place.values()}
        assert len(warm) == 1 and 0 < warm.pop() < ref
        # the earlier rules' failure: 0.01 reached after the warm-up, well before dense's
        # 240, not never
        sent = T.sends(comm, {**dens["d0.01"], **place["update"]}, ref)
        first = [m for m, k in sent].index(comm)
        assert 0 < first < ref // 2 and sent[first][1].density == 0.01
    text.check()  # every method the same number of distinct trials
    image.check()
    assert {len(text._space(c)) for c in text.comms} == {T.TRIALS}
    jobs = text.tune_jobs()
    assert {j.comm for j in jobs} == set(text.comms) >= {"dense", "fp16"}  # tuned too
    over = text.overrides(jobs[0])
    assert any(o.startswith("optim.lr=") for o in over) and "train.checkpoint_every=0" in over
