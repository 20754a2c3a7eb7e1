"""Benchmark headlines name what they measure and put the strongest baseline first."""

import pandas as pd

from bench.benchmarks import topk, update


def test_update_headline_is_against_torch_fused_first_and_the_loop_after():
    rows = pd.DataFrame(
        [
            {"model": "resnet50", "optimizer": "sgd", "mode": m, "median_ms": ms}
            for m, ms in (("naive", 96.0), ("foreach", 30.0), ("fused", 23.0), ("flat", 24.0))
        ]
    )
    (line,) = update.headline(rows)
    assert line.startswith("resnet50 sgd: flat 24.00 ms vs torch fused 23.00 ms (0.96x)")
    assert line.index("fused") < line.index("per-tensor loop")
    # without fused, foreach is the strongest baseline; without either, no headline
    (line,) = update.headline(rows[rows["mode"] != "fused"])
    assert "vs torch foreach 30.00 ms" in line
    assert update.headline(rows[rows["mode"].isin(["naive", "flat"])]) == []


def test_topk_headline_gives_the_papers_search_and_tiled_each_their_own_number():
    rows = pd.DataFrame(
        [
            {"method": m, "numel": 10**6, "density": 0.001, "median_ms": ms}
            for m, ms in (
                ("torch.topk", 2.0),
                ("mstopk-tiled", 0.5),
                ("mstopk-paper[triton]", 4.0),
                ("mstopk-paper[torch]", 8.0),
            )
        ]
    )
    (line,) = topk.headline(rows)
    assert line.index("the paper's threshold search") < line.index("this project's exact")
    for method, x in (("mstopk-paper[triton]", "0.50x"), ("mstopk-paper[torch]", "0.25x")):
        assert f"({method}) " in line and x in line  # every implementation, none picked
    assert "(mstopk-tiled) 0.50 ms, 4.00x" in line
