"""Tests for dpspark.report (report.png from released values). No Spark.

``make_info`` builds what the runner passes: wall times (NON-PRIVATE operational metadata, they grow
with n) only together with the other non-private diagnostics; the ledger view of a run charged to a
ledger, whose cap is the ledger's; the runner's NOT PRIVATE note for a fixed-seed run.
"""

import html
import re
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.patches import Circle, Rectangle
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from dpspark.report import NON_PRIVATE_LABEL, build_figure, build_html, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SEED_NOTE = "NOT PRIVATE: fixed seed (testing aid)"  # summary["privacy_note"] of a seeded run
TIMINGS = {"read input table (schema and version)": 1.5, "dplloyd: fit": 4.25, "write centers table": 0.5}


def make_info(d=2, k=4, *, ledger=True, diagnostics=False, seed_note=None, weights=None, rng_seed=0):
    rng = np.random.default_rng(rng_seed)
    centers = rng.uniform(-1, 1, size=(k, d))
    noisy = rng.normal(100.0, 30.0, size=k) if weights is None else np.asarray(weights, dtype=float)
    info = {
        "run_id": "run-0001",
        "algorithm": "dplloyd",
        "objective": "kmeans",
        "k": k,
        "epsilon_spent": 1.0,
        "delta_spent": 0.0,
        "epsilon_configured": 1.0,
        "delta_configured": 1e-6,
        "centers": centers.tolist(),
        "noisy_weights": noisy.tolist(),
        "feature_names": [f"feat_{i}" for i in range(d)],
        "charges": [{"step": f"iteration {i + 1}", "epsilon": 1.0 / 12, "delta": 0.0, "rule": "laplace"}
                    for i in range(12)],
        "ledger": ({"input_key": "delta-table:0f1e", "guarantee": "central", "spent_epsilon": 3.0, "spent_delta": 2e-6,
                    "budget_epsilon": 10.0, "budget_delta": 1e-5, "ledger_cap_epsilon": 10.0, "ledger_cap_delta": 1e-5,
                    "remaining_epsilon": 7.0, "remaining_delta": 8e-6}
                   if ledger else None),
        "parameters": {"variant": "allocation_nk", "iterations": 12, "noise": "paper"},
        "timings": dict(TIMINGS) if diagnostics else {},  # the runner passes wall times only with diagnostics
        "seed_note": seed_note,
        "diagnostics": None,
    }
    if diagnostics:
        info["diagnostics"] = {"true_cost": 42.5, "data_sample": rng.normal(size=(500, d))}
    return info


def figure_texts(fig):
    """Every string drawn on the figure (titles, labels, tick labels, annotations)."""
    return [t.get_text() for t in fig.findobj(Text)]


def drawn_points(fig):
    """Total number of scatter points in the figure's axes (legend handles excluded)."""
    return sum(len(c.get_offsets()) for ax in fig.axes for c in ax.collections if isinstance(c, PathCollection))


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert 20_000 < len(data) < 3_000_000  # a real multi-panel figure, not an empty image


@pytest.mark.parametrize("d", [1, 2, 10])
@pytest.mark.parametrize("ledger", [True, False])
def test_writes_valid_png(tmp_path, d, ledger):
    path = tmp_path / "out" / "report.png"  # parent directory is created
    write_report(path, make_info(d=d, ledger=ledger))
    assert_png(path)


def test_with_diagnostics_draws_sample_and_says_non_private(tmp_path):
    info = make_info(d=10, k=5, diagnostics=True)
    fig = build_figure(info)
    joined = "\n".join(figure_texts(fig))
    assert NON_PRIVATE_LABEL == "NON-PRIVATE DIAGNOSTICS"
    assert NON_PRIVATE_LABEL in joined
    assert "true_cost" in joined and "dplloyd: fit" in joined  # wall times beside the other diagnostics
    assert drawn_points(fig) == 5 + 500  # centers plus the (non-private) data sample
    red = [t for t in fig.findobj(Text) if NON_PRIVATE_LABEL in t.get_text() and t.get_color() in ("red", "white")]
    assert red
    write_report(tmp_path / "r.png", info)
    assert_png(tmp_path / "r.png")


def test_without_diagnostics_only_released_values_are_drawn():
    info = make_info(d=2, k=4)
    assert info["diagnostics"] is None
    fig = build_figure(info)
    joined = "\n".join(figure_texts(fig))
    assert "NON-PRIVATE" not in joined
    assert "true_cost" not in joined
    assert not any(step in joined for step in TIMINGS) and "Timings" not in joined  # no wall times
    assert drawn_points(fig) == 4  # exactly the k released centers, nothing else
    # Key released values are shown.
    assert "run-0001" in joined and "k = 4" in joined
    assert "remaining 7" in joined  # ledger: 10 - 3


def test_no_ledger_says_so():
    joined = "\n".join(figure_texts(build_figure(make_info(ledger=False))))
    assert "no ledger configured" in joined


def test_ledger_without_budget_cap():
    # A run is refused when its input has no cap in the ledger; the report still reads an older summary.
    info = make_info()
    info["ledger"] = {"spent_epsilon": 2.0, "spent_delta": 0.0, "budget_epsilon": None, "budget_delta": None}
    joined = "\n".join(figure_texts(build_figure(info)))
    assert "no budget cap" in joined


