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
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import re
import textwrap

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Circle, Rectangle
from matplotlib.text import Text
from matplotlib.ticker import FuncFormatter
from matplotlib.transforms import Bbox

from dpspark.degenerate import coinciding_groups

__all__ = ["write_report", "build_figure", "build_html"]

NON_PRIVATE_LABEL = "NON-PRIVATE DIAGNOSTICS"
DEGENERATE_LABEL = "DEGENERATE RESULT"

_DPI = 90
_FIGSIZE = (16.0, 10.0)  # inches: 1440 x 900 pixels at _DPI
_PAD = 12.0  # pixels between the figure's edge and anything drawn
_GAP = 10.0  # pixels between stacked blocks
# At most this many center labels, at most this many data-sample rows (diagnostics
# only), at most this many rows in panel (b).
_MAX_LABELS = 25
_MAX_SAMPLE = 5000
_MAX_CHARGE_ROWS = 12
# Centers whose every coordinate differs by at most this fraction of the domain's
# width are drawn as one marker with a count. An axis never shows less than
# _ZOOM_MIN of the domain's width, so such centers are under 2 pixels apart.
_VISUAL_TOLERANCE = 1e-4
_ZOOM_MIN = 0.05
_ELLIPSIS = "\u2026"


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
# Formatting and measuring helpers
# --------------------------------------------------------------------------


def _fmt(value) -> str:
    """Short human format for a number (or '-' when missing)."""
    if value is None:
        return "-"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.4g}"


def _fmt_budget(value, digits: int = 6) -> str:
    """A privacy-budget number (epsilon or delta: spent, configured, a cap, what remains, one step's charge)
    in %g style with at most ``digits`` significant digits (6 in the figure, 12 in report.html), so float
    noise never shows: 1e-05 - 2e-06 reads ``8e-06``, not ``8.000000000000001e-06``."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    text = f"{v:.{digits}g}"
    return "0" if text == "-0" else text


def _fmt_param(value, digits: int = 6) -> str:
    """A public parameter's value: text as it is, true/false, integers whole, floats in %g style (no float
    noise: see ``_fmt_budget``), anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return _fmt_budget(value, digits)
    return json.dumps(value, default=str)


def _remaining(ledger, key):
    """What the ledger's cap in force leaves for the input (``remaining_<key>`` as the runner gives it, else
    cap - spent), or None without a cap."""
    budget = ledger.get(f"budget_{key}")
    if budget is None:
        return None
    remaining = ledger.get(f"remaining_{key}")
    spent = ledger.get(f"spent_{key}")
    if remaining is None and spent is not None:
        remaining = float(budget) - float(spent)
    return remaining


def _coordinate_formats(centers: np.ndarray, domain) -> list:
    """Per feature, a function writing a center's coordinate rounded to about 1e-4 of the feature's width
    (the PUBLIC domain's, else the centers' own spread or magnitude): ``0.2741`` in [-1, 1], ``431.2`` in
    [0, 1000], ``123457`` in [0, 1e6]; %g style (6 digits) when the width is not finite or the value huge."""
    d = centers.shape[1]
    if domain is not None:
        widths = np.asarray(domain["widths"], dtype=float)
    else:
        finite = centers[np.all(np.isfinite(centers), axis=1)] if centers.size else np.zeros((0, d))
        if not len(finite):
            finite = np.zeros((1, d))
        with np.errstate(over="ignore", invalid="ignore"):
            widths = np.maximum(np.ptp(finite, axis=0), np.abs(finite).max(axis=0))
    formats = []
    for w in widths:
        decimals = None
        if math.isfinite(w) and w > 0:
            decimals = max(0, math.ceil(-math.log10(w * 1e-4) - 1e-9))
            if decimals > 12:
                decimals = None

        def write(v, decimals=decimals):
            v = float(v)
            if not math.isfinite(v) or decimals is None or abs(v) >= 1e15:
                return _fmt_budget(v)
            text = f"{v:.{decimals}f}"
            return text.lstrip("-") if float(text) == 0 else text

        formats.append(write)
    return formats


