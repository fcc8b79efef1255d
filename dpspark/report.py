"""report.png: the figure a person looks at first after a run.

It draws ONLY released (public) values: the released centers and their noisy
weights, the privacy charges, the ledger totals, and the run's public
parameters. Drawing them is post-processing: no privacy cost. The one
exception is ``info["diagnostics"]``: non-private diagnostics (a sample of the
data, the true cost) that a user switched on explicitly; when present they are
drawn and the figure says "NON-PRIVATE DIAGNOSTICS" in red.

For d > 2 the centers are projected onto the first two principal components
of the released CENTERS themselves (numpy SVD), never of the data, so the
projection is post-processing of released values too.

Uses ``matplotlib.figure.Figure`` with the Agg canvas directly: no pyplot, so
no global figure state leaks between runs or tests.

Public API: ``write_report(path, info)``; ``build_figure(info)`` returns the
Figure (used by tests to inspect its texts); ``build_html(info, png)`` returns
``report.html``: the same figure inlined, and the released values as tables
(every center with its noisy weight, every charge, the ledger, parameters,
timings) that a person can read, search and copy.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

__all__ = ["write_report", "build_figure", "build_html"]

NON_PRIVATE_LABEL = "NON-PRIVATE DIAGNOSTICS"

# At most this many centers get a text label, and at most this many data-sample
# rows are drawn (diagnostics only), so the figure stays readable and fast.
_MAX_LABELS = 30
_MAX_SAMPLE = 5000
_MAX_PARAMETERS = 14


def write_report(path, info: dict) -> None:
    """Write ``report.png`` for one run to ``path``. Post-processing: no privacy cost.

    ``info`` holds released values only (see ``build_figure``); parent
    directories are created if missing.
    """
    fig = build_figure(info)
    parent = os.path.dirname(os.fspath(path))
    if parent:
        os.makedirs(parent, exist_ok=True)
    fig.savefig(path, format="png", dpi=90)


def build_figure(info: dict) -> Figure:
    """Build the report Figure from ``info`` (released values). Post-processing: no privacy cost.

    Keys: run_id, algorithm, objective, k, epsilon_spent, delta_spent,
    epsilon_configured, delta_configured, centers (k lists, original units),
    noisy_weights (k floats), feature_names, charges (dicts: step, epsilon,
    delta, rule), ledger (None or dict: spent_epsilon, spent_delta,
    budget_epsilon, budget_delta), parameters (dict), timings (step -> s),
    seed_note (None or str), diagnostics (None or dict, NON-PRIVATE: e.g.
    true_cost, data_sample (m, d) in original units).

    Panels: (a) centers sized and colored by noisy weight; (b) epsilon per
    charged step; (c) text: privacy spent vs configured, ledger, parameters,
    timings.
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

    fig = Figure(figsize=(15, 8.5))
    FigureCanvasAgg(fig)  # attach the Agg canvas explicitly (no pyplot)
    grid = fig.add_gridspec(2, 2, width_ratios=[1.15, 1.0], height_ratios=[1.0, 1.35],
                            left=0.06, right=0.97, top=0.84, bottom=0.11, wspace=0.22, hspace=0.32)
    ax_centers = fig.add_subplot(grid[:, 0])
    ax_charges = fig.add_subplot(grid[0, 1])
    ax_text = fig.add_subplot(grid[1, 1])

    # Title block.
    title = (
        f"dpspark run {info.get('run_id', '?')}: {info.get('algorithm', '?')}, "
        f"{info.get('objective', '?')}, k = {info.get('k', centers.shape[0])}"
    )
    fig.text(0.06, 0.955, title, fontsize=15, fontweight="bold", ha="left", va="center")
    fig.text(
        0.06, 0.915,
        f"privacy spent: \u03b5 = {_fmt(info.get('epsilon_spent'))} of {_fmt(info.get('epsilon_configured'))}, "
        f"\u03b4 = {_fmt(info.get('delta_spent'))} of {_fmt(info.get('delta_configured'))}",
        fontsize=11, ha="left", va="center",
    )
    seed_note = info.get("seed_note")
    if seed_note:
        text = str(seed_note)
        if "not private" not in text.lower():
            text += "\n(fixed seed: testing aid, NOT private)"
        fig.text(
            0.97, 0.955, text,
            color="red", fontsize=12, fontweight="bold", ha="right", va="center",
        )
    if diagnostics is not None:
        fig.text(
            0.97, 0.9, NON_PRIVATE_LABEL + ": data drawn, do not publish",
            color="white", fontsize=12, fontweight="bold", ha="right", va="center",
            bbox=dict(facecolor="red", edgecolor="red", boxstyle="round,pad=0.3"),
        )

    _draw_centers(ax_centers, centers, weights, names, diagnostics)
    _draw_charges(ax_charges, info.get("charges") or [])
    _draw_text(ax_text, info, centers.shape[0], diagnostics)
    return fig