def test_high_dimension_is_projected_on_principal_components_of_centers():
    joined = "\n".join(figure_texts(build_figure(make_info(d=10, k=6))))
    assert "PC1 of released centers" in joined and "PC2 of released centers" in joined
    assert "not of the data" in joined


def test_projection_uses_centers_not_data():
    # Same centers, different (diagnostic) data samples: the centers land at the same place.
    a = make_info(d=5, k=6, diagnostics=True, rng_seed=3)
    b = make_info(d=5, k=6, diagnostics=True, rng_seed=3)
    b["diagnostics"]["data_sample"] = np.random.default_rng(99).normal(size=(500, 5)) * 50

    def center_offsets(info):
        fig = build_figure(info)
        colls = [c for c in fig.axes[0].collections if len(c.get_offsets()) == 6]
        return np.asarray(colls[0].get_offsets())

    assert np.allclose(center_offsets(a), center_offsets(b))


@pytest.mark.parametrize("note", [SEED_NOTE, "fixed seed: a testing aid, NOT private", "fixed seed 7"])
def test_seed_note_is_red(note):
    fig = build_figure(make_info(seed_note=note))
    notes = [t for t in fig.findobj(Text) if "not private" in t.get_text().lower()]
    assert len(notes) == 1 and notes[0].get_color() == "red"
    assert notes[0].get_text().lower().count("not private") == 1  # said once, also when the note says it already
    fig = build_figure(make_info(seed_note=None))
    assert not any("not private" in t.lower() for t in figure_texts(fig))


@pytest.mark.parametrize(
    "weights, d, labels",
    [([0.0], 2, ["0"]), ([0.0, 0.0, 0.0], 3, ["0", "0", "0"]), ([-12.5, 40.0, -0.5], 2, ["-12.5", "40", "-0.5"]),
     ([-3.0], 1, ["-3"]), ([5.0], 10, ["5"])],
)
def test_edge_cases_k1_zero_and_negative_weights(tmp_path, weights, d, labels):
    info = make_info(d=d, k=len(weights), weights=weights)
    fig = build_figure(info)
    joined = "\n".join(figure_texts(fig))
    for j, label in enumerate(labels):
        assert f"#{j}: {label}" in joined  # a negative weight keeps its sign
    write_report(tmp_path / "r.png", info)
    assert_png(tmp_path / "r.png")


def test_no_charges_and_empty_parameters(tmp_path):
    info = make_info()
    info.update(charges=[], parameters={}, timings={})
    joined = "\n".join(figure_texts(build_figure(info)))
    assert "no charges recorded" in joined
    write_report(tmp_path / "r.png", info)
    assert_png(tmp_path / "r.png")


def test_mismatched_weights_are_rejected():
    info = make_info(k=3)
    info["noisy_weights"] = [1.0, 2.0]
    with pytest.raises(ValueError, match="noisy_weights has 2 values but centers has 3 rows"):
        build_figure(info)


def test_large_report_renders(tmp_path):
    # (formerly a wall-time bound: no timing assertions in tests, the machine may be shared)
    write_report(tmp_path / "r.png", make_info(d=10, k=30, diagnostics=True))
    assert_png(tmp_path / "r.png")


def test_no_pyplot_state_leaks(tmp_path):
    import sys

    write_report(tmp_path / "r.png", make_info())
    if "matplotlib.pyplot" in sys.modules:  # another test may have imported it
        import matplotlib.pyplot as plt

        assert plt.get_fignums() == []


def test_many_charges_are_grouped_with_exact_totals():
    from dpspark.report import _group_charges

    charges = [{"step": f"iteration {t}/12 {part}", "epsilon": 1 / 48, "delta": 0.0, "rule": "discrete Laplace"}
               for t in range(1, 13) for part in ("counts", "sums")]
    grouped = _group_charges(charges)
    assert len(grouped) == 12 and grouped[0]["step"] == "iteration 1/12"
    assert sum(g["epsilon"] for g in grouped) == pytest.approx(0.5, abs=1e-12)
    assert _group_charges(charges[:5]) == charges[:5]


def test_html_page_lists_every_released_value_and_escapes_names():
    info = make_info(d=3, k=5, seed_note=SEED_NOTE)
    info["feature_names"] = ["<script>alert(1)</script>", "b", "c"]
    page = build_html(info, png=PNG_MAGIC + b"rest")
    assert "<script>alert" not in page and "&lt;script&gt;" in page
    assert "data:image/png;base64,iVBORw0KGgpyZXN0" in page  # the PNG bytes, inlined
    from dpspark.report import _fmt_weight

    for w in info["noisy_weights"]:
        assert f"<td>{_fmt_weight(w)}</td></tr>" in page  # last cell of each center row
    assert page.count("iteration ") == 12  # every charge, none grouped away
    assert SEED_NOTE in page and "remaining" in page
    assert NON_PRIVATE_LABEL not in page
    assert not any(step in page for step in TIMINGS)  # no wall times without diagnostics


def test_html_page_marks_diagnostics_and_omits_the_data_sample():
    page = build_html(make_info(diagnostics=True))
    assert page.count(NON_PRIVATE_LABEL) == 2 and "true_cost" in page and "data_sample" not in page
    assert all(step in page for step in TIMINGS)
    assert "no ledger configured" in build_html(make_info(ledger=False))


