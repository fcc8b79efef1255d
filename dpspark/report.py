"""report.png and report.html: what a person looks at first after a run.

They show ONLY released (public) values: the released centers and their noisy
weights, the privacy charges, the ledger totals, the run's public parameters, the
input (path, format and row filter: public configuration; the Delta version read
when the runner passes one) and the public domain. Drawing them is post-processing:
no privacy cost. The one exception is ``info["diagnostics"]`` (and the wall times in ``info["timings"]``,
which the runner passes only together with them): non-private diagnostics that a
user switched on explicitly; when present they are drawn and the figure says
"NON-PRIVATE DIAGNOSTICS" in red.

The header says what this run spent next to what it was configured to spend, and,
apart from it, the input's balance in the ledger (all runs on it, against its cap).
Noisy weights are written as readable numbers (``15,390``, ``-3``, ``12.5``: see
``_fmt_weight``), the same in the figure and the html; their colour scale starts at 0
(a negative noisy weight gets the bottom colour), so a small spread of large weights
is not stretched over the whole colormap.

With d <= 3 the axes are the features, named, and show the whole PUBLIC domain (box:
its bounds; ball: [-r, r]), drawn as a light dashed outline, so the centers are seen
where they lie in it. With d = 3 panel (a) is three views, one per pair of features
(x-y, x-z, y-z), and a table of every released center's coordinates (rounded to about
1e-4 of the feature's width: ``_coordinate_formats``) and noisy weight beside them. For
d > 3 the centers are projected onto the first two principal components of the
released CENTERS themselves (numpy SVD), never of the data, so the projection is
post-processing of released values too; the footnote says the axes are projections,
that the public domain is not drawn there, and that the coordinates are in report.html.

Privacy numbers (epsilon and delta: spent, configured, caps, remaining, each step's
charge) are written in %g style (``_fmt_budget``: 6 significant digits in the figure,
12 in report.html), so float noise never shows (``8e-06``, not ``8.000000000000001e-06``).

Read at a glance (nothing clipped or overprinted, for k up to 100, d up to 50, up
to 12 charges and long names): the layout is computed in pixels with the Agg
renderer before anything is drawn. The header's lines are wrapped to the figure's
width and stacked; each panel gets its own region and its axes shrink until their
tick labels, axis labels, title and colorbar fit inside it; long labels are wrapped
(between words, or after a "_" of a long name); only the header's input line is
shortened with an ellipsis (it keeps both ends of a long path; in full in report.html).
In the charges panel nothing is cut: a step's name is wrapped in its column (a row is
as tall as its name), in a smaller font if the rows would be too tall, and a rule
(mechanism) is written whole in its row, in a smaller font if needed, or as a key
("rule [1]") whose full text is in a legend under the rows; center labels are placed
where they overlap nothing and at most ``_MAX_LABELS`` are drawn; the run summary is a
fixed-width text panel whose font shrinks (and, at the smallest size, whose lines are
cut) until it fits. Centers that coincide (every coordinate within
``_VISUAL_TOLERANCE`` of the domain's width) are drawn as ONE marker labelled with
their count ("x4"). Where the axes do not show the whole domain (d > 3, or no domain
given) they zoom on the centers, except that when the centers span almost nothing an
axis shows the domain (or, without one, the centers' own magnitude) instead of a
magnified speck.

Uses ``matplotlib.figure.Figure`` with the Agg canvas directly: no pyplot, so no
global figure state leaks between runs or tests.

Public API: ``write_report(path, info)``; ``build_figure(info)`` returns the Figure
(used by tests to inspect its texts); ``build_html(info, png)`` returns
``report.html``: the same figure inlined, and the released values as tables (every
center with its noisy weight, every charge, the ledger, parameters, timings) that a
person can read, search and copy. The page stands on its own (inline image and
style, every value HTML-escaped).

The code is in four modules: this one draws the figure (``write_report``, ``build_figure``, the panels);
``dpspark.report_layout`` fits text and axes into pixel boxes and places labels (it knows nothing about
runs); ``dpspark.report_html`` builds the page (``build_html``, imported here); ``dpspark.report_text``
holds the words and numbers both write (``_fmt_budget``, ``_fmt_weight``, the labels, ...).
"""

from __future__ import annotations

import math
import os

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Circle, Rectangle
from matplotlib.ticker import FuncFormatter

from dpspark.degenerate import coinciding_groups
from dpspark.report_html import build_html
from dpspark.report_layout import _MAX_LABELS, _ellipsize, _fit_axes, _fit_block, _place, _place_labels, _wrap, _wrap_lines
from dpspark.report_text import (
    DEGENERATE_LABEL,
    NON_PRIVATE_LABEL,
    _coordinate_formats,
    _domain,
    _domain_text,
    _fmt,
    _fmt_budget,
    _fmt_param,
    _fmt_weight,
    _input_line,
    _input_parts,
    _ledger_text,
    _remaining,
    _spent_text,
)

__all__ = ["write_report", "build_figure", "build_html"]

_DPI = 90
_FIGSIZE = (16.0, 10.0)  # inches: 1440 x 900 pixels at _DPI
_PAD = 12.0  # pixels between the figure's edge and anything drawn
_GAP = 10.0  # pixels between stacked blocks
# At most this many data-sample rows (diagnostics only), at most this many rows in panel (b);
# at most _MAX_LABELS center labels (dpspark.report_layout).
_MAX_SAMPLE = 5000
_MAX_CHARGE_ROWS = 12
# Centers whose every coordinate differs by at most this fraction of the domain's
# width are drawn as one marker with a count. An axis never shows less than
# _ZOOM_MIN of the domain's width, so such centers are under 2 pixels apart.
_VISUAL_TOLERANCE = 1e-4
_ZOOM_MIN = 0.05


def write_report(path, info: dict) -> None:
    """Write ``report.png`` for one run to ``path``. Post-processing: no privacy cost.

    ``info`` holds released values only (see ``build_figure``); parent
    directories are created if missing.
    """
    fig = build_figure(info)
    parent = os.path.dirname(os.fspath(path))
    if parent:
        os.makedirs(parent, exist_ok=True)
    fig.savefig(path, format="png", dpi=_DPI)  # the dpi the layout was measured at


