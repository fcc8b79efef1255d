"""Tests for dpspark.report (report.png from released values). No Spark.

``make_info`` builds what the runner passes: wall times (NON-PRIVATE operational metadata, they grow
with n) only together with the other non-private diagnostics; the ledger view of a run charged to a
ledger, whose cap is the ledger's; the runner's NOT PRIVATE note for a fixed-seed run.
"""

import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.text import Text

from dpspark.report import NON_PRIVATE_LABEL, _fmt, build_figure, build_html, write_report

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
    "weights, d",
    [([0.0], 2), ([0.0, 0.0, 0.0], 3), ([-12.5, 40.0, -0.5], 2), ([-3.0], 1), ([5.0], 10)],
)
def test_edge_cases_k1_zero_and_negative_weights(tmp_path, weights, d):
    info = make_info(d=d, k=len(weights), weights=weights)
    fig = build_figure(info)
    joined = "\n".join(figure_texts(fig))
    for j, w in enumerate(weights):
        assert f"#{j}: {w:+.4g}" in joined  # sign shown in the label
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
    for w in info["noisy_weights"]:
        assert f"<td>{_fmt(w)}</td></tr>" in page  # last cell of each center row
    assert page.count("iteration ") == 12  # every charge, none grouped away
    assert SEED_NOTE in page and "remaining" in page
    assert NON_PRIVATE_LABEL not in page
    assert not any(step in page for step in TIMINGS)  # no wall times without diagnostics


def test_html_page_marks_diagnostics_and_omits_the_data_sample():
    page = build_html(make_info(diagnostics=True))
    assert page.count(NON_PRIVATE_LABEL) == 2 and "true_cost" in page and "data_sample" not in page
    assert all(step in page for step in TIMINGS)
    assert "no ledger configured" in build_html(make_info(ledger=False))