# --------------------------------------------------------------------------
# Read at a glance: nothing clipped, nothing overprinted (issue 16, item 3)
# --------------------------------------------------------------------------

LONG_STEPS = [
    "maxcover: coverage loop (Lemma 4.1, 9 thresholds x 12 picks)",
    "maxcover: candidate snap counts (geometric mechanism via snapping, scale 1/5)",
    "dplloyd: iteration 1/12 noisy counts and coordinate sums (discrete Laplace, split 1/2)",
]
LONG_RULE = "basic composition; geometric mechanism via the snapping mechanism of Mironov, sensitivity 1"
DEGENERATE = {"distinct_centers": 1, "k": 4, "top_weight_share": 0.997,
              "message": "The released centers collapsed: only 1 distinct center among the 4 released for k = 4; "
                         "99.7% of the positive noisy weight is on one center.",
              "likely_cause": "too few users for the local model at this epsilon: the LDP paper's error grows like "
                              "sqrt(n)/epsilon; about 24 times more users would help (rough estimate) <b>"}


def hard_info(k, d, *, charges=12, identical=False, diagnostics=False, seed_note=None, domain=True, degenerate=None,
              ledger=True):
    """A run with long labels everywhere: long run id, input path and filter, feature names, step labels and
    rules, parameters."""
    rng = np.random.default_rng(k * 100 + d)
    centers = rng.uniform(0.0, 1000.0, size=(k, d))
    weights = rng.normal(300.0, 150.0, size=k)
    if identical:  # ldp-like: all centers at one point (jitter far below the domain's width), all weight on one
        centers[:] = centers[0] + rng.normal(0.0, 1e-5, size=(k, d)) * (np.arange(k)[:, None] > 0)
        weights = np.array([12493.0] + list(rng.normal(0.0, 30.0, size=k - 1)))
    info = make_info(d=d, k=k, ledger=ledger, diagnostics=diagnostics, seed_note=seed_note)
    info.update(
        run_id="2024-06-01T12:00:00Z-a-very-long-run-identifier-of-the-nightly-pipeline-0123456789abcdef",
        algorithm="maxcover", centers=centers.tolist(), noisy_weights=weights.tolist(),
        feature_names=[f"customer_table_feature_with_a_really_long_descriptive_name_{i}" for i in range(d)],
        charges=[{"step": LONG_STEPS[i % 3] + f" [{i}]", "epsilon": 0.02 * (i + 1), "delta": 1e-7 * (i % 2),
                  "rule": LONG_RULE} for i in range(charges)],
        parameters={"variant": "allocation_nk", "candidates": "grid", "a_long_parameter_value": "v" * 150,
                    **{f"param_{i}": i / 7 for i in range(14)}},
        domain={"lower": [0.0] * d, "upper": [1000.0] * d} if domain else None,
        degenerate=degenerate,
        input={"path": LONG_PATH, "version": 12345, "where": LONG_WHERE, "format": "delta"},  # one shortened line
    )
    if diagnostics:
        info["diagnostics"]["data_sample"] = rng.uniform(0.0, 1000.0, size=(500, d))
        info["diagnostics"]["label"] = "NON-PRIVATE diagnostics computed from the private data"
    return info


def drawn_text_extents(fig, monkeypatch):
    """(text, window extent) of every non-empty text artist actually drawn by ``fig.canvas.draw()``.

    Text.draw is wrapped for the duration of the draw, so tick labels outside the view, removed
    labels and invisible texts (which are not drawn) are left out, and everything that is drawn
    (titles, tick and axis labels, offset texts, annotations, legend entries) is in.
    """
    drawn = []
    original, original_extent = Text.draw, Text.get_window_extent

    def recording_draw(self, renderer):
        original(self, renderer)
        if self.get_visible() and self.get_text().strip():  # the text's own extent (an annotation's
            drawn.append((self.get_text(), original_extent(self, renderer)))  # arrow is not text)

    monkeypatch.setattr(Text, "draw", recording_draw)
    fig.canvas.draw()
    monkeypatch.setattr(Text, "draw", original)
    return drawn


def layout_problems(fig, drawn, slack=2.0):
    """Texts outside the figure, and pairs of texts whose extents overlap by more than ``slack`` pixels."""
    box = fig.bbox
    problems = [f"outside the figure: {t!r} {e.extents}" for t, e in drawn
                if e.x0 < box.x0 - 0.5 or e.y0 < box.y0 - 0.5 or e.x1 > box.x1 + 0.5 or e.y1 > box.y1 + 0.5]
    for i in range(len(drawn)):
        for j in range(i + 1, len(drawn)):
            a, b = drawn[i][1], drawn[j][1]
            if min(a.x1, b.x1) - max(a.x0, b.x0) > slack and min(a.y1, b.y1) - max(a.y0, b.y0) > slack:
                problems.append(f"overlap: {drawn[i][0]!r} and {drawn[j][0]!r}")
    return problems


