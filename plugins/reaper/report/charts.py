"""Stacked bar charts as inline SVG: no script, no network, the same in the plugin and the offline report.

Each column links to what it shows (a sweep) and carries its counts twice: in a ``<title>`` the
browser shows on hover, and as ``data-values`` JSON a test or a script can read. Marks (a hold,
an override) sit above their column with who and why in their own ``<title>``.
"""

from __future__ import annotations

import json
from html import escape
from typing import NamedTuple

# Colours readable on a light and a dark background alike (Chakra's 500 shades).
PALETTE = ("#3182ce", "#805ad5", "#dd6b20", "#319795", "#d53f8c", "#38a169", "#d69e2e", "#00b5d8", "#e53e3e", "#718096")
# Fixed colours for the words that mean the same thing in every chart.
FIXED = {"deleted": "#38a169", "already_gone": "#68d391", "failed": "#e53e3e", "delete": "#e53e3e", "report": "#dd6b20"}
MARK = "#d69e2e"


class Column(NamedTuple):
    """One bar: its label on the x axis, its counts by series, where it links, and its marks."""

    label: str
    values: dict[str, int]
    href: str = ""
    marks: tuple[str, ...] = ()


def colours(series: list[str]) -> dict[str, str]:
    """A colour per series: the fixed one of a word that means the same everywhere, else the palette in order
    (distinct within a chart, which a hash of the name would not be)."""
    free = iter(c for c in PALETTE if c not in {FIXED[s] for s in series if s in FIXED})
    return {s: FIXED.get(s) or next(free, PALETTE[-1]) for s in series}


def stacked_bars(
    title: str, columns: list[Column], *, over_time: bool = True, width: int = 440, height: int = 150
) -> str:
    """A titled chart of ``columns`` stacked by series, with a legend of each series' latest value
    (``over_time``: columns are sweeps, the last is now) or its total (columns side by side, e.g. scopes)."""
    series = sorted(
        {s for c in columns for s in c.values}, key=lambda s: (-sum(c.values.get(s, 0) for c in columns), s)
    )
    colour = colours(series).__getitem__
    if not columns or not series:
        caption = f"<figcaption>{escape(title)}</figcaption>"
        return f'<figure class="chart">{caption}<p class="muted">nothing recorded</p></figure>'
    left, top, bottom = 40, 14, 20
    plot_w, plot_h = width - left - 4, height - top - bottom
    peak = max(1, max(sum(c.values.values()) for c in columns))
    step = plot_w / len(columns)
    bar = max(1.0, step * 0.8)
    parts = [
        f'<line class="axis" x1="{left}" y1="{top + plot_h}" x2="{width - 4}" y2="{top + plot_h}"/>',
        f'<text class="tick" x="{left - 4}" y="{top + 4}" text-anchor="end">{peak}</text>',
        f'<text class="tick" x="{left - 4}" y="{top + plot_h}" text-anchor="end">0</text>',
        f'<line class="grid" x1="{left}" y1="{top}" x2="{width - 4}" y2="{top}"/>',
    ]
    for i, col in enumerate(columns):
        x = left + i * step + (step - bar) / 2
        y: float = top + plot_h
        rects = []
        for s in series:
            n = col.values.get(s, 0)
            if n <= 0:
                continue
            h = plot_h * n / peak
            y -= h
            rects.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" fill="{colour(s)}"/>')
        tip = "\n".join([col.label, *(f"{s}: {col.values[s]}" for s in series if col.values.get(s)), *col.marks])
        for mark in col.marks[:1]:  # one marker per column; every mark is in the tooltip
            cx = x + bar / 2
            rects.append(
                f'<path class="mark" d="M{cx - 4:.1f},{top - 10} L{cx + 4:.1f},{top - 10} L{cx:.1f},{top - 3} Z" '
                f'fill="{MARK}"><title>{escape(mark)}</title></path>'
            )
        body = f"<title>{escape(tip)}</title>{''.join(rects)}"
        # A transparent hit area the height of the plot: thin or empty bars stay easy to hover and click.
        hit = f'<rect class="hit" x="{left + i * step:.1f}" y="{top}" width="{step:.1f}" height="{plot_h}"/>'
        data = escape(json.dumps(col.values, sort_keys=True))
        attrs = f'class="col" data-label="{escape(col.label)}" data-values="{data}"'
        if col.href:
            parts.append(f'<a href="{escape(col.href)}" {attrs}>{hit}{body}</a>')
        else:
            parts.append(f"<g {attrs}>{hit}{body}</g>")
    if len(columns) <= 8:  # few columns: each named under itself
        labels = [(i, "middle", left + i * step + step / 2) for i in range(len(columns))]
    else:  # many: the first and the last
        labels = [(0, "start", left), (len(columns) - 1, "end", left + len(columns) * step)]
    for i, anchor, x in labels:
        label = escape(columns[i].label)
        parts.append(f'<text class="tick" x="{x:.1f}" y="{height - 4}" text-anchor="{anchor}">{label}</text>')
    shown = columns[-1].values if over_time else {s: sum(c.values.get(s, 0) for c in columns) for s in series}
    legend = "".join(
        f'<span class="key"><i style="background:{colour(s)}"></i>{escape(s)} <b>{shown.get(s, 0)}</b></span>'
        for s in series
    )
    legend_of = "latest" if over_time else "total"
    svg = f'<svg viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">{"".join(parts)}</svg>'
    return (
        f'<figure class="chart"><figcaption>{escape(title)} <span class="muted">(legend: {legend_of})</span>'
        "</figcaption>"
        f'{svg}<div class="legend">{legend}</div></figure>'
    )