def _fmt_weight(value) -> str:
    """A noisy weight (a noisy count: may be negative) for reading, the same in the figure and the html.

    Thousands are grouped and there is no exponent below 1e15: ``15,390``, ``-3``, ``12.5``,
    ``0.25``; from 100 on, whole numbers (the noise is far above a fraction of a count).
    """
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "-" if value is None else str(value)
    if not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    a = abs(v)
    if a >= 1e15:
        text = f"{v:.3g}"
    elif a >= 100:
        text = f"{v:,.0f}"
    elif a >= 1:
        text = f"{v:.3g}"
    else:
        text = f"{v:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def _place(ax, x0, y0, x1, y1) -> None:
    """Put ``ax`` at the pixel box (x0, y0, x1, y1) of its figure."""
    W, H = ax.figure.bbox.width, ax.figure.bbox.height
    ax.set_position((x0 / W, y0 / H, max(x1 - x0, 1.0) / W, max(y1 - y0, 1.0) / H))


def _ellipsize(t, text: str, max_px: float, r, keep: str = "start") -> None:
    """Set ``t``'s one-line text, shortened with an ellipsis until it is at most ``max_px`` wide."""
    text = str(text).replace("\n", " ")
    t.set_text(text)
    if t.get_window_extent(r).width <= max_px:
        return
    lo, hi = 0, len(text)  # binary search on the number of characters kept
    while lo < hi:
        mid = (lo + hi + 1) // 2
        t.set_text(_cut(text, mid, keep))
        if t.get_window_extent(r).width <= max_px:
            lo = mid
        else:
            hi = mid - 1
    t.set_text(_cut(text, lo, keep))


def _cut(text: str, n: int, keep: str) -> str:
    """``text`` shortened to ``n`` of its characters and an ellipsis: keep its "start", its "end",
    or both ends ("middle": the ellipsis replaces the middle, e.g. of a path)."""
    if n >= len(text):
        return text
    if keep == "end":
        return _ELLIPSIS + text[len(text) - n:]
    if keep == "middle":
        tail = n // 2
        return text[: n - tail] + _ELLIPSIS + (text[len(text) - tail:] if tail else "")
    return text[:n].rstrip() + _ELLIPSIS


class _Wrapper(textwrap.TextWrapper):
    """textwrap that may also break a line after '_' (long snake_case names wrap between their parts)."""

    def _split(self, text):
        return [part for chunk in super()._split(text) for part in re.split(r"(?<=_)(?=[^_\s])", chunk) if part]


def _wrap_lines(text: str, width: int, indent: str = "", break_words: bool = True) -> list[str]:
    return _Wrapper(width=width, subsequent_indent=indent, break_on_hyphens=False,
                    break_long_words=break_words).wrap(text)