def build_figure(info: dict) -> Figure:
    """Build the report Figure from ``info`` (released values). Post-processing: no privacy cost.

    Keys: run_id, algorithm, objective, k, epsilon_spent, delta_spent,
    epsilon_configured, delta_configured, centers (k lists, original units),
    noisy_weights (k floats), feature_names, charges (dicts: step, epsilon,
    delta, rule), ledger (None or dict: spent_epsilon, spent_delta (the
    input's totals), budget_epsilon, budget_delta (the cap in force for this
    run), ledger_cap_epsilon, ledger_cap_delta (the ledger's own cap),
    remaining_epsilon, ...), parameters (dict),
    timings (step -> s; non-private, only with diagnostics), seed_note (None or
    str), diagnostics (None or dict, NON-PRIVATE: e.g. true_cost, data_sample
    (m, d) in original units), degenerate (None or the dict of
    ``dpspark.degenerate.describe_collapse``: drawn as a red warning), domain
    (optional, PUBLIC: {"lower": [...], "upper": [...]} or {"radius": R}; sets
    the tolerance for coinciding centers, the axes and the dashed outline for
    d <= 3, the rounding of the coordinates' table and, for d > 3, the axes when the
    centers span almost nothing), input (optional, PUBLIC
    configuration: {"path", "version" (the Delta version read, or None), "where"
    (the row filter, or None), "format"}; missing: no input line).

    Header: title, input, privacy spent by this run (and configured for it), the
    ledger's balance for the input, warnings. Panels: (a) centers sized and
    colored by noisy weight (d = 3: three feature-pair views and a table of the
    coordinates); (b) epsilon per charged step; (c) text: privacy spent
    vs configured, ledger, parameters, timings.
    """
    centers = np.asarray(info.get("centers") or [], dtype=float)
    if centers.ndim == 1:  # k = 0 rows or a flat list of 1-D centers
        centers = centers.reshape(len(centers), -1) if centers.size else centers.reshape(0, 1)
    weights = np.asarray(info.get("noisy_weights") or [], dtype=float).reshape(-1)
    if weights.shape[0] != centers.shape[0]:
        raise ValueError(
            f"noisy_weights has {weights.shape[0]} values but centers has {centers.shape[0]} rows: "
            "need one noisy weight per center"
        )
    d = centers.shape[1]
    names = [str(f) for f in (info.get("feature_names") or [])]
    if len(names) != d:
        names = [f"x{i}" for i in range(d)]
    diagnostics = info.get("diagnostics")

    fig = Figure(figsize=_FIGSIZE, dpi=_DPI)
    FigureCanvasAgg(fig)  # attach the Agg canvas explicitly (no pyplot)
    r = fig.canvas.get_renderer()
    W = fig.bbox.width
    # Created in this order: fig.axes[0] is panel (a); positions are set below, in pixels.
    ax_centers = fig.add_axes((0.0, 0.0, 0.5, 0.5))
    ax_charges = fig.add_axes((0.5, 0.5, 0.5, 0.5))
    ax_text = fig.add_axes((0.5, 0.0, 0.5, 0.5))

    body_top = _draw_header(fig, r, info, centers.shape[0], diagnostics) - _GAP
    left = (_PAD, _PAD, 0.535 * W, body_top)
    right_x0, right_x1 = 0.565 * W, W - _PAD
    _draw_centers(fig, r, ax_centers, left, centers, weights, names, diagnostics, _domain(info.get("domain"), d))
    charges_bottom = _draw_charges(fig, r, ax_charges, (right_x0, right_x1, body_top), info.get("charges") or [],
                                   max_h=0.55 * (body_top - _PAD))
    _draw_text(fig, r, ax_text, (right_x0, _PAD, right_x1, charges_bottom - 2 * _GAP), info, centers.shape[0],
               diagnostics)
    return fig


# --------------------------------------------------------------------------
# Header
# --------------------------------------------------------------------------


def _draw_header(fig, r, info, k, diagnostics) -> float:
    """Title, input, privacy spent, the ledger and the warnings, stacked from the top; returns the bottom
    (pixels)."""
    W, H = fig.bbox.width, fig.bbox.height
    width = W - 2 * _PAD
    y = H - _PAD

    def line(text, max_lines, boxed=False, **kwargs):
        nonlocal y
        pad = 5.0 if boxed else 0.0  # room for the box drawn around the text
        t = fig.text((_PAD + pad) / W, (y - pad) / H, "", ha="left", va="top", **kwargs)
        _wrap(t, text, width - 2 * pad, r, max_lines=max_lines)
        y -= t.get_window_extent(r).height + 2 * pad + 6.0
        return t

    run = f"dpspark run {info.get('run_id', '?')}:"
    what = f"{info.get('algorithm', '?')}, {info.get('objective', '?')}, k = {info.get('k', k)}"
    title = line(f"{run} {what}", 1, fontsize=15, fontweight="bold")
    if title.get_text() != f"{run} {what}":  # too long for one line: the run id on its own line
        y = H - _PAD  # start again at the top
        title.remove()
        line(f"{run}\n{what}", 3, fontsize=15, fontweight="bold")
    source = _input_parts(info.get("input"))
    if source is not None:  # one line: a long path loses its middle, a long filter its end
        t = fig.text(_PAD / W, y / H, "", ha="left", va="top", fontsize=10.5)
        _fit_input(t, *source, width, r)
        y -= t.get_window_extent(r).height + 6.0
    line(_spent_text(info), 2, fontsize=11)
    line(_ledger_text(info.get("ledger")), 2, fontsize=11)
    seed_note = info.get("seed_note")
    if seed_note:
        text = str(seed_note)
        if "not private" not in text.lower():
            text += " (fixed seed: testing aid, NOT private)"
        line(text, 2, color="red", fontsize=12, fontweight="bold")
    if diagnostics is not None:
        line(NON_PRIVATE_LABEL + ": data drawn, do not publish", 1, boxed=True, color="white", fontsize=12,
             fontweight="bold", bbox=dict(facecolor="red", edgecolor="red", boxstyle="round,pad=0.3"))
    degenerate = info.get("degenerate")
    if degenerate:
        text = f"{DEGENERATE_LABEL}: {degenerate.get('message', '')}"
        if degenerate.get("likely_cause"):
            text += f"\nLikely cause: {degenerate['likely_cause']}"
        line(text, 5, boxed=True, color="#a00000", fontsize=11, fontweight="bold",
             bbox=dict(facecolor="#fff0f0", edgecolor="#c00000", boxstyle="round,pad=0.3"))
    return y


