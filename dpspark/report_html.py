"""report.html: the page a person reads, searches and copies values from (``build_html``).

The figure (report.png's bytes) inlined, then the released values as tables. It stands on its own
(inline image and style, every value HTML-escaped). No matplotlib: the text it shares with the figure
is in ``dpspark.report_text``.
"""

from __future__ import annotations

import base64
import html

import numpy as np

from dpspark.report_text import (
    DEGENERATE_LABEL,
    NON_PRIVATE_LABEL,
    _coordinate_formats,
    _domain,
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
