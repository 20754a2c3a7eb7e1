"""One palette for every figure: a method has the same colour in every figure the report
links (time to accuracy, speedups, ratios, breakdown, scaling) and in the benchmark
figures, and the baselines that are not methods (torch.topk, torch's optimizers, floors)
keep away from every method's colour."""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib
import pandas as pd
import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from bench import methods
from bench.results import plots
from bench.results.plots import MIN_DISTANCE, colour_distance
from tests.test_figures import results  # noqa: F401 - the records fixture

matplotlib.use("Agg")

METHOD_COLOURS = {s.name: s.colour for s in methods.specs()}  # every method's, from its spec

NON_METHOD = {
    "BASELINE_COLOURS": plots.BASELINE_COLOURS,
    "UPDATE_COLOURS": plots.UPDATE_COLOURS,
    "CACHE_COLOURS": plots.CACHE_COLOURS,
    "BENCH_COLOURS": plots.BENCH_COLOURS,
    "PHASE_COLOURS": plots.PHASE_COLOURS,
}


def test_methods_have_distinct_colours() -> None:
    for (a, x), (b, y) in itertools.combinations(METHOD_COLOURS.items(), 2):
        assert colour_distance(x, y) >= MIN_DISTANCE, (a, b)


@pytest.mark.parametrize("family", sorted(NON_METHOD))
def test_other_categories_keep_away_from_every_method(family: str) -> None:
    for name, colour in NON_METHOD[family].items():
        for method, mc in METHOD_COLOURS.items():
            assert colour_distance(colour, mc) >= MIN_DISTANCE, (family, name, method)


def test_topk_selectors_are_mstopk_and_the_baselines_neutral() -> None:
    for key, colour in plots.SELECTION_COLOURS.items():
        if key in ("sum", "torch.topk"):
            assert min(colour_distance(colour, m) for m in METHOD_COLOURS.values()) >= 40
        else:  # mstopk's own implementations: mstopk's colour, told apart by line style
            assert colour == methods.get("mstopk").colour, key


def _method(text: str) -> str | None:
    """The method a label names by its first word (``hitopk d0.01 (n = 5)`` -> hitopk)."""
    word = text.replace("\n", " ").split(" ")[0].split("(")[0].strip()
    return word if word in METHOD_COLOURS else None


def _handle_colour(h) -> str | None:
    for get in ("get_color", "get_facecolor"):
        if hasattr(h, get):
            c = getattr(h, get)()
            if hasattr(c, "ndim") and c.ndim == 2:  # a collection: its first face
                c = c[0] if len(c) else None
            return None if c is None else to_hex(c)
    return None


def _labelled_colours(fig) -> list[tuple[str, str]]:
    """(text, colour) of every legend entry and every coloured tick label of ``fig``."""
    out = []
    legends = [ax.get_legend() for ax in fig.axes] + list(fig.legends)
    for leg in legends:
        if leg is None:
            continue
        for text, h in zip(leg.get_texts(), leg.legend_handles, strict=True):
            c = _handle_colour(h)
            if c is not None:
                out.append((text.get_text(), c))
    for ax in fig.axes:
        for t in [*ax.get_xticklabels(), *ax.get_yticklabels()]:
            if _method(t.get_text()) and to_hex(t.get_color()) != "#000000":
                out.append((t.get_text(), to_hex(t.get_color())))
    return out


def _protocol_table() -> pd.DataFrame:
    """A protocol sweep's table: six methods, dense the baseline, powersgd the best peer."""
    rows = []
    for i, (comm, trial, sp) in enumerate(
        [
            ("dense", "default", 1.0),
            ("fp16", "default", 1.2),
            ("powersgd", "rank4", 1.5),
            ("topk", "d0.01", 1.4),
            ("mstopk", "d0.01", 1.45),
            ("hitopk", "d0.01-warmup", 1.6),
        ]
    ):
        rows.append(
            {"for_cluster": "paper", "ratio": 1.34, "comm": comm, "trial": trial, "n_runs": 5}
            | {"n_reached": 5}
            | {"time_to_target_mean_s": 20.0 / sp, "best_peer": "powersgd"}
            | {"speedup_vs_dense": sp, "speedup_vs_dense_ci_low": sp - 0.1}
            | {"speedup_vs_dense_ci_high": sp + 0.1, "verdict_vs_dense": "faster"}
            | {"speedup_vs_peer": sp / 1.5, "speedup_vs_peer_ci_low": sp / 1.5 - 0.1}
            | {"speedup_vs_peer_ci_high": sp / 1.5 + 0.1, "verdict_vs_peer": f"v{i}"}
        )
    return pd.DataFrame(rows)


def _composition() -> pd.DataFrame:
    """The ratios module's composition: speedups on a grid, fp16 then powersgd the best
    peer along it."""
    rows = []
    for r in (0.1, 0.5, 1.0, 2.0, 10.0):
        peer = "fp16" if r < 1.5 else "powersgd"
        for g in ("dense", "fp16", "powersgd", "topk", "mstopk", "hitopk"):
            for role in ("dense", "best peer"):
                sp = 1.0 + 0.1 * len(g) / (1 + r)
                rows.append(
                    {"ratio": r, "group": g, "comm": g, "vs": peer if role != "dense" else g}
                    | {"vs_role": role, "n_seeds": 5, "speedup": sp, "ci_low": sp - 0.1}
                    | {"ci_high": sp + 0.1, "band_low": sp - 0.2, "band_high": sp + 0.2}
                )
    return pd.DataFrame(rows)


def test_every_figure_gives_a_method_the_same_colour(
    results: Path,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bench.report.figures import draw, plan, plot_protocol_speedup
    from bench.report.tables import load_inputs
    from bench.sweeps import ratios

    drawn: list = []
    save = Figure.savefig

    def keep(fig, *a, **k):
        drawn.append(fig)
        return save(fig, *a, **k)

    monkeypatch.setattr(Figure, "savefig", keep)
    figs = draw(plan(load_inputs(results)))
    kinds = {f.kind for f in figs if f.drawn}
    assert {"tta", "speedup", "breakdown", "scaling", "bench"} <= kinds
    plot_protocol_speedup(_protocol_table(), tmp_path / "speedup.png", "protocol")
    ratios.plot(_composition(), tmp_path / "ratios.png", "ratios")
    pairs = [p for fig in drawn for p in _labelled_colours(fig)]
    seen = set()
    for text, colour in pairs:
        m = _method(text)
        if m is not None:
            assert colour == METHOD_COLOURS[m], (text, colour)
            seen.add(m)
        elif text.startswith(("torch", "read floor", "memory-traffic floor")):
            # a baseline that is not a method: never in a method's colour
            assert all(colour_distance(colour, c) >= 40 for c in METHOD_COLOURS.values()), text
    assert {"dense", "fp16", "powersgd", "topk", "mstopk", "hitopk"} <= seen
    # the top-k benchmark's baseline was drawn, in the neutral family
    assert any(t.startswith("torch.topk") for t, _ in pairs)