def _fit_input(t, path, details, where, max_px, r) -> None:
    """Set ``t`` to the input line, in one line of at most ``max_px``: a long path keeps its two ends
    and a long filter its start (both are in full in report.html)."""
    t.set_text(_input_line(path, details, where))
    if t.get_window_extent(r).width <= max_px:
        return
    t.set_text(_input_line("", details, "x" if where else ""))
    room = max(max_px - t.get_window_extent(r).width - 4.0, 40.0)
    widths = []
    for part in (path, where):
        t.set_text(part)
        widths.append(t.get_window_extent(r).width if part else 0.0)
    path_px, where_px = widths
    if path_px <= room / 2:  # the shorter one keeps what it needs, the other gets the rest
        path_max, where_max = path_px, room - path_px
    elif where_px <= room / 2:
        path_max, where_max = room - where_px, where_px
    else:
        path_max, where_max = room / 2, room / 2
    _ellipsize(t, path, path_max, r, keep="middle")
    short_path = t.get_text()
    if where:
        _ellipsize(t, where, where_max, r)
    short_where = t.get_text() if where else ""
    _ellipsize(t, _input_line(short_path, details, short_where), max_px, r)  # (the parts were measured apart)


# --------------------------------------------------------------------------
# Panel (a): the released centers
# --------------------------------------------------------------------------


def _domain_outline(domain, d: int, dims=(0, 1)):
    """The public domain as a light dashed patch in data units, in a view whose axes are the features
    ``dims`` (d <= 3): a box's rectangle, a ball's circle (a ball's shadow on any pair of features is
    the disc of its radius); with one feature, the interval [lo, hi] over the panel's height."""
    style = dict(fill=False, edgecolor="0.55", linestyle="--", linewidth=1.1, zorder=2)
    i, j = dims
    if domain["radius"] is not None:
        radius = domain["radius"]
        if d >= 2:
            return Circle((0.0, 0.0), radius, **style)
        return Rectangle((-radius, -1.0), 2 * radius, 2.0, **style)
    lo = domain["center"] - domain["half"]
    if d >= 2:
        return Rectangle((lo[i], lo[j]), 2 * domain["half"][i], 2 * domain["half"][j], **style)
    return Rectangle((lo[0], -1.0), 2 * domain["half"][0], 2.0, **style)


def _drawing_unit(centers: np.ndarray, domain) -> float:
    """1.0, or a power of ten near the largest magnitude when that is beyond 1e100."""
    values = [np.abs(centers[np.isfinite(centers)])]
    if domain is not None:
        values.append(np.abs(domain["center"]) + (domain["half"] if domain["half"] is not None else domain["radius"]))
    top = max((float(v.max()) for v in values if v.size), default=0.0)
    if not (math.isfinite(top) and top > 1e100):
        return 1.0
    return 10.0 ** math.floor(math.log10(top))


def _project(centers: np.ndarray, names: list[str]):
    """Affine projection of the centers to the plane: (mean, basis (d, m), x label, y label, note).

    d == 1: x only (m = 1, drawn at y = 0); d == 2: the two features; d > 2: the first
    two principal components of the released CENTERS (never the data).
    """
    k, d = centers.shape
    if d == 1:
        return np.zeros(1), np.eye(1), names[0], "", "1 feature: drawn at y = 0"
    if d == 2:
        return np.zeros(2), np.eye(2), names[0], names[1], ""
    finite = centers[np.all(np.isfinite(centers), axis=1)]
    mean = finite.mean(axis=0) if len(finite) else np.zeros(d)
    # full_matrices=True always gives d right singular vectors, even for k < 2.
    _, s, vt = np.linalg.svd(finite - mean if len(finite) else np.zeros((1, d)), full_matrices=True)
    var = s**2
    share = var / var.sum() if var.sum() > 0 else np.zeros_like(var)
    shares = [share[i] if i < share.shape[0] else 0.0 for i in range(2)]
    note = (f"d = {d}: the axes are projections onto the first 2 principal components of the released centers "
            "(not of the data), not features; the public domain is not drawn")
    return (mean, vt[:2].T, f"PC1 of released centers ({100 * shares[0]:.0f}% of their variance)",
            f"PC2 of released centers ({100 * shares[1]:.0f}% of their variance)", note)


def _views(centers: np.ndarray, names: list[str]):
    """The 2-D views of panel (a): ([(mean, basis (d, m), x label, y label, feature pair or None)], note).

    d == 3: three views, each a pair of features (x-y, x-z, y-z), so every coordinate is read on an axis
    named after its feature; otherwise the one view of ``_project`` (d > 3: principal components of the
    released CENTERS, never of the data).
    """
    d = centers.shape[1]
    if d == 3:
        eye = np.eye(3)
        return [(np.zeros(3), eye[:, [i, j]], names[i], names[j], (i, j)) for i, j in ((0, 1), (0, 2), (1, 2))], (
            "d = 3: each view is one pair of features (the third is not shown in it); every coordinate is in the "
            "table")
    mean, basis, xlabel, ylabel, note = _project(centers, names)
    if d > 3:
        note += "; every center's coordinates: the table in report.html"
    return [(mean, basis, xlabel, ylabel, (0, 1) if d <= 2 else None)], note


