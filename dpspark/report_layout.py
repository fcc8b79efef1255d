"""Pixel layout for report.png: fitting text into boxes and axes into regions, placing labels.

Generic helpers that know nothing about runs: they measure matplotlib texts and axes with the
renderer ``r`` they are given (Agg, at the figure's dpi) and place, wrap, shorten or shrink them so
nothing is clipped or overprinted. Used by ``dpspark.report``.
"""

from __future__ import annotations

import re
import textwrap

import numpy as np
from matplotlib.text import Text
from matplotlib.transforms import Bbox

# At most this many center labels (``_place_labels``).
_MAX_LABELS = 25
_ELLIPSIS = "\u2026"


# --------------------------------------------------------------------------
# Text in a box
# --------------------------------------------------------------------------


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
# Axes in a region, labels beside points
# --------------------------------------------------------------------------


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