LAYOUT_CASES = {
    "k3_d2": dict(k=3, d=2, charges=4),
    "k100_d50_diagnostics_seed": dict(k=100, d=50, charges=12, diagnostics=True, seed_note=SEED_NOTE),
    "k100_d2": dict(k=100, d=2, charges=12),
    "k100_d1": dict(k=100, d=1, charges=7),
    "k40_d10_40charges_grouped": dict(k=40, d=10, charges=40),
    "ldp_identical_degenerate": dict(k=4, d=2, charges=3, identical=True, degenerate=DEGENERATE),
    "ldp_identical_d6_no_domain": dict(k=4, d=6, charges=3, identical=True, domain=False, degenerate=DEGENERATE),
    "k8_d3": dict(k=8, d=3, charges=12),
    "k100_d3_diagnostics_seed": dict(k=100, d=3, charges=12, diagnostics=True, seed_note=SEED_NOTE),
    "k5_d3_no_domain_3charges": dict(k=5, d=3, charges=3, domain=False),
    "ldp_identical_d3_degenerate": dict(k=4, d=3, charges=3, identical=True, degenerate=DEGENERATE),
    "everything_at_once": dict(k=100, d=50, charges=12, diagnostics=True, seed_note=SEED_NOTE,
                               degenerate=DEGENERATE, ledger=False),
}


@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_nothing_clipped_or_overprinted(case, monkeypatch):
    fig = build_figure(hard_info(**LAYOUT_CASES[case]))
    drawn = drawn_text_extents(fig, monkeypatch)
    assert len(drawn) > 20  # the checker saw the figure's texts (titles, ticks, rows, summary)
    assert layout_problems(fig, drawn) == []
    joined = "\n".join(t for t, _ in drawn)
    # Shortened, not lost: the start of every step label and the run id are drawn.
    assert "maxcover: coverage" in joined and "dpspark run 2024-06-01T12:00:00Z" in joined


def test_layout_checker_catches_clipping_and_overlap(monkeypatch):
    """The checker above can fail: a text placed past the right edge and two texts on top of each other."""
    fig = build_figure(make_info())
    fig.text(0.99, 0.5, "runs off the right edge of the figure")
    fig.text(0.3, 0.3, "first overprinted label")
    fig.text(0.3, 0.3, "second overprinted label")
    problems = layout_problems(fig, drawn_text_extents(fig, monkeypatch))
    assert any(p.startswith("outside the figure: 'runs off") for p in problems)
    assert any("first overprinted label" in p and "second overprinted label" in p for p in problems)


def test_old_failures_from_the_user_trial_are_gone(monkeypatch):
    """Panel (b)'s step labels stay right of panel (a) (and its colorbar), the coverage-loop row and the
    run summary stay inside the figure."""
    fig = build_figure(hard_info(k=30, d=5, charges=12, diagnostics=True))
    drawn = drawn_text_extents(fig, monkeypatch)
    renderer = fig.canvas.get_renderer()
    left_panel = Bbox.union([ax.get_tightbbox(renderer) for ax in (fig.axes[0], fig.axes[-1])])  # (a), colorbar
    steps = [e for t, e in drawn if t.startswith(("maxcover:", "dplloyd:"))]
    assert len(steps) == 12
    assert all(e.x0 > left_panel.x1 for e in steps)
    coverage = [e for t, e in drawn if t.startswith("\u03b5 = 0.02")]
    assert coverage and coverage[0].x1 <= fig.bbox.x1
    summary = [e for t, e in drawn if t.startswith("Privacy (this run)")]
    assert summary and summary[0].y0 >= fig.bbox.y0


def test_coinciding_centers_are_one_marker_with_a_count():
    info = hard_info(k=4, d=2, charges=3, identical=True)
    fig = build_figure(info)
    assert drawn_points(fig) == 1  # one marker for the four centers
    texts = figure_texts(fig)
    label = [t for t in texts if " x4: " in t]
    total = sum(info["noisy_weights"])
    assert label == [f"#0 x4: {total:,.0f}"]  # the first index, the count, the summed weight
    assert not any(t.startswith(("#1", "#2", "#3")) for t in texts)
    assert any("N released centers at one point" in t for t in texts)  # the footnote explains "xN"
    # Centers 1% of the domain apart are distinct: four markers, four labels.
    info["centers"] = [[500.0, 500.0], [510.0, 500.0], [500.0, 510.0], [510.0, 510.0]]
    fig = build_figure(info)
    assert drawn_points(fig) == 4 and not any(" x" in t for t in figure_texts(fig) if t.startswith("#"))


def test_a_speck_of_centers_is_drawn_in_the_public_domain():
    """ldp's identical centers (jitter 1e-5) are not magnified onto a 1e-5 axis: the axes show the domain."""
    fig = build_figure(hard_info(k=4, d=2, charges=3, identical=True))
    ax = fig.axes[0]
    for lo, hi in (ax.get_xlim(), ax.get_ylim()):
        assert lo <= 0.0 and hi >= 1000.0
    assert any("the axes show all of it" in t for t in figure_texts(fig))
    # A projection (d > 3): a speck is shown within the projected domain, not magnified.
    fig = build_figure(hard_info(k=4, d=4, charges=3, identical=True))
    assert fig.axes[0].get_xlim()[1] - fig.axes[0].get_xlim()[0] >= 1000.0
    assert any("shows the whole domain" in t for t in figure_texts(fig))
    # Without a domain in info, the centers' own magnitude is the scale (still no 1e-5 axis).
    info = hard_info(k=4, d=6, charges=3, identical=True, domain=False)
    ax = build_figure(info).axes[0]
    scale = np.abs(np.asarray(info["centers"])).max()
    assert ax.get_xlim()[1] - ax.get_xlim()[0] > 0.05 * scale
    # A healthy spread in a projection (d > 3) is zoomed on the centers, not on the domain.
    info = hard_info(k=5, d=4, charges=3)
    info["centers"] = [[400.0, 400.0, 400.0, 400.0], [450.0, 420.0, 410.0, 430.0], [420.0, 480.0, 430.0, 410.0],
                       [470.0, 470.0, 440.0, 450.0], [430.0, 440.0, 470.0, 420.0]]
    xlo, xhi = build_figure(info).axes[0].get_xlim()
    assert xhi - xlo < 300.0