def _set_label(label, text: str, max_px: float, r) -> None:
    """Set an axis label, wrapped between words (or after a '_') to at most ``max_px`` along its direction
    (a rotated y label too); never cut."""
    fig = label.figure
    probe = fig.text(0, 0, "", fontproperties=label.get_fontproperties())
    _wrap(probe, text, max_px, r)
    label.set_text("\n".join(line.strip() for line in probe.get_text().split("\n")))
    probe.remove()


def _center_table_lines(centers, weights, names, formats, chars: int):
    """Lines of a fixed-width table of every released center: '#', its coordinates (see
    ``_coordinate_formats``) and its noisy weight. Columns are headed by the feature names when they are
    short, else by [1], [2], ... with the names in full under the table (wrapped to ``chars``)."""
    k, d = centers.shape
    short = all(len(n) <= 12 for n in names)
    heads = list(names) if short else [f"[{i + 1}]" for i in range(d)]
    cols = [["#"] + [str(i) for i in range(k)]]
    cols += [[heads[j]] + [formats[j](v) for v in centers[:, j]] for j in range(d)]
    cols.append(["weight"] + [_fmt_weight(w) for w in weights])
    widths = [max(len(x) for x in col) for col in cols]
    lines = ["  ".join(col[i].rjust(w) for col, w in zip(cols, widths)) for i in range(k + 1)]
    key = []
    if not short:
        for j, n in enumerate(names):
            key += _wrap_lines(f"[{j + 1}] {n}", max(chars, 12), "    ") or [""]
    return lines, key


def _fit_table(t, title: str, lines: list[str], key: list[str], box_w: float, box_h: float, r,
               sizes=(8.5, 8.0, 7.5, 7.0, 6.5)) -> None:
    """Fit the table ``lines`` (header first) under ``title`` and over ``key`` into ``box_w`` x ``box_h``:
    the largest size at which all of it fits; else, at the largest size whose width fits, the first rows
    and a line saying how many more are in report.html. Rows are never cut or wrapped."""
    def fits(rows):
        t.set_text("\n".join([title] + rows + key))
        e = t.get_window_extent(r)
        return e.width <= box_w, e.height <= box_h

    width_ok = None
    for size in sizes:
        t.set_fontsize(size)
        w_ok, h_ok = fits(lines)
        if w_ok and h_ok:
            return
        if w_ok and width_ok is None:
            width_ok = size
    t.set_fontsize(width_ok or sizes[-1])
    if width_ok is None:  # too wide even in the smallest font: say where the table is
        t.set_text(f"{title}\n(every center's coordinates: report.html)")
        return
    body = lines[1:]
    keep = len(body)
    while keep > 0:
        keep -= 1
        more = f"(+ {len(body) - keep} more: report.html)"
        if fits([lines[0]] + body[:keep] + [more])[1]:
            return
    fits([f"(every center's coordinates: report.html)"])


def _axis_limits(values, mean, b, domain, whole=False):
    """Limits of one axis (the centers' coordinates ``values`` along basis vector ``b``).

    ``whole``: the axis shows the whole domain (and any center outside it): d <= 2 with a public
    domain, where the axes are features and the domain is drawn. Otherwise (a projection, or no
    public domain: ``domain`` is then the centers' own scale) the axis zooms on the centers, except
    when they span less than _ZOOM_MIN of the domain's extent along it: then it shows the whole
    domain, so a speck is not magnified into a spread. Returns (lo, hi, shows_the_domain).
    """
    v = values[np.isfinite(values)]
    c = float((domain["center"] - mean) @ b)
    if domain["half"] is not None:  # a box: its extent along b
        half = float(np.abs(b) @ domain["half"])
    else:  # a ball of the given radius around 0
        half = domain["radius"] * float(np.linalg.norm(b))
    dlo, dhi = c - half, c + half
    if v.size == 0:
        return dlo - 0.05 * half, dhi + 0.05 * half, True
    lo, hi = float(v.min()), float(v.max())
    span = hi - lo
    if whole or span < _ZOOM_MIN * (dhi - dlo):
        lo, hi = min(lo, dlo), max(hi, dhi)
        pad = 0.05 * (hi - lo)
        return lo - pad, hi + pad, True
    return lo - 0.12 * span, hi + 0.12 * span, False