# --------------------------------------------------------------------------
# Panels
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


def _project(centers: np.ndarray, names: list[str]):
    """2-D coordinates of the centers, axis labels, a note, and the projector.

    d == 1: (x, 0); d == 2: the two features; d > 2: the first two principal
    components of the released CENTERS (never the data).
    """
    k, d = centers.shape
    if d == 1:
        return (lambda a: np.column_stack([a[:, 0], np.zeros(a.shape[0])])), names[0], "(1 feature: drawn at y = 0)", ""
    if d == 2:
        return (lambda a: a[:, :2]), names[0], names[1], ""
    mean = centers.mean(axis=0) if k else np.zeros(d)
    # full_matrices=True always gives d right singular vectors, even for k < 2.
    _, s, vt = np.linalg.svd(centers - mean, full_matrices=True)
    basis = vt[:2].T  # (d, 2)
    var = s**2
    share = var / var.sum() if var.sum() > 0 else np.zeros_like(var)
    shares = [share[i] if i < share.shape[0] else 0.0 for i in range(2)]
    note = f"d = {d}: projected onto the first 2 principal components of the released centers (not of the data)"
    return (
        (lambda a: (a - mean) @ basis),
        f"PC1 of released centers ({100 * shares[0]:.0f}% of their variance)",
        f"PC2 of released centers ({100 * shares[1]:.0f}% of their variance)",
        note,
    )


