"""A line chart as a standalone SVG file: enough for a benchmark's curves without matplotlib (not installed here)."""

from __future__ import annotations

import dataclasses
import math
from html import escape
from pathlib import Path

WIDTH, HEIGHT = 640, 400
LEFT, RIGHT, TOP, BOTTOM = 60, 170, 40, 50  # margins: axis labels left and below, legend right


@dataclasses.dataclass(frozen=True)
class Series:
    """One line: y values at x = 1, 2, ...; lines sharing a label share one legend entry."""

    label: str
    color: str
    values: list[float]
    width: float = 1.0


def build_line_svg(series: list[Series], title: str, x_label: str, y_label: str,
                   y_range: tuple[float, float] = (0.0, 1.0)) -> str:
    """The SVG text of `series` on shared axes (x: step 1..longest series, y: `y_range`)."""
    n = max((len(s.values) for s in series), default=1)
    lo, hi = y_range
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_at(i: int) -> float:
        return LEFT + (plot_w * (i / (n - 1)) if n > 1 else plot_w / 2)

    def y_at(v: float) -> float:
        return TOP + plot_h * (1 - (min(max(v, lo), hi) - lo) / (hi - lo))

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" '
             'font-size="12">', '<rect width="100%" height="100%" fill="white"/>',
             f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>']
    for k in range(6):  # horizontal grid and y ticks
        v = lo + (hi - lo) * k / 5
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y_at(v):.1f}" y2="{y_at(v):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y_at(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    for i in sorted({0, n - 1, *range(0, n, max(1, math.ceil(n / 8)))}):  # x ticks at steps
        parts.append(f'<text x="{x_at(i):.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{i + 1}</text>')
    parts += [f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#444"/>',
              f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 12}" text-anchor="middle">{escape(x_label)}</text>',
              f'<text transform="translate(16 {TOP + plot_h / 2}) rotate(-90)" text-anchor="middle">'
              f'{escape(y_label)}</text>']
    legend: dict[str, tuple[str, float]] = {}
    for s in series:
        points = " ".join(f"{x_at(i):.1f},{y_at(v):.1f}" for i, v in enumerate(s.values) if math.isfinite(v))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{s.color}" stroke-width="{s.width}"/>')
        legend.setdefault(s.label, (s.color, s.width))
    for row, (label, (color, width)) in enumerate(legend.items()):
        y = TOP + 10 + 20 * row
        parts.append(f'<line x1="{WIDTH - RIGHT + 12}" x2="{WIDTH - RIGHT + 32}" y1="{y}" y2="{y}" stroke="{color}" '
                     f'stroke-width="{width}"/>')
        parts.append(f'<text x="{WIDTH - RIGHT + 38}" y="{y + 4}">{escape(label)}</text>')
    return "\n".join([*parts, "</svg>\n"])


def write_line_svg(path: Path, series: list[Series], title: str, x_label: str, y_label: str) -> None:
    """Write `build_line_svg(...)` to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(build_line_svg(series, title, x_label, y_label))
