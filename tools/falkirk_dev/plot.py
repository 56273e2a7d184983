"""Line charts as SVG, drawn by hand (no plotting library in the lock): the benchmarks'
figures next to their JSON, and the demo report's charts."""

from __future__ import annotations

import html
import math

COLOURS = ("#2563eb", "#d97706", "#059669", "#dc2626", "#7c3aed")


def lines_svg(title: str, x_label: str, y_label: str,
              series: dict[str, list[tuple[float, float]]], log_x: bool = False,
              x_ticks: list[float] | None = None, width: int = 640, height: int = 300,
              join: bool = True, guide: tuple[str, float] | None = None) -> str:
    """One line per series (name → points), y from 0 to the largest value; ``log_x``
    draws x on a log10 scale; ``x_ticks`` are labelled on the x axis (default: first and
    last x). ``join=False`` draws the points alone (events, not a trend); ``guide``
    (label, y) draws a dashed horizontal line, such as a goal."""
    w, h, m = width, height, 56
    fx = (lambda x: math.log10(x)) if log_x else (lambda x: float(x))
    xs = [fx(x) for pts in series.values() for x, _ in pts] or [0.0]
    x0, x1 = min(xs), max(xs)
    x1 = x1 if x1 > x0 else x0 + 1
    top = max((y for pts in series.values() for _, y in pts), default=0.0) or 1.0
    if guide is not None:
        top = max(top, guide[1])

    def xy(x: float, y: float) -> tuple[float, float]:
        return (m + (w - 2 * m) * (fx(x) - x0) / (x1 - x0), h - m - (h - 2 * m) * y / top)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             f'font-family="sans-serif" font-size="11">',
             f'<text x="{m}" y="18" font-size="13">{html.escape(title)}</text>',
             f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="#333"/>',
             f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="#333"/>',
             f'<text x="{w / 2}" y="{h - 14}" text-anchor="middle">'
             f'{html.escape(x_label)}</text>',
             f'<text x="{m - 6}" y="{m}" text-anchor="end">{top:,.0f}</text>',
             f'<text x="{m - 6}" y="{h - m}" text-anchor="end">0</text>',
             f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" '
             f'text-anchor="middle">{html.escape(y_label)}</text>']
    ticks = x_ticks if x_ticks is not None else sorted(
        {x for pts in series.values() for x in (pts[0][0], pts[-1][0]) if pts})
    for t in ticks:
        x, _ = xy(t, 0)
        parts.append(f'<text x="{x:.1f}" y="{h - m + 14}" text-anchor="middle">{t:,.0f}</text>')
    if guide is not None:
        _, gy = xy(x0 if not log_x else 10 ** x0, guide[1])
        parts += [f'<line x1="{m}" y1="{gy:.1f}" x2="{w - m}" y2="{gy:.1f}" stroke="#888" '
                  f'stroke-dasharray="4 3"/>',
                  f'<text x="{w - m}" y="{gy - 4:.1f}" text-anchor="end" fill="#555">'
                  f'{html.escape(guide[0])}</text>']
    for i, (name, pts) in enumerate(series.items()):
        c = COLOURS[i % len(COLOURS)]
        drawn = [xy(x, y) for x, y in pts]
        if join:
            parts.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="'
                         + " ".join(f"{x:.1f},{y:.1f}" for x, y in drawn) + '"/>')
        if not join or len(drawn) <= 30:
            parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{c}"/>' for x, y in drawn]
        parts.append(f'<text x="{m + 10}" y="{m + 14 * i}" fill="{c}">{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def stack_svg(svgs: list[str], width: int = 640, height: int = 300) -> str:
    """Several plots of ``lines_svg`` one above the other, as one SVG."""
    inner = "".join(s.replace("<svg ", f'<svg y="{i * height}" ', 1)
                    for i, s in enumerate(svgs))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height * len(svgs)}">{inner}</svg>')