def _draw_centers(fig, r, ax, region, centers, weights, names, diagnostics, domain):
    x0, y0, x1, y1 = region
    k, d = centers.shape
    ax.set_title("(a) released centers, size and color = noisy weight", fontsize=12, loc="left")
    if k == 0:
        _place(ax, x0 + 50, y0 + 40, x1 - 10, y1 - 30)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(0.5, 0.5, "no centers released", ha="center", va="center", transform=ax.transAxes)
        return
    formats = _coordinate_formats(centers, domain)  # original units, for the table (d = 3)
    released = centers
    # Extreme magnitudes (e.g. a public domain like [-1e300, 1e300]) are drawn in units of a power
    # of ten, so no difference, square (projection) or axis limit overflows.
    unit = _drawing_unit(centers, domain)
    public = domain  # in original units, for the footnote
    if unit != 1.0:
        centers = centers / unit
        if domain is not None:
            domain = {"center": domain["center"] / unit, "widths": domain["widths"] / unit,
                      "half": None if domain["half"] is None else domain["half"] / unit,
                      "radius": None if domain["radius"] is None else domain["radius"] / unit}
    views, note = _views(centers, names)
    if unit != 1.0:
        views = [(m, b, f"{xl} (unit {unit:g})", f"{yl} (unit {unit:g})" if yl else yl, dims)
                 for m, b, xl, yl, dims in views]

    # Coinciding centers: one marker with their count and summed weight. Without a public
    # domain in ``info`` the centers' own scale stands in for it (tolerance and axes).
    given_domain = domain is not None
    if domain is None:
        finite = centers[np.all(np.isfinite(centers), axis=1)]
        if not len(finite):
            finite = np.zeros((1, d))
        with np.errstate(over="ignore"):  # ptp of +-1e308 overflows: capped below
            widths = np.maximum(np.ptp(finite, axis=0), np.abs(finite).max(axis=0))
        widths = np.where(widths > 0, np.minimum(widths, np.finfo(np.float64).max), 1.0)
        domain = {"center": finite.mean(axis=0), "half": widths / 2, "radius": None, "widths": widths}
    widths = domain["widths"]
    groups = coinciding_groups(centers, widths, _VISUAL_TOLERANCE)
    first = np.array([g[0] for g in groups])
    counts = np.array([len(g) for g in groups])
    gweights = np.array([float(weights[g].sum()) for g in groups])

    sample = None  # NON-PRIVATE: only when diagnostics were switched on, drawn behind the centers.
    if diagnostics is not None and diagnostics.get("data_sample") is not None:
        sample = np.asarray(diagnostics["data_sample"], dtype=float)
        if sample.ndim == 1:
            sample = sample.reshape(-1, 1)
        if not sample.size or sample.shape[1] != d:
            sample = None
        elif sample.shape[0] > _MAX_SAMPLE:  # deterministic thinning
            sample = sample[:: int(math.ceil(sample.shape[0] / _MAX_SAMPLE))]

    mag = np.abs(gweights)
    top = float(mag.max()) if mag.size and np.isfinite(mag.max()) else 0.0
    # Marker area (points^2) grows with |weight|; smaller markers when there are many (and in small views).
    shrink = 1.0 / math.sqrt(max(1.0, len(groups) / 10.0)) * (0.6 if len(views) > 1 else 1.0)
    sizes = 60.0 * max(shrink, 0.5) + (500.0 * shrink * np.nan_to_num(mag) / top if top > 0 else np.zeros(len(mag)))
    # The colour scale starts at 0 (a negative noisy weight gets the bottom colour): colours are
    # comparable between runs, and a tiny spread of large weights is not stretched over the colormap.
    finite_w = gweights[np.isfinite(gweights)]
    top_w = float(finite_w.max()) if finite_w.size else 0.0
    negative = gweights < 0
    order = np.argsort(-sizes, kind="stable")  # big markers first, small ones on top

    # Axis limits. d <= 3 with a public domain: the axes are features and show the whole domain (drawn as
    # a light dashed outline), so the centers are seen where they lie in it. Otherwise (d > 3: projections;
    # no public domain): the axes zoom on the centers, but a speck is shown within the domain, not magnified.
    whole = given_domain and d <= 3
    axes = [ax] + [fig.add_axes((0.0, 0.0, 0.1, 0.1)) for _ in views[1:]]
    from_domain, points, sc = [], [], None
    for a, (mean, basis, _xl, _yl, dims) in zip(axes, views):
        with np.errstate(invalid="ignore"):  # a non-finite coordinate (never in a release) is not drawn
            proj = (centers[first] - mean) @ basis
        xy = np.column_stack([proj[:, 0], proj[:, 1] if proj.shape[1] > 1 else np.zeros(len(groups))])
        points.append(xy)
        if sample is not None:
            sp = (sample / unit - mean) @ basis
            sy = sp[:, 1] if sp.shape[1] > 1 else np.zeros(len(sp))
            a.scatter(sp[:, 0], sy, s=4, c="0.75", alpha=0.5, linewidths=0, zorder=1,
                      label=f"data sample ({NON_PRIVATE_LABEL})")
        s = a.scatter(
            xy[order, 0], xy[order, 1], s=sizes[order], c=gweights[order], cmap="viridis",
            norm=Normalize(0.0, top_w if top_w > 0 else 1.0, clip=True),
            edgecolors=np.where(negative[order], "red", "black").tolist(),
            linewidths=np.where(negative[order], 2.0, 0.8), zorder=3, label="released center",
        )
        sc = sc or s
        xlo, xhi, fx = _axis_limits(proj[:, 0], mean, basis[:, 0], domain, whole)
        a.set_xlim(xlo, xhi)
        from_domain.append(fx)
        if d == 1:
            a.set_ylim(-1.0, 1.0)
            a.set_yticks([])
        else:
            ylo, yhi, fy = _axis_limits(proj[:, 1], mean, basis[:, 1], domain, whole)
            a.set_ylim(ylo, yhi)
            from_domain.append(fy)
        if whole:
            a.add_patch(_domain_outline(domain, d, dims))
        a.grid(True, alpha=0.3)
    if diagnostics is not None:
        ax.legend(loc="upper right", fontsize=8)

    # Footnotes under the panel (stacked from the bottom of the region).
    footer = []
    if note:
        footer.append(note)
    if whole:
        footer.append(f"dashed outline: the public domain ({_domain_text(public)}); the axes show all of it")
    elif any(from_domain):
        where = "both axes" if all(from_domain) and len(from_domain) == 2 else "an axis"
        footer.append(f"the centers span less than {100 * _ZOOM_MIN:.0f}% of the public domain along {where}: "
                      "it shows the whole domain" if given_domain else
                      f"the centers span almost nothing along {where} (no public domain given): it shows "
                      "their own magnitude around them")
    if (counts > 1).any():
        footer.append(f"#j xN: N released centers at one point (every coordinate within {_VISUAL_TOLERANCE:g} of "
                      "the domain's width), j the first; one marker, their summed weight")
    if negative.any():
        footer.append("red edge / label = negative noisy weight (size uses |weight|, color that of 0)")
    foot = fig.text(x0 / fig.bbox.width, y0 / fig.bbox.height, "", fontsize=9, va="bottom", ha="left",
                    style="italic")
    label_note_index = len(footer)
    footer.append("")  # filled in once the labels are placed (its length is reserved now)
    reserve = (f"labels on {_MAX_LABELS} of {len(groups)} points (heaviest first, where they fit); "
               "all values: report.html")
    _wrap(foot, "\n".join(footer[:-1] + [reserve]), x1 - x0, r)
    foot_h = foot.get_window_extent(r).height

    # Fit the axes and the colorbar into the region above the footnotes.
    cax = fig.add_axes((0.9, 0.1, 0.01, 0.5))
    cbar = fig.colorbar(sc, cax=cax, extend="min" if negative.any() else "neither")  # the arrow: below 0
    cbar.set_label("noisy weight (released)")
    cbar.formatter = FuncFormatter(lambda v, _pos: _fmt_weight(v))  # as the labels: 15,390, not 1.539e+04
    cbar.update_ticks()
    area = (x0, y0 + foot_h + _GAP, x1, y1)
    labels = [(a.set_xlabel(xl), xl, a.set_ylabel(yl), yl) for a, (_m, _b, xl, yl, _d) in zip(axes, views)]

    def set_labels(frac_w, frac_h):
        for a, (xlab, xl, ylab, yl) in zip(axes, labels):
            _set_label(xlab, xl, a.bbox.width if frac_w is None else frac_w, r)
            if yl:
                _set_label(ylab, yl, a.bbox.height if frac_h is None else frac_h, r)

    if len(axes) == 1:
        def place(ix0, iy0, ix1, iy1):
            _place(ax, ix0, iy0, ix1 - 16 - 12, iy1)
            _place(cax, ix1 - 16, iy0, ix1, iy1)

        set_labels(0.8 * (x1 - x0), 0.8 * (area[3] - area[1]))
    else:  # 2 x 2: x-y | x-z over y-z | the table of coordinates; the colorbar at the right
        gaps = [70.0, 60.0]  # room between the cells for the tick and axis labels, measured below

        def cells(ix0, iy0, ix1, iy1):
            gx1 = ix1 - 16 - 12
            cw, ch = (gx1 - ix0 - gaps[0]) / 2, (iy1 - iy0 - gaps[1]) / 2
            return [(ix0, iy1 - ch, ix0 + cw, iy1), (gx1 - cw, iy1 - ch, gx1, iy1), (ix0, iy0, ix0 + cw, iy0 + ch),
                    (gx1 - cw, iy0, gx1, iy0 + ch)]

        def place(ix0, iy0, ix1, iy1):
            for a, cell in zip(axes, cells(ix0, iy0, ix1, iy1)):
                _place(a, *cell)
            _place(cax, ix1 - 16, iy0, ix1, iy1)

        place(*area)
        set_labels(None, None)
    inner = _fit_axes(r, axes + [cax], area, place)
    for _ in range(3 if len(axes) > 1 else 1):
        # Axis labels no longer than the axes they name, the gaps between the views as wide as their
        # decorations, then fit again.
        set_labels(None, None)
        if len(axes) > 1:
            tight = [a.get_tightbbox(r) for a in axes]
            gaps[0] = max(axes[1].bbox.x0 - tight[1].x0, 20.0) + 14
            gaps[1] = max(axes[0].bbox.y0 - tight[0].y0, axes[1].bbox.y0 - tight[1].y0, 20.0) + 14
        inner = _fit_axes(r, axes + [cax], area, place, start=inner)

    if d == 3:  # the fourth cell: every released center's coordinates, rounded (all of them: report.html)
        tx0, _ty0, tx1, ty1 = cells(*inner)[3]
        tx0 -= gaps[0] - 14  # the cell and the gap left of it: nothing else is drawn there
        table = fig.text(tx0 / fig.bbox.width, ty1 / fig.bbox.height, "", ha="left", va="top",
                         family="monospace", fontsize=8.5)
        table.set_text("0" * 10)
        char_w = table.get_window_extent(r).width / 10
        lines, key = _center_table_lines(released, weights, names, formats, int((tx1 - tx0) / max(char_w, 1.0)))
        _fit_table(table, "released centers (original units, rounded)", lines, key, tx1 - tx0, ty1 - area[1], r)

    # Labels: multi-center points first, then by |weight|; each goes where it overlaps nothing. The first
    # view's labels carry the weight, the other views' only the center's number.
    radius = np.sqrt(sizes / math.pi) * fig.dpi / 72.0
    priority = sorted(range(len(groups)), key=lambda g: (counts[g] == 1, -np.nan_to_num(mag[g])))
    labeled = None
    for n, (a, xy) in enumerate(zip(axes, points)):
        pix = a.transData.transform(xy)
        texts = {}
        for g in priority:
            j = int(first[g])
            name = f"#{j}" if counts[g] == 1 else f"#{j} x{counts[g]}"
            texts[g] = f"{name}: {_fmt_weight(gweights[g])}" if n == 0 else name
        obstacles = [lg.get_window_extent(r) for lg in [a.get_legend()] if lg is not None]
        placed = _place_labels(a, r, xy, pix, radius, priority, texts, negative, obstacles, one_d=d == 1)
        labeled = placed if labeled is None else labeled
    if labeled < len(groups):
        footer[label_note_index] = (f"labels on {labeled} of {len(groups)} points (heaviest first, where they "
                                    "fit); all values: report.html")
    else:
        footer.pop(label_note_index)
    _wrap(foot, "\n".join(footer), x1 - x0, r)