def test_degenerate_warning_in_figure_and_html():
    info = hard_info(k=4, d=2, charges=3, identical=True, degenerate=DEGENERATE)
    fig = build_figure(info)
    warning = [t for t in fig.findobj(Text) if t.get_text().startswith("DEGENERATE RESULT:")]
    assert len(warning) == 1 and warning[0].get_color() == "#a00000"
    flat = " ".join(warning[0].get_text().split())  # wrapped to the figure's width
    assert "only 1 distinct center" in flat and "Likely cause: too few users" in flat
    page = build_html(info, png=PNG_MAGIC + b"rest")
    assert "DEGENERATE RESULT: The released centers collapsed" in page and "about 24 times more users" in page
    assert "rough estimate) &lt;b&gt;" in page and "<b>" not in page  # escaped
    assert "DEGENERATE" not in build_html(make_info())
    assert not any("DEGENERATE" in t for t in figure_texts(build_figure(make_info())))


def test_html_page_stands_on_its_own():
    page = build_html(hard_info(k=4, d=2, diagnostics=True), png=PNG_MAGIC + b"rest")
    assert page.startswith("<!DOCTYPE html>") and "<meta charset='utf-8'>" in page
    assert "<style>" in page and "data:image/png;base64," in page
    for external in ("http://", "https://", "<link", "<script", "src='/", "src=\"/", "url("):
        assert external not in page


@pytest.mark.parametrize("domain", [None, {"lower": [-1e308] * 3, "upper": [1e308] * 3}, {"radius": 1e308}])
def test_extreme_public_domains_still_render(tmp_path, domain, monkeypatch):
    """Centers near +-1e308 (a public domain that wide is allowed): drawn in units of a power of ten, no
    overflow in the projection or the axis limits; the report must not fail a run that already spent budget."""
    info = make_info(d=3, k=3)
    info["centers"] = [[1e308, -1e308, 5.0], [-1e308, 1e308, 3.0], [0.0, 0.0, 1.0]]
    info["domain"] = domain
    fig = build_figure(info)
    assert any("(unit 1e+308)" in t for t in figure_texts(fig))
    assert layout_problems(fig, drawn_text_extents(fig, monkeypatch)) == []
    write_report(tmp_path / "r.png", info)
    assert_png(tmp_path / "r.png")


# --------------------------------------------------------------------------
# The new-user trial's points (issue 29, item 6)
# --------------------------------------------------------------------------


def centers_scatter(fig, k):
    """The released centers' scatter in panel (a)."""
    return [c for c in fig.axes[0].collections if isinstance(c, PathCollection) and len(c.get_offsets()) == k][0]


def test_weights_are_written_readably_in_figure_and_html():
    """15,390, not +1.539e+04: in the labels, on the colorbar and in report.html."""
    info = make_info(d=2, k=4, weights=[15390.2, -3.0, 12.5, 1234567.0])
    info["centers"] = [[-0.8, -0.8], [0.8, 0.8], [-0.8, 0.8], [0.8, -0.8]]
    fig = build_figure(info)
    fig.canvas.draw()
    texts = figure_texts(fig)
    for label in ("#0: 15,390", "#1: -3", "#2: 12.5", "#3: 1,234,567"):
        assert label in texts
    cax = fig.axes[-1]
    ticks = [t.get_text() for t in cax.get_yticklabels() if t.get_text()]
    assert "1,000,000" in ticks and cax.yaxis.get_offset_text().get_text() == ""  # no "1e6" above the bar
    assert not any("e+" in t for t in texts if t.startswith("#") or t in ticks)
    page = build_html(info)
    for cell in ("<td>15,390</td>", "<td>-3</td>", "<td>12.5</td>", "<td>1,234,567</td>"):
        assert cell in page
    assert "e+0" not in page


def test_colour_scale_starts_at_zero_and_clips_negative_weights():
    info = make_info(d=2, k=4, weights=[1000.0, 1001.0, 1002.0, -5.0])
    info["centers"] = [[-0.8, -0.8], [0.8, 0.8], [-0.8, 0.8], [0.8, -0.8]]
    fig = build_figure(info)
    sc = centers_scatter(fig, 4)
    assert sc.norm.vmin == 0.0 and sc.norm.vmax == 1002.0  # not stretched over 1000..1002
    assert fig.axes[-1].get_ylabel() == "noisy weight (released)"
    colors = sc.to_rgba(sc.get_array())
    negative = [i for i, w in enumerate(sc.get_array()) if w < 0]
    assert len(negative) == 1 and tuple(colors[negative[0]]) == tuple(sc.cmap(0.0))  # the bottom colour
    # 1000 and 1002 get (almost) the same colour: a spread of 2 is not exaggerated.
    assert np.abs(np.subtract(sc.to_rgba(1000.0), sc.to_rgba(1002.0))).max() < 0.02


