"""The link check measures a link again, after a pause, before it calls it slow: the best
attempt counts, and a link off on every attempt is still refused (no root: the transfers
are stand-ins)."""

from __future__ import annotations

from types import SimpleNamespace

from bench.cluster import linkcheck


def _link(monkeypatch, ratios: list[float]) -> tuple[dict, list[float]]:
    rate = 72e6
    small, _ = linkcheck.small_message(rate)
    got = iter(ratios)
    slept: list[float] = []

    def run_pair(cluster, server, client, host, port, args):
        r = next(got)
        return {"bps": r * rate, "small_s": small * 8 / rate, "small_bytes": small,
                "rtt_s": 1e-4, "bytes": 1, "seconds": 1.0}  # fmt: skip

    monkeypatch.setattr(linkcheck, "_run_pair", run_pair)
    monkeypatch.setattr(linkcheck.time, "sleep", slept.append)
    cluster = SimpleNamespace(bandwidth_bps=rate, addr=lambda i: f"10.0.0.{i}")
    return linkcheck.measure_link(cluster, 0, 1, 1 << 20, 1, 0.25, attempts=4), slept


def test_a_slow_moment_is_measured_again_after_a_growing_pause(monkeypatch) -> None:
    m, slept = _link(monkeypatch, [0.72, 0.71, 0.95, 0.5])
    assert m["attempts"] == 3 and m["bandwidth_ratio"] == 0.95  # stops once near nominal
    assert slept == [linkcheck.PAUSE_S, 2 * linkcheck.PAUSE_S]


def test_a_link_slow_on_every_attempt_stays_slow(monkeypatch) -> None:
    m, slept = _link(monkeypatch, [0.6, 0.62, 0.61, 0.6])
    assert m["attempts"] == 2 and m["bandwidth_ratio"] == 0.62  # the best of all four
    assert len(slept) == 3 and linkcheck._score(m, 72e6, 0.25) > 0.25
