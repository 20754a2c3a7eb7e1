"""The tie rule (bench.sweeps.intervals.leaders): "first" only where every other method's
speedup interval against the fastest excludes 1 under the seed interval and, projected, at
every corner of the model's assumptions; otherwise the tied group is named."""

import math

from bench.sweeps.intervals import leaders

FAST = [10.0, 10.5, 9.8, 10.2, 10.1]  # s to target per seed
SLOW = [14.0, 14.5, 13.8, 14.2, 14.1]  # 1.4x the fast one, a tight spread
NEAR = [10.3, 10.9, 10.0, 10.6, 10.4]  # within the fast one's seed spread


def test_a_clear_winner_is_first():
    got = leaders([{"method": "b", "times": SLOW}, {"method": "a", "times": FAST}])
    assert got.first == "a" and got.tied == ("a",) and got.text() == "first a"
    r, lo, hi, band_lo, band_hi = got.vs["b"]
    assert lo > 1.3 and hi < 1.5 and lo < r < hi
    assert math.isnan(band_lo) and math.isnan(band_hi)  # measured: no band


def test_a_seed_interval_tie_names_the_group():
    rows = [{"method": m, "times": t} for m, t in (("a", FAST), ("b", SLOW), ("c", NEAR))]
    got = leaders(rows)
    assert got.first is None and got.tied == ("a", "c")  # c's interval holds 1, b's does not
    assert got.vs["c"][1] < 1 < got.vs["c"][2] and got.vs["b"][1] > 1
    assert got.text() == "tied: a, c"
    # one seed: no interval, no evidence: a tie
    assert leaders([{"method": "a", "times": [1.0]}, {"method": "b", "times": [2.0]}]).first is None


def test_a_band_only_tie_names_the_group():
    # the seed interval excludes 1 at the central assumptions, but at one corner of the
    # model's assumptions b is as fast as a: the band holds 1
    corner = [t * 10.0 / 14.0 for t in SLOW]
    rows = [
        {"method": "a", "times": FAST, "corners": [FAST, FAST]},
        {"method": "b", "times": SLOW, "corners": [SLOW, corner]},
    ]
    got = leaders(rows)
    r, lo, hi, band_lo, band_hi = got.vs["b"]
    assert lo > 1 and band_lo < 1 < band_hi
    assert got.first is None and got.tied == ("a", "b")
    # the same with b slower at every corner: first
    rows[1]["corners"] = [SLOW, SLOW]
    assert leaders(rows).first == "a"
    assert leaders([]).tied == () and leaders([]).text() == "-"