def outline_patches(ax):
    return [p for p in ax.patches if p.get_linestyle() == "--"]


def test_axes_show_the_public_domain_for_one_and_two_features():
    info = hard_info(k=5, d=2, charges=3)  # box [0, 1000]^2, the centers in a small part of it
    info["centers"] = [[400.0, 400.0], [450.0, 420.0], [420.0, 480.0], [470.0, 470.0], [430.0, 440.0]]
    fig = build_figure(info)
    ax = fig.axes[0]
    for lo, hi in (ax.get_xlim(), ax.get_ylim()):
        assert -100.0 < lo <= 0.0 and 1000.0 <= hi < 1100.0
    (box,) = outline_patches(ax)
    assert isinstance(box, Rectangle) and box.get_xy() == (0.0, 0.0)
    assert box.get_width() == 1000.0 and box.get_height() == 1000.0
    assert any("dashed outline: the public domain (box [0, 1000] x [0, 1000])" in t for t in figure_texts(fig))
    # A ball: [-r, r] on both axes, drawn as a circle.
    info["domain"] = {"radius": 5.0}
    info["centers"] = [[0.1, 0.2], [0.3, -0.2], [-0.4, 0.1], [0.2, 0.4], [0.0, 0.0]]
    ax = build_figure(info).axes[0]
    (ball,) = outline_patches(ax)
    assert isinstance(ball, Circle) and ball.get_radius() == 5.0
    assert ax.get_xlim()[0] <= -5.0 and ax.get_xlim()[1] >= 5.0
    # One feature: the x axis is the domain's interval.
    info = hard_info(k=3, d=1, charges=3)
    info["centers"] = [[500.0], [510.0], [530.0]]
    ax = build_figure(info).axes[0]
    assert ax.get_xlim()[0] <= 0.0 and ax.get_xlim()[1] >= 1000.0 and len(outline_patches(ax)) == 1


def test_projected_axes_say_they_are_projections():
    fig = build_figure(hard_info(k=6, d=5, charges=3))
    assert any("the axes are projections" in t for t in figure_texts(fig))
    assert outline_patches(fig.axes[0]) == []  # the box is not drawn in PC coordinates


LONG_PATH = "s3://analytics-prod-bucket/warehouse/very/deeply/nested/customer_events/" + "p" * 120 + "/points_table"
LONG_WHERE = "country IN ('FR', 'DE', 'IT') AND age < 30 AND " + " AND ".join(f"col_{i} IS NOT NULL" for i in range(30))


def test_input_is_shown_in_header_and_html(monkeypatch):
    info = make_info()
    info["input"] = {"path": "data/demo_points", "version": 7, "where": "age < 30", "format": "delta"}
    line = "input: data/demo_points (delta, version 7); rows where age < 30"
    assert line in figure_texts(build_figure(info))
    assert "input: data/demo_points (delta, version 7); rows where age &lt; 30" in build_html(info)
    # Long ones: one line shortened with ellipses in the figure (both ends of the path kept), in full in the html.
    info["input"] = {"path": LONG_PATH, "version": None, "where": LONG_WHERE, "format": "parquet"}
    fig = build_figure(info)
    drawn = [(t, e) for t, e in drawn_text_extents(fig, monkeypatch) if t.startswith("input: ")]
    assert len(drawn) == 1
    text, extent = drawn[0]
    assert "\n" not in text and text.count("\u2026") == 2 and extent.x1 <= fig.bbox.x1
    assert text.startswith("input: s3://analytics") and "points_table (parquet); rows where country IN" in text
    assert "version" not in text  # no version given
    page = build_html(info)
    assert LONG_PATH in page and html.escape(LONG_WHERE) in page
    # No filter, and no input at all (older callers): nothing invented.
    info["input"] = {"path": "data/demo_points", "version": 3, "where": None, "format": "delta"}
    assert "input: data/demo_points (delta, version 3); all rows (no row filter)" in figure_texts(build_figure(info))
    del info["input"]
    assert not any(t.startswith("input:") for t in figure_texts(build_figure(info)))
    assert "input:" not in build_html(info)


def test_privacy_spent_by_the_run_and_the_ledger_balance_are_told_apart():
    info = make_info()
    info.update(epsilon_spent=0.5, epsilon_configured=0.5, delta_spent=0.0, delta_configured=1e-6)
    info["ledger"].update(spent_epsilon=1.5, budget_epsilon=3.0, ledger_cap_epsilon=3.0, spent_delta=0.0,
                          budget_delta=1e-5, ledger_cap_delta=1e-5)
    spent = ("privacy spent by this run: \u03b5 = 0.5, \u03b4 = 0 "
             "(configured for the run: \u03b5 = 0.5, \u03b4 = 1e-06)")
    texts = figure_texts(build_figure(info))
    page = build_html(info)
    assert spent in texts and spent in page
    ledger = [t for t in texts if t.startswith("ledger for this input")]
    assert len(ledger) == 1 and "spent \u03b5 = 1.5 of cap 3, spent \u03b4 = 0 of cap 1e-05" in ledger[0]
    assert "spent \u03b5 = 1.5 of cap 3" in page
    assert not any("0.5 of 0.5" in t for t in texts) and "0.5 of 0.5" not in page
    # A run that lowered the cap for itself: both caps are said.
    info["ledger"]["ledger_cap_epsilon"] = 10.0
    lowered = "of cap 3 (lowered for this run; the ledger's cap is 10)"
    assert html.escape(lowered) in build_html(info) and any(lowered in t for t in figure_texts(build_figure(info)))
    # No ledger: said in the header.
    info["ledger"] = None
    assert any(t.startswith("ledger: none configured") for t in figure_texts(build_figure(info)))