# --------------------------------------------------------------------------
# Panel (b): privacy spent per step
# --------------------------------------------------------------------------


def _group_charges(charges, limit=12):
    """Many small charges (e.g. count and sums of every iteration) are grouped by the
    first two words of their step label, so the chart stays readable; totals are exact sums."""
    if len(charges) <= limit:
        return charges
    groups = {}
    for c in charges:
        key = " ".join(str(c.get("step", "?")).split()[:2])
        g = groups.setdefault(key, {"step": key, "epsilon": 0.0, "delta": 0.0, "rules": []})
        g["epsilon"] += float(c.get("epsilon") or 0.0)
        g["delta"] += float(c.get("delta") or 0.0)
        if c.get("rule") and c["rule"] not in g["rules"]:
            g["rules"].append(c["rule"])
    return [{"step": g["step"], "epsilon": g["epsilon"], "delta": g["delta"], "rule": "; ".join(g["rules"]),
             "rules": g["rules"]} for g in groups.values()]


def _charge_rows(charges):
    """At most _MAX_CHARGE_ROWS rows: grouped charges, and the last row sums whatever is left."""
    rows = _group_charges(charges, _MAX_CHARGE_ROWS)
    if len(rows) > _MAX_CHARGE_ROWS:
        rest = rows[_MAX_CHARGE_ROWS - 1:]
        rows = rows[: _MAX_CHARGE_ROWS - 1] + [{
            "step": f"{len(rest)} more steps (all in report.html)",
            "epsilon": sum(float(c.get("epsilon") or 0.0) for c in rest),
            "delta": sum(float(c.get("delta") or 0.0) for c in rest), "rule": ""}]
    return rows


