"""The throughput chart: an SVG drawn on the server, one bar per minute, no script.

Bars are stacked per bucket, completed below dead; colours come from the stylesheet's classes
(``bar-completed``, ``bar-dead``), so the SVG carries no inline style and passes the CSP. Every
text in it is escaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from markupsafe import Markup, escape

__all__ = ["throughput_svg"]


def throughput_svg(
    starts: Sequence[datetime],
    completed: Sequence[int],
    dead: Sequence[int],
    *,
    label: str,
    width: int = 600,
    height: int = 80,
    axes: bool = True,
) -> Markup:
    """A stacked bar chart of ``completed`` and ``dead`` per bucket starting at ``starts``;
    without ``axes``, a sparkline (each bar's tooltip still says its minute and counts)."""
    n = len(starts)
    if not (len(completed) == len(dead) == n) or n == 0:
        raise ValueError("throughput_svg needs one completed and one dead count per bucket")
    top = max(c + d for c, d in zip(completed, dead, strict=True))
    peak = top or 1
    step = width / n
    bar = max(step - 1.0, 1.0)
    full = height + 14 if axes else height
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {full}" width="{width}" '
        f'height="{full}" role="img" aria-label="{escape(label)}">',
        f"<title>{escape(label)}</title>",
        f'<line class="axis" x1="0" y1="{height}" x2="{width}" y2="{height}"/>',
    ]
    for i, (start, c, d) in enumerate(zip(starts, completed, dead, strict=True)):
        x = i * step
        tip = f"{start:%H:%M} UTC: {c} completed, {d} dead"
        h_c = height * c / peak
        h_d = height * d / peak
        parts.append(f'<g class="bucket"><title>{escape(tip)}</title>')
        # A transparent full-height rect makes the whole column hoverable.
        parts.append(f'<rect class="hit" x="{x:.1f}" y="0" width="{bar:.1f}" height="{height}"/>')
        if c:
            parts.append(
                f'<rect class="bar-completed" x="{x:.1f}" y="{height - h_c:.1f}" '
                f'width="{bar:.1f}" height="{h_c:.1f}"/>'
            )
        if d:
            parts.append(
                f'<rect class="bar-dead" x="{x:.1f}" y="{height - h_c - h_d:.1f}" '
                f'width="{bar:.1f}" height="{h_d:.1f}"/>'
            )
        parts.append("</g>")
    if axes:
        parts.append(
            f'<text class="tick" x="0" y="{height + 12}">{starts[0]:%H:%M}</text>'
            f'<text class="tick" x="{width}" y="{height + 12}" text-anchor="end">'
            f"{starts[-1]:%H:%M} UTC</text>"
            f'<text class="tick" x="{width}" y="10" text-anchor="end">peak {top}/min</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))
