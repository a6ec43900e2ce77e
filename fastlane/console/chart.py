"""The overview's lag chart as inline SVG, drawn on the server: no chart library, no script."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from markupsafe import Markup, escape

from fastlane.console.activity import Point

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 720, 200, 48, 22, 10
SPAN = timedelta(hours=1)


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 5 x 10^n at or above ``value``: a readable top for the axis."""
    step = 1.0
    while step < value:
        for factor in (2.0, 2.5, 2.0):
            step *= factor
            if step >= value:
                break
    return step


def lag_chart(points: Sequence[Point], now: datetime) -> Markup:
    """p50 and p99 trigger lag over the hour up to ``now``; a gap where nothing was released."""
    top = _nice_ceiling(max((p.p99_ms or 0.0 for p in points), default=1.0) or 1.0)
    plot_w, plot_h = WIDTH - LEFT - 8, HEIGHT - BOTTOM - TOP

    def x(at: datetime) -> float:
        return LEFT + plot_w * max(0.0, 1 - (now - at) / SPAN)

    def y(ms: float) -> float:
        return TOP + plot_h * (1 - min(ms, top) / top)

    def lines(values: Sequence[tuple[datetime, float | None]]) -> list[str]:
        runs: list[list[str]] = [[]]
        for at, ms in values:
            if ms is None:
                runs.append([])
            else:
                runs[-1].append(f"{x(at):.1f},{y(ms):.1f}")
        return [" ".join(run) for run in runs if run]

    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
             f'aria-label="trigger lag p50 and p99 over the last hour, in milliseconds">']
    for fraction in (0.0, 0.5, 1.0):
        value = top * fraction
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - 8}" y1="{y(value):.1f}" y2="{y(value):.1f}"/>')
        parts.append(f'<text class="axis" x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{value:g} ms</text>')
    for minutes in (60, 45, 30, 15, 0):
        at = now - timedelta(minutes=minutes)
        label = "now" if minutes == 0 else f"-{minutes} min"
        parts.append(f'<text class="axis" x="{x(at):.1f}" y="{HEIGHT - 6}" text-anchor="middle">{label}</text>')
    recent = [p for p in points if now - p.at <= SPAN]
    for name, series in (("p99", [(p.at, p.p99_ms) for p in recent]), ("p50", [(p.at, p.p50_ms) for p in recent])):
        for line in lines(series):
            parts.append(f'<polyline class="{name}" points="{escape(line)}"/>')
        for at, ms in series:  # a lone point draws no line: each point is also a dot
            if ms is not None:
                parts.append(f'<circle class="{name}" cx="{x(at):.1f}" cy="{y(ms):.1f}" r="2"/>')
    if not any(p.released for p in recent):
        parts.append(f'<text class="axis" x="{LEFT + plot_w / 2:.0f}" y="{TOP + plot_h / 2:.0f}" '
                     'text-anchor="middle">no run released on its time in the last hour</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