def _row_rules(c) -> list[str]:
    """The composition/mechanism rules of one row of panel (b) (a grouped row has several)."""
    if "rules" in c:
        return [str(x) for x in c["rules"] if x]
    return [str(c["rule"])] if c.get("rule") else []


def _rules_fit(r, probe, values, rules, value_w, two_lines, sizes):
    """The largest font size in ``sizes`` at which every row's rule is written in full in its
    column (under its epsilon and delta, or after them), or None."""
    for size in sizes:
        probe.set_fontsize(size)
        for value, rule in zip(values, rules):
            probe.set_text(rule if two_lines else value + (f"; {rule}" if rule else ""))
            if rule and probe.get_window_extent(r).width > value_w:
                break
        else:
            return size
    return None


def _draw_charges(fig, r, ax, span, charges, max_h=None) -> float:
    """Panel (b) as rows: step label | bar of epsilon | 'eps, delta, rule'. Returns its bottom (pixels).

    A step label is never cut: it is wrapped between words in its column (a row is as tall as its
    label), in a smaller font if the rows would be taller than ``max_h`` pixels. A rule (mechanism,
    composition) is never cut either: it is written in full in its row, in a smaller font if needed, or
    else as a key ("[1]") whose full text is in a legend under the rows.
    """
    x0, x1, top = span
    ax.set_title("(b) privacy spent per step (\u03b5 bar, \u03b5 and \u03b4 written)", fontsize=12, loc="left")
    ax.axis("off")
    rows = _charge_rows(charges)
    two_lines = 0 < len(rows) <= 6
    w = x1 - x0
    label_w, bar_x, bar_w, value_x = 0.44 * w, 0.455 * w, 0.18 * w, 0.65 * w
    value_w = w - value_x - 2
    eps = np.array([float(c.get("epsilon") or 0.0) for c in rows])
    values = [f"\u03b5 = {_fmt_budget(eps[i])}, \u03b4 = {_fmt_budget(c.get('delta', 0.0))}"
              for i, c in enumerate(rows)]
    rules = ["; ".join(_row_rules(c)) for c in rows]
    probe = fig.text(0, 0, "", fontsize=8.5)
    rule_size = _rules_fit(r, probe, values, rules, value_w, two_lines,
                           (8.0, 7.5, 7.0) if two_lines else (8.5, 8.0, 7.5, 7.0))
    legend = []  # distinct rules in order, when they are written as keys
    if rule_size is None:
        for c in rows:
            legend += [x for x in _row_rules(c) if x not in legend]
        rules = [("rule " if c.get("rule") else "") + ", ".join(f"[{legend.index(x) + 1}]" for x in _row_rules(c))
                 for c in rows]
        rule_size = 8.0 if two_lines else 8.5
    probe.set_fontsize(8.5)
    probe.set_text("Ag")
    head_h = probe.get_window_extent(r).height + 6
    probe.remove()
    # The value column of each row: epsilon and delta, and the rule (under them in grey, or after them),
    # wrapped between words to the column (never cut).
    cells = []
    for i in range(len(rows)):
        if two_lines and rules[i]:
            v = ax.text(0, 0, "", ha="left", va="top", fontsize=8.5)
            _wrap(v, values[i], value_w, r, break_words=False)
            rule = ax.text(0, 0, "", ha="left", va="top", fontsize=rule_size, color="0.35")
            _wrap(rule, rules[i], value_w, r, break_words=False)
            cells.append((v, rule))
        else:
            v = ax.text(0, 0, "", ha="left", va="top", fontsize=rule_size if rules[i] else 8.5)
            _wrap(v, values[i] + (f"; {rules[i]}" if rules[i] else ""), value_w, r, break_words=False)
            cells.append((v, None))
    cell_hs = [sum(t.get_window_extent(r).height for t in cell if t is not None) for cell in cells]
    key = None
    if legend:  # under the rows, each rule in full, wrapped between words only
        key = ax.text(0, 0, "", ha="left", va="top", fontsize=8, color="0.25")
        text = "\n".join(f"[{i + 1}] {x}" for i, x in enumerate(legend))
        for size in (8.0, 7.5, 7.0, 6.5):
            key.set_fontsize(size)
            _wrap(key, text, w - 4, r, break_words=False)
            if key.get_window_extent(r).width <= w - 4:
                break
    key_h = key.get_window_extent(r).height + 6 if key is not None else 0.0
    # Step labels wrapped to their column (never cut), in the largest font at which the rows fit ``max_h``.
    labels = [ax.text(0, 0, "", ha="left", va="center") for _ in rows]
    row_hs = []
    for size in (8.5, 8.0, 7.5, 7.0):
        for label, c in zip(labels, rows):
            label.set_fontsize(size)
            _wrap(label, str(c.get("step", "?")), label_w - 4, r, break_words=True)
        row_hs = [max(label.get_window_extent(r).height, h) + 6 for label, h in zip(labels, cell_hs)]
        if max_h is None or head_h + sum(row_hs) + key_h <= max_h:
            break
    height = head_h + (sum(row_hs) if rows else 2 * head_h) + key_h
    # The title sits above the axes: measure how far, so title and axes fit under ``top``.
    _place(ax, x0, top - 40 - height, x1, top - 40)
    title_h = ax.title.get_window_extent(r).y1 - ax.bbox.y1
    _place(ax, x0, top - title_h - 2 - height, x1, top - title_h - 2)
    ax.set_xlim(0, w)
    ax.set_ylim(-height, 0)  # data units are pixels, rows downwards from the top
    if not rows:
        ax.text(w / 2, -height / 2, "no charges recorded", ha="center", va="center", fontsize=10)
        return ax.bbox.y0
    grey = "0.35"
    for x, text in ((0, "step"), (bar_x, "\u03b5 (bar)"),
                    (value_x, "\u03b5, \u03b4; rule" + (" [key below]" if legend else ""))):
        ax.text(x, -head_h / 2, text, ha="left", va="center", fontsize=8.5, color=grey, fontweight="bold")
    biggest = float(eps.max()) if eps.size and eps.max() > 0 else 1.0
    y = -head_h
    bar_h = 0.6 * head_h
    for i in range(len(rows)):
        yc = y - row_hs[i] / 2
        y -= row_hs[i]
        labels[i].set_position((0, yc))
        ax.add_patch(Rectangle((bar_x, yc - bar_h / 2), max(bar_w * eps[i] / biggest, 0.0), bar_h,
                               color="tab:blue", alpha=0.8))
        v, rule = cells[i]  # centred on the row as a block
        v.set_position((value_x, yc + cell_hs[i] / 2))
        if rule is not None:
            rule.set_position((value_x, yc + cell_hs[i] / 2 - v.get_window_extent(r).height))
    if key is not None:
        key.set_position((2, y - 4))
    return ax.bbox.y0