@pytest.mark.parametrize("n, rule", [(12, "discrete Laplace"), (3, LONG_RULE), (12, LONG_RULE)])
def test_rule_names_are_written_in_full(n, rule):
    """The trial's 'discrete Laplac...': every mechanism name is whole (in its row or in a keyed legend)."""
    info = make_info()
    info["charges"] = [{"step": LONG_STEPS[i % 3], "epsilon": 0.5 / 12, "delta": 1.2345e-7, "rule": rule}
                       for i in range(n)]
    fig = build_figure(info)
    texts = [t.get_text() for t in fig.axes[1].texts]
    flat = [" ".join(t.split()) for t in texts]  # wrapped lines joined again
    assert any(rule in t for t in flat)
    for t in texts:  # nothing in the panel is cut: step labels are wrapped, not shortened
        assert "\u2026" not in t, t


# --------------------------------------------------------------------------
# The new-user trial's points (issue 50, minor item 7)
# --------------------------------------------------------------------------


def three_feature_info():
    info = make_info(d=3, k=3, weights=[120.0, 45.5, -2.0])
    info["feature_names"] = ["age", "income", "visits"]
    info["centers"] = [[12.3456, 45.678, 78.9012], [60.0, 20.25, 5.5], [90.1, 95.2, 50.05]]
    info["domain"] = {"lower": [0.0, 0.0, 0.0], "upper": [100.0, 100.0, 100.0]}
    return info


def test_three_features_are_drawn_as_feature_pairs_with_their_values():
    """d = 3: three views, x-y, x-z, y-z, whose axes are the features (not principal components), each with the
    public box, and a table of every center's coordinates (rounded to 1e-4 of the domain's width) beside them."""
    info = three_feature_info()
    fig = build_figure(info)
    views = fig.axes[:1] + fig.axes[3:-1]  # (a) is created first; the two other views before the colorbar
    assert len(views) == 3
    assert [(a.get_xlabel(), a.get_ylabel()) for a in views] == [("age", "income"), ("age", "visits"),
                                                                 ("income", "visits")]
    centers = np.asarray(info["centers"])
    for a, (i, j) in zip(views, ((0, 1), (0, 2), (1, 2))):
        offsets = np.asarray(centers_scatter_in(a, 3).get_offsets())
        assert sorted(map(tuple, offsets.round(6))) == sorted(map(tuple, centers[:, [i, j]].round(6)))
        (box,) = outline_patches(a)
        assert isinstance(box, Rectangle) and box.get_xy() == (0.0, 0.0)
        assert (box.get_width(), box.get_height()) == (100.0, 100.0)
        assert a.get_xlim()[0] <= 0.0 and a.get_xlim()[1] >= 100.0
    texts = figure_texts(fig)
    assert not any("PC1" in t or "principal" in t for t in texts)
    (table,) = [t for t in texts if t.startswith("released centers (original units")]
    header, *rows = table.split("\n")[1:5]
    assert header.split() == ["#", "age", "income", "visits", "weight"]
    assert [r.split() for r in rows] == [["0", "12.35", "45.68", "78.90", "120"],
                                         ["1", "60.00", "20.25", "5.50", "45.5"],
                                         ["2", "90.10", "95.20", "50.05", "-2"]]
    assert any("dashed outline: the public domain (box [0, 100] x [0, 100] x [0, 100])" in t for t in texts)


def centers_scatter_in(ax, k):
    return [c for c in ax.collections if isinstance(c, PathCollection) and len(c.get_offsets()) == k][0]


def test_long_feature_names_are_in_the_figure_in_full(monkeypatch):
    """Long names wrap (between their parts) on the axes and under the table: none is cut."""
    info = hard_info(k=8, d=3, charges=12)
    fig = build_figure(info)
    drawn = drawn_text_extents(fig, monkeypatch)
    assert layout_problems(fig, drawn) == []
    flat = [re.sub(r"\s*\n\s*", "", t) for t, _ in drawn]  # wrapped lines joined again
    for name in info["feature_names"]:
        assert sum(name in t for t in flat) >= 3  # two axis labels and the table's key
    assert not any("\u2026" in t for t, _ in drawn if not t.startswith("input: "))


def test_more_than_three_features_keep_the_projection_and_point_to_the_table():
    info = make_info(d=10, k=5)
    info["domain"] = {"lower": [-1.0] * 10, "upper": [1.0] * 10}
    fig = build_figure(info)
    texts = [" ".join(t.split()) for t in figure_texts(fig)]  # wrapped lines joined again
    assert len(fig.axes) == 4 and outline_patches(fig.axes[0]) == []
    assert any("the public domain is not drawn; every center's coordinates: the table in report.html" in t
               for t in texts)
    page = build_html(info)
    for j in range(10):
        assert f"<th>feat_{j}</th>" in page
    for c in info["centers"]:  # width 2: four decimals
        assert "<td>" + "</td><td>".join(f"{v:.4f}".replace("-0.0000", "0.0000") for v in c) + "</td>" in page


