"""The words and numbers both report.png and report.html write (``dpspark.report``, ``dpspark.report_html``).

Formatting of released values and public parameters (privacy budgets in %g style, noisy weights,
coordinates rounded to the public domain), the header's lines (input, privacy spent, the ledger), the
warning labels, and the reading of the PUBLIC domain from ``info["domain"]``. numpy only: no matplotlib.
"""

from __future__ import annotations

import json
import math

import numpy as np

NON_PRIVATE_LABEL = "NON-PRIVATE DIAGNOSTICS"
DEGENERATE_LABEL = "DEGENERATE RESULT"


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


def _domain_text(domain) -> str:
    """'box [0, 1000] x [0, 1000]' or 'ball of radius 5 around 0' (PUBLIC, original units)."""
    if domain["radius"] is not None:
        radius = _fmt_budget(domain["radius"])
        return f"ball of radius {radius} around 0" + (f": [-{radius}, {radius}]" if len(domain["widths"]) == 1 else "")
    lo, hi = domain["center"] - domain["half"], domain["center"] + domain["half"]
    return "box " + " x ".join(f"[{_fmt_budget(a)}, {_fmt_budget(b)}]" for a, b in zip(lo, hi))