# --------------------------------------------------------------------------
# Panel (c): the run summary (fixed-width text)
# --------------------------------------------------------------------------


def _summary_lines(info, k) -> tuple[list[str], list[str]]:
    """(left column, right column) of panel (c): privacy, ledger, run | parameters, timings."""
    left = [
        "Privacy (this run)",
        f"  spent by this run:      epsilon {_fmt_budget(info.get('epsilon_spent'))}, "
        f"delta {_fmt_budget(info.get('delta_spent'))}",
        f"  configured for the run: epsilon {_fmt_budget(info.get('epsilon_configured'))}, "
        f"delta {_fmt_budget(info.get('delta_configured'))}",
        "",
        "Ledger (this input, all runs incl. this one)",
    ]
    ledger = info.get("ledger")
    if ledger is None:
        left.append("  no ledger configured")
    else:
        for key, label in (("epsilon", "epsilon"), ("delta", "delta  ")):
            spent = ledger.get(f"spent_{key}")
            budget = ledger.get(f"budget_{key}")
            if budget is None:
                left.append(f"  {label} spent {_fmt_budget(spent)} (no budget cap)")
            else:
                left.append(f"  {label} spent {_fmt_budget(spent)} of cap {_fmt_budget(budget)}, "
                            f"remaining {_fmt_budget(_remaining(ledger, key))}")
    left += ["", "Run", f"  k = {info.get('k', k)}, objective = {info.get('objective', '?')}",
             f"  algorithm = {info.get('algorithm', '?')}"]
    source = info.get("domain_source") or {}
    if source.get("source") == "private estimate":
        clipped = source.get("noisy_clipped_fraction") or [0.0]
        left += ["", "Domain: released by this run's private estimate",
                 f"  epsilon {_fmt_budget(source.get('epsilon'))}, delta {_fmt_budget(source.get('delta'))} of the run's",
                 f"  records outside it (noisy, largest over features): {100.0 * max(clipped):.1f}%"]
    degenerate = info.get("degenerate")
    if degenerate:
        left += ["", f"{DEGENERATE_LABEL} (see above)",
                 f"  distinct centers {degenerate.get('distinct_centers', '?')} of k = {degenerate.get('k', '?')}",
                 f"  top weight share {_fmt(degenerate.get('top_weight_share'))}"]
    right = []
    params = info.get("parameters") or {}
    if params:
        right.append("Parameters")
        for key, value in params.items():
            right.append(f"  {key} = {_fmt_param(value)}")
    timings = info.get("timings") or {}
    if timings:
        total = sum(float(v) for v in timings.values() if v is not None)
        right += ["", f"Timings, NON-PRIVATE (total {total:.2f} s)"]
        right += [f"  {step} {float(sec):.2f} s" for step, sec in timings.items() if sec is not None]
    return left, right


def _draw_text(fig, r, ax, region, info, k, diagnostics):
    x0, y0, x1, y1 = region
    ax.axis("off")
    ax.set_title("(c) run summary", fontsize=12, loc="left")
    _place(ax, x0, y0, x1, y1 - 30)
    title_h = ax.title.get_window_extent(r).y1 - ax.bbox.y1
    _place(ax, x0, y0, x1, y1 - title_h - 2)
    box_h = ax.bbox.height
    left_w = 0.56 * (x1 - x0 - 16)
    right_w = x1 - x0 - 16 - left_w
    left_lines, right_lines = _summary_lines(info, k)
    extra = []
    if diagnostics is not None:
        extra = [NON_PRIVATE_LABEL + " (not differentially private)"]
        for key, value in diagnostics.items():
            if key == "data_sample":
                continue
            extra.append(f"  {key} = {_fmt(value) if isinstance(value, (int, float, np.number)) else value}")
    # Left column: the summary, and the red diagnostics under it; right column: parameters, timings.
    main = ax.text(0.0, 1.0, "", transform=ax.transAxes, va="top", ha="left", family="monospace")
    if extra:
        red = ax.text(0.0, 0.0, "", transform=ax.transAxes, va="bottom", ha="left", family="monospace",
                      color="red", fontweight="bold")
        _fit_block(red, extra, left_w, box_h * 0.45, r)
        _fit_block(main, left_lines, left_w, box_h - red.get_window_extent(r).height - _GAP, r)
    else:
        _fit_block(main, left_lines, left_w, box_h, r)
    if right_lines:
        side = ax.text((left_w + 16) / (x1 - x0), 1.0, "", transform=ax.transAxes, va="top", ha="left",
                       family="monospace")
        _fit_block(side, right_lines, right_w, box_h, r)