def _wrap(t, text: str, max_px: float, r, max_lines: int | None = None, break_words: bool = True) -> None:
    """Set ``t``'s text wrapped at spaces (a long word is broken unless ``break_words`` is False) so no
    line is wider than ``max_px`` (without breaking words, a word wider than that stays whole).

    Each input line keeps its indentation (continuation lines get two more spaces). Beyond
    ``max_lines`` lines the text is cut and the last kept line ends with an ellipsis.
    """
    paragraphs = str(text).split("\n")
    t.set_text("\n".join(paragraphs))
    extent = t.get_window_extent(r)
    if extent.width <= max_px and (max_lines is None or len(paragraphs) <= max_lines):
        return
    longest = max(len(p) for p in paragraphs) or 1
    width = max(4, int(longest * max_px / max(extent.width, 1.0)) + 1)
    while True:
        lines = []
        for p in paragraphs:
            indent = p[: len(p) - len(p.lstrip())]
            lines += _wrap_lines(p, width, indent + "  ", break_words) or [""]
        if max_lines is not None and len(lines) > max_lines:
            lines = lines[:max_lines]
            lines[-1] = _cut(lines[-1], max(len(lines[-1]) - 2, 1), "start")
        t.set_text("\n".join(lines))
        if t.get_window_extent(r).width <= max_px or width <= 4:
            return
        width -= max(1, width // 25)


def _fit_block(t, lines: list[str], box_w: float, box_h: float, r, sizes=(8.5, 8.0, 7.5, 7.0, 6.5),
               unwrapped_min: float = 7.5) -> None:
    """Fit text lines into a box of ``box_w`` x ``box_h`` pixels.

    First choice: the largest size down to ``unwrapped_min`` at which every line fits as it
    is; else the largest size at which the lines, wrapped to the width, fit the height; at
    the smallest size, lines are dropped from the end (a last line says where the rest is).
    """
    text = "\n".join(lines)
    for size in sizes:
        if size < unwrapped_min:
            break
        t.set_fontsize(size)
        t.set_text(text)
        e = t.get_window_extent(r)
        if e.width <= box_w and e.height <= box_h:
            return
    for size in sizes:
        t.set_fontsize(size)
        _wrap(t, text, box_w, r)
        if t.get_window_extent(r).height <= box_h:
            return
    keep = len(lines)
    while keep > 1:
        keep -= 1
        _wrap(t, "\n".join(lines[:keep] + ["  ... (the rest: report.html)"]), box_w, r)
        if t.get_window_extent(r).height <= box_h:
            return


def _overlaps(a, b, slack: float = 1.0) -> bool:
    return a.x0 < b.x1 - slack and b.x0 < a.x1 - slack and a.y0 < b.y1 - slack and b.y0 < a.y1 - slack


def _inside(a, box) -> bool:
    return a.x0 >= box.x0 and a.x1 <= box.x1 and a.y0 >= box.y0 and a.y1 <= box.y1


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


def _spent_text(info, digits: int = 6) -> str:
    """What this run spent, and what it was configured to spend (both PUBLIC: charged totals and config)."""
    f = lambda key: _fmt_budget(info.get(key), digits)  # noqa: E731
    return (f"privacy spent by this run: \u03b5 = {f('epsilon_spent')}, \u03b4 = {f('delta_spent')} "
            f"(configured for the run: \u03b5 = {f('epsilon_configured')}, \u03b4 = {f('delta_configured')})")


def _ledger_text(ledger, digits: int = 6) -> str:
    """The input's balance in the ledger (all runs on it, this one included), apart from this run's spend.

    ``ledger`` is the runner's ``_ledger_view``: spent_* (the input's totals), budget_* (the cap in force
    for this run: the ledger's, or the run's lower request; None: no cap) and ledger_cap_* (the ledger's
    own cap), or None when no ledger is configured.
    """
    if not isinstance(ledger, dict):
        return "ledger: none configured (nothing records or caps what runs on this input spend)"
    parts = []
    for key, symbol in (("epsilon", "\u03b5"), ("delta", "\u03b4")):
        spent, cap, own = ledger.get(f"spent_{key}"), ledger.get(f"budget_{key}"), ledger.get(f"ledger_cap_{key}")
        if cap is None:
            parts.append(f"spent {symbol} = {_fmt_budget(spent, digits)} (no cap)")
            continue
        text = f"spent {symbol} = {_fmt_budget(spent, digits)} of cap {_fmt_budget(cap, digits)}"
        if own is not None and _fmt_budget(own, 12) != _fmt_budget(cap, 12):
            text += f" (lowered for this run; the ledger's cap is {_fmt_budget(own, digits)})"
        parts.append(text)
    return "ledger for this input (all runs, this one included): " + ", ".join(parts)


def _input_parts(source):
    """(path, details, where) of ``info["input"]``, or None when it is missing (older callers).

    ``source`` is PUBLIC configuration: path, format, the Delta version read (None: not given) and
    the row filter ``where`` (None: all rows).
    """
    if not isinstance(source, dict) or not source.get("path"):
        return None
    details = [str(source["format"])] if source.get("format") else []
    if source.get("version") is not None:
        details.append(f"version {source['version']}")
    where = source.get("where")
    where = " ".join(str(where).split()) if where is not None else ""  # one line
    return str(source["path"]), (f" ({', '.join(details)})" if details else ""), where


def _input_line(path, details, where) -> str:
    """'input: PATH (delta, version 7); rows where WHERE' (or '; all rows (no row filter)')."""
    return f"input: {path}{details}; " + (f"rows where {where}" if where else "all rows (no row filter)")


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


def _domain(dom, d: int):
    """The PUBLIC domain from ``info["domain"]``: (center, half widths) of a box, or (0, radius) of a ball."""
    if not isinstance(dom, dict):
        return None
    try:
        if dom.get("radius") is not None:
            radius = float(dom["radius"])
            if math.isfinite(2 * radius) and radius > 0:
                return {"center": np.zeros(d), "half": None, "radius": radius, "widths": np.full(d, 2 * radius)}
        elif dom.get("lower") is not None and dom.get("upper") is not None:
            lo = np.asarray(dom["lower"], dtype=float).reshape(-1)
            hi = np.asarray(dom["upper"], dtype=float).reshape(-1)
            with np.errstate(over="ignore"):
                ok = lo.shape == hi.shape == (d,) and np.all(np.isfinite(lo) & np.isfinite(hi) & (hi > lo)
                                                              & np.isfinite(hi - lo))
            if ok:  # (a box whose width overflows is left out: the centers' own scale is used)
                return {"center": (lo + hi) / 2, "half": (hi - lo) / 2, "radius": None, "widths": hi - lo}
    except (TypeError, ValueError):
        pass
    return None


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


def _domain_text(domain) -> str:
    """'box [0, 1000] x [0, 1000]' or 'ball of radius 5 around 0' (PUBLIC, original units)."""
    if domain["radius"] is not None:
        radius = _fmt_budget(domain["radius"])
        return f"ball of radius {radius} around 0" + (f": [-{radius}, {radius}]" if len(domain["widths"]) == 1 else "")
    lo, hi = domain["center"] - domain["half"], domain["center"] + domain["half"]
    return "box " + " x ".join(f"[{_fmt_budget(a)}, {_fmt_budget(b)}]" for a, b in zip(lo, hi))


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


def _fit_axes(r, axes, region, place, start=None):
    """Shrink the inner box given to ``place`` until the tight bbox of ``axes`` (tick labels, axis
    labels, titles, colorbar) lies inside ``region`` (pixels). Returns the inner box."""
    x0, y0, x1, y1 = region
    inner = list(start or region)
    for _ in range(6):
        place(*inner)
        tight = Bbox.union([a.get_tightbbox(r) for a in axes])
        if tight.x0 >= x0 and tight.x1 <= x1 and tight.y0 >= y0 and tight.y1 <= y1:
            break
        # Decorations stick out of the inner box by these margins: shrink the box by them.
        margins = (inner[0] - tight.x0, inner[1] - tight.y0, tight.x1 - inner[2], tight.y1 - inner[3])
        inner = [x0 + max(margins[0], 0) + 1, y0 + max(margins[1], 0) + 1,
                 x1 - max(margins[2], 0) - 1, y1 - max(margins[3], 0) - 1]
        inner[2] = max(inner[2], inner[0] + 60)
        inner[3] = max(inner[3], inner[1] + 60)
    return inner


def _place_labels(ax, r, xy, pix, radius, priority, texts, negative, obstacles, one_d=False) -> int:
    """Label the points in ``priority`` order; at most _MAX_LABELS. Returns how many were placed.

    Each label goes to the first candidate spot inside the axes that overlaps no other label;
    spots that overlap no other marker are tried first, then spots that cover no other
    marker's centre. With one feature (all points on y = 0) the spots are rows above and
    below the line, joined to their point by a thin leader line.
    """
    box = ax.bbox.padded(-2)
    placed = list(obstacles)
    markers = [Bbox.from_extents(x - rr, y - rr, x + rr, y + rr) for (x, y), rr in zip(pix, radius)]
    count = 0
    for g in priority:
        if count >= _MAX_LABELS:
            break
        if not np.all(np.isfinite(pix[g])):
            continue
        rr = radius[g] + 3
        if one_d:
            spots = [(0, sign * (rr + 16 * level), "center", "bottom" if sign > 0 else "top")
                     for level in range(8) for sign in (1, -1)]
        else:
            spots = [(rr, 0, "left", "center"), (-rr, 0, "right", "center"), (0, rr, "center", "bottom"),
                     (0, -rr, "center", "top"), (rr * 0.7, rr * 0.7, "left", "bottom"),
                     (-rr * 0.7, rr * 0.7, "right", "bottom"), (rr * 0.7, -rr * 0.7, "left", "top"),
                     (-rr * 0.7, -rr * 0.7, "right", "top")]
        style = dict(textcoords="offset pixels", fontsize=8, color="red" if negative[g] else "black", zorder=5,
                     annotation_clip=False,
                     bbox=dict(boxstyle="square,pad=0.1", facecolor="white", edgecolor="none", alpha=0.75))
        t = ax.annotate(texts[g], xy=(xy[g, 0], xy[g, 1]), xytext=(0, 0), **style)
        others = [m for i, m in enumerate(markers) if i != g]
        centres = [p for i, p in enumerate(pix) if i != g]
        chosen = None
        for strict in (True, False):
            for spot in spots:
                dx, dy, ha, va = spot
                t.set_position((dx, dy))
                t.set_horizontalalignment(ha)
                t.set_verticalalignment(va)
                e = t.get_window_extent(r)
                if not _inside(e, box) or any(_overlaps(e, p) for p in placed):
                    continue
                if one_d and abs(dy) > rr:  # the leader line's column must be free as well
                    x, y = pix[g]
                    leader = Bbox.from_extents(x - 1, min(y, e.y1), x + 1, max(y, e.y0))
                    if any(_overlaps(leader, p, slack=0) for p in placed):
                        continue
                if strict and any(_overlaps(e, m) for m in others):
                    continue
                if not strict and any(e.padded(2).contains(px, py) for px, py in centres):
                    continue
                chosen = spot
                break
            if chosen is not None:
                break
        if chosen is None:
            t.remove()
            continue
        if one_d and abs(chosen[1]) > rr:  # a leader line from a higher row down to the point
            t.remove()
            t = ax.annotate(texts[g], xy=(xy[g, 0], xy[g, 1]), xytext=chosen[:2], ha=chosen[2], va=chosen[3],
                            arrowprops=dict(arrowstyle="-", color="0.55", lw=0.6, shrinkA=0, shrinkB=rr - 3),
                            **style)
        t.update_positions(r)
        placed.append(Text.get_window_extent(t, r).padded(2))  # the text (not its leader) and its white box
        if one_d and abs(chosen[1]) > rr:
            x, y = pix[g]
            placed.append(Bbox.from_extents(x - 1, min(y, placed[-1].y1), x + 1, max(y, placed[-1].y0)))
        count += 1
    return count


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


# --------------------------------------------------------------------------
# HTML page
# --------------------------------------------------------------------------


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def build_html(info: dict, png: bytes | None = None) -> str:
    """``report.html`` for one run: ``png`` (report.png's bytes) inlined, then tables of released values.

    Post-processing of the same ``info`` as :func:`build_figure`; every value is HTML-escaped. The
    input line, the privacy spent and the ledger read as in the figure's header, in full.
    Diagnostics (non-private) are shown only when present, under a red NON-PRIVATE banner;
    a degenerate result (``info["degenerate"]``) is a red warning at the top.
    """
    centers = np.asarray(info.get("centers") or [], dtype=float)
    weights = [float(w) for w in (info.get("noisy_weights") or [])]
    names = [str(f) for f in (info.get("feature_names") or [])]
    if centers.ndim == 2 and len(names) != centers.shape[1]:
        names = [f"x{i}" for i in range(centers.shape[1])]
    title = (f"dpspark run {info.get('run_id', '?')}: {info.get('algorithm', '?')}, "
             f"{info.get('objective', '?')}, k = {info.get('k', len(weights))}")
    parts = [f"<h1>{html.escape(title)}</h1>"]
    source = _input_parts(info.get("input"))
    if source is not None:  # in full (the figure may shorten it)
        parts.append(f"<p class='input'>{html.escape(_input_line(*source))}</p>")
    parts += [f"<p class='spent'>{html.escape(_spent_text(info, 12))}</p>",
              f"<p class='spent'>{html.escape(_ledger_text(info.get('ledger'), 12))}</p>"]
    if info.get("seed_note"):
        parts.append(f"<p class='warn'>{html.escape(str(info['seed_note']))}</p>")
    degenerate = info.get("degenerate")
    if degenerate:
        parts.append(f"<div class='degenerate'><p class='warn'>{DEGENERATE_LABEL}: "
                     f"{html.escape(str(degenerate.get('message', '')))}</p>"
                     f"<p>Likely cause: {html.escape(str(degenerate.get('likely_cause', '')))}</p>"
                     f"<p>distinct centers: {html.escape(_fmt(degenerate.get('distinct_centers')))} of "
                     f"k = {html.escape(_fmt(degenerate.get('k')))}; share of the positive noisy weight on the "
                     f"heaviest center: {html.escape(_fmt(degenerate.get('top_weight_share')))}</p></div>")
    diagnostics = info.get("diagnostics")
    if diagnostics is not None:
        parts.append(f"<p class='warn'>{NON_PRIVATE_LABEL}: computed from the data, do not publish</p>")
    if png:
        parts.append(f"<img alt='report.png' src='data:image/png;base64,{base64.b64encode(png).decode()}'>")
    flat = centers.reshape(len(weights), -1)
    formats = _coordinate_formats(flat, _domain(info.get("domain"), flat.shape[1]))
    rows = [[i, *(f(v) for f, v in zip(formats, c)), _fmt_weight(w)] for i, (c, w) in enumerate(zip(flat, weights))]
    parts += ["<h2>Released centers (original units) and noisy weights</h2>",
              "<p>Coordinates rounded to about 1/10,000 of each feature's width (the public domain's, else the "
              "centers' own spread); the exact values are in summary.json and the centers table.</p>",
              _table(["cluster", *names, "noisy weight"], rows)]
    source = info.get("domain_source") or {}
    if source.get("source") == "private estimate":
        clipped = list(source.get("noisy_clipped_fraction") or [])
        parts += ["<h2>Domain released by this run's private estimate</h2>",
                  f"<p>epsilon {html.escape(_fmt_budget(source.get('epsilon'), 12))}, delta "
                  f"{html.escape(_fmt_budget(source.get('delta'), 12))} of this run's charge; outer box: "
                  f"{html.escape(str(source.get('outer')))}. The share of records outside is a NOISY (released) "
                  "number.</p>",
                  _table(["feature", "lower", "upper", "records outside (noisy)"],
                         [[n, _fmt(lo), _fmt(hi), f"{100.0 * c:.1f}%"] for n, lo, hi, c in
                          zip(names or [f"x{i}" for i in range(len(clipped))], source.get("lower") or [],
                              source.get("upper") or [], clipped)])]
    charges = info.get("charges") or []
    parts += ["<h2>Privacy charges</h2>",
              _table(["step", "epsilon", "delta", "rule"],
                     [[c.get("step", ""), _fmt_budget(c.get("epsilon"), 12), _fmt_budget(c.get("delta"), 12),
                       c.get("rule", "")] for c in charges])]
    ledger = info.get("ledger")
    parts.append("<h2>Ledger (this input, all runs including this one)</h2>")
    if ledger is None:
        parts.append("<p>no ledger configured</p>")
    else:
        lrows = []
        for key in ("epsilon", "delta"):
            budget = ledger.get(f"budget_{key}")
            lrows.append([key, _fmt_budget(ledger.get(f"spent_{key}"), 12),
                          "no cap" if budget is None else _fmt_budget(budget, 12),
                          _fmt_budget(ledger.get(f"ledger_cap_{key}"), 12), _fmt_budget(_remaining(ledger, key), 12)])
        parts.append(_table(["", "spent (all runs on this input)", "cap for this run", "the ledger's cap",
                             "remaining"], lrows))
    params = info.get("parameters") or {}
    parts += ["<h2>Parameters (public)</h2>",
              _table(["key", "value"], [[k, _fmt_param(v, 12)] for k, v in params.items()])]
    timings = info.get("timings") or {}
    if timings:  # wall times grow with n: the runner passes them only with non-private diagnostics
        parts += ["<h2 class='warn'>Timings (NON-PRIVATE: wall times depend on the data)</h2>",
                  _table(["step", "seconds"], [[k, f"{float(v):.2f}"] for k, v in timings.items() if v is not None])]
    if diagnostics is not None:
        parts += [f"<h2 class='warn'>{NON_PRIVATE_LABEL} (not differentially private)</h2>",
                  _table(["key", "value"], [[k, _fmt(v) if isinstance(v, (int, float, np.number)) else v]
                                            for k, v in diagnostics.items() if k != "data_sample"])]
    style = ("body{font-family:sans-serif;margin:2em;max-width:1200px} table{border-collapse:collapse;margin:0.5em 0 1.5em}"
             " td,th{border:1px solid #bbb;padding:3px 8px;text-align:left;font-size:13px;overflow-wrap:anywhere}"
             " img{max-width:100%;height:auto} .warn{color:#b00;font-weight:bold} .spent{font-size:18px;margin:0.3em 0}"
             " .input{font-size:16px;overflow-wrap:anywhere}"
             " .degenerate{border:2px solid #c00;background:#fff0f0;padding:0 1em;margin:1em 0}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")