def test_coordinates_are_rounded_to_the_domain_in_html():
    info = make_info(d=2, k=2)
    info["centers"] = [[123456.789, 0.5], [999999.0, 0.25]]
    info["domain"] = {"lower": [0.0, 0.0], "upper": [1e6, 1.0]}
    page = build_html(info)
    assert "<td>0</td><td>123457</td><td>0.5000</td>" in page and "<td>1</td><td>999999</td><td>0.2500</td>" in page
    assert "e+05" not in page
    # Without a public domain: the centers' own spread sets the rounding.
    info["domain"] = None
    info["centers"] = [[10.0, 1.23456789], [20.0, 2.5]]
    assert "<td>0</td><td>10.000</td><td>1.2346</td>" in build_html(info)


def test_step_names_are_wrapped_not_cut(monkeypatch):
    """The trial's cut step names: with more than 6 rows every step label is drawn in full, wrapped."""
    steps = [LONG_STEPS[i % 3] + f" [{i}]" for i in range(12)]
    for n in (12, 3):
        info = make_info()
        info["charges"] = [{"step": steps[i], "epsilon": 0.5 / n, "delta": 0.0, "rule": "discrete Laplace"}
                           for i in range(n)]
        fig = build_figure(info)
        drawn = drawn_text_extents(fig, monkeypatch)
        assert layout_problems(fig, drawn) == []
        labels = [" ".join(t.split()) for t in (x.get_text() for x in fig.axes[1].texts)]
        for step in steps[:n]:
            assert step in labels
        assert not any("\u2026" in t for t in labels)
        assert any("\n" in t.get_text() for t in fig.axes[1].texts)  # long ones took two lines


def test_budget_numbers_are_written_without_float_noise():
    """remaining_delta 1e-5 - 2e-6 = 8.000000000000001e-06 reads 8e-06; %g style with 6 significant digits in
    the figure and 12 in report.html (not 4: 1/3 reads 0.333333)."""
    info = make_info()
    info.update(epsilon_spent=1 / 3, epsilon_configured=1 / 3, delta_spent=0.1 + 0.2, delta_configured=0.3)
    info["ledger"].update(spent_delta=2e-6, budget_delta=1e-5, ledger_cap_delta=1e-5, remaining_delta=1e-5 - 2e-6,
                          spent_epsilon=0.1 + 0.2, budget_epsilon=1.0, ledger_cap_epsilon=1.0,
                          remaining_epsilon=1.0 - (0.1 + 0.2))
    info["charges"] = [{"step": "step one", "epsilon": 0.1 + 0.2, "delta": 1e-5 - 2e-6, "rule": "laplace"}]
    info["parameters"] = {"eps_split": 0.1 + 0.2, "fraction": 1 / 3, "grid": True, "iterations": 12}
    assert repr(info["ledger"]["remaining_delta"]) == "8.000000000000001e-06"
    texts = figure_texts(build_figure(info))
    page = build_html(info)
    joined = "\n".join(texts)
    for noise in ("8.000000000000001e-06", "0.30000000000000004", "0.7000000000000001", "0.3333333333333333"):
        assert noise not in joined and noise not in page
    assert "remaining 8e-06" in joined and "remaining 0.7" in joined
    assert "epsilon 0.333333, delta 0.3" in joined
    assert "\u03b5 = 0.3, \u03b4 = 8e-06" in joined  # panel (b)
    assert "eps_split = 0.3" in joined and "fraction = 0.333333" in joined and "grid = true" in joined
    assert "\u03b5 = 0.333333333333" in page
    assert "<td>delta</td><td>2e-06</td><td>1e-05</td><td>1e-05</td><td>8e-06</td>" in page
    assert "<td>eps_split</td><td>0.3</td>" in page and "<td>grid</td><td>true</td>" in page
    assert "<td>step one</td><td>0.3</td><td>8e-06</td>" in page


def test_the_docs_say_where_the_domain_is_drawn_as_the_figure_does():
    """docs/outputs.md and the figure agree: the public domain is a dashed outline for d <= 3 (the axes are
    features) and not drawn for d > 3 (the axes are principal components)."""
    docs = (Path(__file__).resolve().parents[1] / "docs" / "outputs.md").read_text()
    bullet = " ".join(docs.split("- `report.png`:", 1)[1].split("- `report.html`", 1)[0].split())
    assert "dashed outline" in bullet and "d <= 3" in bullet and "d > 3" in bullet
    assert "the public domain is not drawn" in bullet and "d = 3" in bullet and "table" in bullet
    for d, drawn in ((1, True), (2, True), (3, True), (4, False), (10, False)):
        info = make_info(d=d, k=4)
        info["domain"] = {"lower": [-1.0] * d, "upper": [1.0] * d}
        fig = build_figure(info)
        texts = [" ".join(t.split()) for t in figure_texts(fig)]  # the footnote's lines joined again
        views = fig.axes[:1] + fig.axes[3:-1]
        assert all(len(outline_patches(a)) == (1 if drawn else 0) for a in views)
        assert any("dashed outline: the public domain (box [-1, 1]" in t for t in texts) == drawn
        assert any("the public domain is not drawn" in t for t in texts) == (not drawn)