def _draw_centers(ax, centers, weights, names, diagnostics):
    k = centers.shape[0]
    ax.set_title("(a) released centers, size and color = noisy weight", fontsize=12, loc="left")
    if k == 0:
        ax.text(0.5, 0.5, "no centers released", ha="center", va="center", transform=ax.transAxes)
        return
    project, xlabel, ylabel, note = _project(centers, names)
    xy = project(centers)

    # NON-PRIVATE: only when diagnostics were switched on, drawn behind the centers.
    if diagnostics is not None and diagnostics.get("data_sample") is not None:
        sample = np.asarray(diagnostics["data_sample"], dtype=float)
        if sample.ndim == 1:
            sample = sample.reshape(-1, 1)
        if sample.size and sample.shape[1] == centers.shape[1]:
            if sample.shape[0] > _MAX_SAMPLE:  # deterministic thinning
                sample = sample[:: int(math.ceil(sample.shape[0] / _MAX_SAMPLE))]
            sxy = project(sample)
            ax.scatter(sxy[:, 0], sxy[:, 1], s=4, c="0.75", alpha=0.5, linewidths=0, zorder=1,
                       label=f"data sample ({NON_PRIVATE_LABEL})")

    mag = np.abs(weights)
    top = float(mag.max()) if mag.size else 0.0
    sizes = 60.0 + (500.0 * mag / top if top > 0 else 0.0)
    lo, hi = float(weights.min()), float(weights.max())
    if hi <= lo:  # all equal (e.g. all zero): widen so the colormap is defined
        lo, hi = lo - 0.5, hi + 0.5
    negative = weights < 0
    sc = ax.scatter(
        xy[:, 0], xy[:, 1], s=sizes, c=weights, cmap="viridis", norm=Normalize(lo, hi),
        edgecolors=np.where(negative, "red", "black").tolist(), linewidths=np.where(negative, 2.0, 0.8),
        zorder=3, label="released center",
    )
    cbar = ax.figure.colorbar(sc, ax=ax, fraction=0.04, pad=0.02)
    cbar.set_label("noisy weight (released)")

    # Label the heaviest centers with their index and signed noisy weight.
    # With d == 1 all centers share y = 0, so the labels are staggered upwards.
    stagger = centers.shape[1] == 1
    for rank, j in enumerate(np.argsort(-mag, kind="stable")[:_MAX_LABELS]):
        dy = 8 + 13 * (rank % 6) if stagger else 6
        ax.annotate(
            f"#{j}: {weights[j]:+.4g}", (xy[j, 0], xy[j, 1]), xytext=(6, dy), textcoords="offset points",
            arrowprops=dict(arrowstyle="-", color="0.5", lw=0.5) if stagger else None,
            fontsize=8, color="red" if negative[j] else "black", zorder=4,
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if centers.shape[1] == 1:
        ax.set_yticks([])
        ax.set_ylim(-1.0, 1.0)
    ax.grid(True, alpha=0.3)
    ax.margins(0.12)
    footer = []
    if note:
        footer.append(note)
    if negative.any():
        footer.append("red edge / label = negative noisy weight (size uses |weight|)")
    if k > _MAX_LABELS:
        footer.append(f"labels on the {_MAX_LABELS} heaviest of {k} centers")
    if footer:  # below panel (a), in figure coordinates
        ax.figure.text(0.06, 0.012, "\n".join(footer), fontsize=9, va="bottom", ha="left", style="italic")
    if diagnostics is not None:
        ax.legend(loc="upper right", fontsize=8)


def _short(text: str, limit: int) -> str:
    """Shorten a label for the figure, keeping its end (the full text is in summary.json)."""
    return text if len(text) <= limit else "\u2026" + text[-(limit - 1):]


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
    return [{"step": g["step"], "epsilon": g["epsilon"], "delta": g["delta"], "rule": "; ".join(g["rules"])}
            for g in groups.values()]


def _draw_charges(ax, charges):
    ax.set_title("(b) privacy spent per step (\u03b5; \u03b4 in labels)", fontsize=12, loc="left")
    charges = _group_charges(charges)
    if not charges:
        ax.text(0.5, 0.5, "no charges recorded", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    steps = [_short(str(c.get("step", "?")), 24) for c in charges]
    eps = np.array([float(c.get("epsilon") or 0.0) for c in charges])
    y = np.arange(len(charges))
    ax.barh(y, eps, color="tab:blue", alpha=0.8)
    ax.set_yticks(y, labels=steps, fontsize=8 if len(charges) > 12 else 9)
    ax.invert_yaxis()  # first step on top
    ax.set_xlabel("epsilon")
    top = float(eps.max()) if eps.size else 0.0
    ax.set_xlim(0, top * 1.9 if top > 0 else 1.0)
    for yi, c, e in zip(y, charges, eps):
        rule = c.get("rule")
        label = f"\u03b5={_fmt(e)}, \u03b4={_fmt(c.get('delta', 0.0))}" + (f" ({rule[:38] + chr(0x2026) if len(rule) > 39 else rule})" if rule else "")
        ax.text(e, yi, "  " + label, va="center", ha="left", fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)


def _draw_text(ax, info, k, diagnostics):
    ax.axis("off")
    ax.set_title("(c) run summary", fontsize=12, loc="left")
    lines = [
        "Privacy (this run)",
        f"  epsilon spent {_fmt(info.get('epsilon_spent')):>10} of configured {_fmt(info.get('epsilon_configured'))}",
        f"  delta   spent {_fmt(info.get('delta_spent')):>10} of configured {_fmt(info.get('delta_configured'))}",
        "",
        "Ledger (this input, all runs incl. this one)",
    ]
    ledger = info.get("ledger")
    if ledger is None:
        lines.append("  no ledger configured")
    else:
        for key, label in (("epsilon", "epsilon"), ("delta", "delta  ")):
            spent = ledger.get(f"spent_{key}")
            budget = ledger.get(f"budget_{key}")
            if budget is None:
                lines.append(f"  {label} spent {_fmt(spent):>10}   (no budget cap)")
            else:
                remaining = None if spent is None else float(budget) - float(spent)
                lines.append(
                    f"  {label} spent {_fmt(spent):>10} of budget {_fmt(budget)}, remaining {_fmt(remaining)}"
                )
    lines += ["", f"Run: k = {info.get('k', k)}, objective = {info.get('objective', '?')}, "
                  f"algorithm = {info.get('algorithm', '?')}"]
    params = info.get("parameters") or {}
    if params:
        lines.append("Parameters")
        for i, (key, value) in enumerate(params.items()):
            if i >= _MAX_PARAMETERS:
                lines.append(f"  ... {len(params) - _MAX_PARAMETERS} more")
                break
            text = _fmt(value) if isinstance(value, (int, float, np.number)) else str(value)
            if len(text) > 48:
                text = text[:45] + "..."
            lines.append(f"  {key} = {text}")
    timings = info.get("timings") or {}
    if timings:
        total = sum(float(v) for v in timings.values() if v is not None)
        lines.append(f"Timings (total {total:.2f} s)")
        items = [f"{step} {float(sec):.2f} s" for step, sec in timings.items() if sec is not None]
        for i in range(0, len(items), 3):  # three per line
            lines.append("  " + ", ".join(items[i : i + 3]))
    ax.text(0.0, 1.0, "\n".join(lines), transform=ax.transAxes, va="top", ha="left",
            family="monospace", fontsize=8.5, wrap=True)

    if diagnostics is not None:
        extra = [NON_PRIVATE_LABEL + " (not differentially private)"]
        for key, value in diagnostics.items():
            if key == "data_sample":
                continue
            extra.append(f"  {key} = {_fmt(value) if isinstance(value, (int, float, np.number)) else value}")
        ax.text(0.0, 0.0, "\n".join(extra), transform=ax.transAxes, va="bottom", ha="left",
                family="monospace", fontsize=9, color="red", fontweight="bold")


# --------------------------------------------------------------------------
# HTML page
# --------------------------------------------------------------------------


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def build_html(info: dict, png: bytes | None = None) -> str:
    """``report.html`` for one run: ``png`` (report.png's bytes) inlined, then tables of released values.

    Post-processing of the same ``info`` as :func:`build_figure`; every value is HTML-escaped.
    Diagnostics (non-private) are shown only when present, under a red NON-PRIVATE banner.
    """
    centers = np.asarray(info.get("centers") or [], dtype=float)
    weights = [float(w) for w in (info.get("noisy_weights") or [])]
    names = [str(f) for f in (info.get("feature_names") or [])]
    if centers.ndim == 2 and len(names) != centers.shape[1]:
        names = [f"x{i}" for i in range(centers.shape[1])]
    title = (f"dpspark run {info.get('run_id', '?')}: {info.get('algorithm', '?')}, "
             f"{info.get('objective', '?')}, k = {info.get('k', len(weights))}")
    parts = [f"<h1>{html.escape(title)}</h1>",
             f"<p class='spent'>privacy spent: &epsilon; = {html.escape(_fmt(info.get('epsilon_spent')))} of "
             f"{html.escape(_fmt(info.get('epsilon_configured')))}, &delta; = {html.escape(_fmt(info.get('delta_spent')))} "
             f"of {html.escape(_fmt(info.get('delta_configured')))}</p>"]
    if info.get("seed_note"):
        parts.append(f"<p class='warn'>{html.escape(str(info['seed_note']))}</p>")
    diagnostics = info.get("diagnostics")
    if diagnostics is not None:
        parts.append(f"<p class='warn'>{NON_PRIVATE_LABEL}: computed from the data, do not publish</p>")
    if png:
        parts.append(f"<img alt='report.png' src='data:image/png;base64,{base64.b64encode(png).decode()}'>")
    rows = [[i, *(_fmt(v) for v in c), _fmt(w)] for i, (c, w) in enumerate(zip(centers.reshape(len(weights), -1), weights))]
    parts += ["<h2>Released centers (original units) and noisy weights</h2>",
              _table(["cluster", *names, "noisy weight"], rows)]
    charges = info.get("charges") or []
    parts += ["<h2>Privacy charges</h2>",
              _table(["step", "epsilon", "delta", "rule"],
                     [[c.get("step", ""), _fmt(c.get("epsilon")), _fmt(c.get("delta")), c.get("rule", "")] for c in charges])]
    ledger = info.get("ledger")
    parts.append("<h2>Ledger (this input, all runs including this one)</h2>")
    if ledger is None:
        parts.append("<p>no ledger configured</p>")
    else:
        lrows = []
        for key in ("epsilon", "delta"):
            spent, budget = ledger.get(f"spent_{key}"), ledger.get(f"budget_{key}")
            remaining = None if budget is None or spent is None else float(budget) - float(spent)
            lrows.append([key, _fmt(spent), "no cap" if budget is None else _fmt(budget), _fmt(remaining)])
        parts.append(_table(["", "spent", "budget", "remaining"], lrows))
    params = info.get("parameters") or {}
    parts += ["<h2>Parameters (public)</h2>",
              _table(["key", "value"], [[k, v if isinstance(v, str) else json.dumps(v, default=str)] for k, v in params.items()])]
    timings = info.get("timings") or {}
    if timings:  # wall times grow with n: the runner passes them only with non-private diagnostics
        parts += ["<h2 class='warn'>Timings (NON-PRIVATE: wall times depend on the data)</h2>",
                  _table(["step", "seconds"], [[k, f"{float(v):.2f}"] for k, v in timings.items() if v is not None])]
    if diagnostics is not None:
        parts += [f"<h2 class='warn'>{NON_PRIVATE_LABEL} (not differentially private)</h2>",
                  _table(["key", "value"], [[k, _fmt(v) if isinstance(v, (int, float, np.number)) else v]
                                            for k, v in diagnostics.items() if k != "data_sample"])]
    style = ("body{font-family:sans-serif;margin:2em;max-width:1200px} table{border-collapse:collapse;margin:0.5em 0 1.5em}"
             " td,th{border:1px solid #bbb;padding:3px 8px;text-align:left;font-size:13px} img{max-width:100%}"
             " .warn{color:#b00;font-weight:bold} .spent{font-size:18px}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")
