"""Charts of the overview, laid out here and drawn as inline SVG by ``templates/charts.html``
(server-rendered like the workflow view, ``graphviews``: no script, no chart library).

Pure: series of numbers per time bucket in, a chart description out (bars, lines, axis ticks,
a legend and a one-line summary in words for readers that do not see the drawing). Every drawn
mark carries its value (``data-value``) and a ``<title>`` tooltip; the SVG scales to its box
(``viewBox``), so a chart fits a 420 px screen.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

# The drawing's coordinate space (SVG user units); the page scales it to its width.
WIDTH: Final = 520
HEIGHT: Final = 170
PAD_LEFT: Final = 50
PAD_RIGHT: Final = 10
PAD_TOP: Final = 10
PAD_BOTTOM: Final = 24
X_TICKS: Final = 5

Series = tuple[str, str, Sequence[float | None]]  # (name, css class, value per bucket)


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above ``value`` (1 for nothing)."""
    if value <= 0:
        return 1.0
    base = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * base >= value - 1e-12:
            return float(step * base)
    return float(10 * base)  # pragma: no cover


def count_ceiling(value: float) -> float:
    """The top of a count axis: four whole-number steps (``nice_ceiling`` of a quarter)."""
    return 4.0 * max(1, math.ceil(nice_ceiling(value / 4)))


def fmt_count(value: float) -> str:
    return f"{value:g}" if value < 10_000 else f"{value / 1000:g}k"


def fmt_seconds(value: float) -> str:
    """A run time: ``250 ms``, ``4 s``, ``2.5 min``, ``1 h``."""
    if value < 1:
        return f"{value * 1000:g} ms"
    if value < 120:
        return f"{value:g} s"
    if value < 7200:
        return f"{value / 60:g} min"
    return f"{value / 3600:g} h"


def time_label(at: float, bucket_s: int) -> str:
    """A tick's time in UTC, as the pages write times: ``14:05``, or ``12-05 14:00`` for a
    range of days."""
    stamp = datetime.fromtimestamp(at, tz=UTC)
    return stamp.strftime("%m-%d %H:%M" if bucket_s >= 3600 else "%H:%M")


def _frame(
    edges: Sequence[float], bucket_s: int, top: float, fmt: Callable[[float], str]
) -> dict[str, Any]:
    plot_w = WIDTH - PAD_LEFT - PAD_RIGHT
    plot_h = HEIGHT - PAD_TOP - PAD_BOTTOM
    n = max(len(edges), 1)
    step = max(1, math.ceil(n / X_TICKS))
    x_ticks = [
        {"x": round(PAD_LEFT + i * plot_w / n, 1), "label": time_label(edges[i], bucket_s)}
        for i in range(0, len(edges), step)
    ]
    y_ticks = [
        {"y": round(PAD_TOP + plot_h - k * plot_h / 4, 1), "label": fmt(top * k / 4)}
        for k in range(5)
    ]
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "left": PAD_LEFT,
        "right": WIDTH - PAD_RIGHT,
        "top": PAD_TOP,
        "bottom": PAD_TOP + plot_h,
        "x_ticks": x_ticks,
        "y_ticks": y_ticks,
        "slot": plot_w / n,
        "plot_h": plot_h,
    }


def bar_chart(
    title: str,
    edges: Sequence[float],
    bucket_s: int,
    series: Sequence[Series],
    *,
    unit: str,
) -> dict[str, Any]:
    """Stacked bars, one stack per bucket (``series`` bottom first); zeros draw nothing."""
    n = len(edges)
    totals = [sum(float(s[2][i] or 0) for s in series) for i in range(n)]
    top = count_ceiling(max(totals, default=0.0))
    frame = _frame(edges, bucket_s, top, fmt_count)
    slot, plot_h = frame["slot"], frame["plot_h"]
    bars = []
    for i in range(n):
        base = 0.0
        for name, cls, values in series:
            value = float(values[i] or 0)
            if value <= 0:
                continue
            h = value / top * plot_h
            y = frame["bottom"] - (base + value) / top * plot_h
            bars.append(
                {
                    "x": round(PAD_LEFT + i * slot + slot * 0.12, 2),
                    "y": round(y, 2),
                    "w": round(max(slot * 0.76, 1.0), 2),
                    "h": round(max(h, 0.5), 2),
                    "cls": cls,
                    "value": fmt_count(value),
                    "title": f"{time_label(edges[i], bucket_s)} UTC: {fmt_count(value)} {name}",
                }
            )
            base += value
    sums = {name: sum(float(v or 0) for v in values) for name, _, values in series}
    summary = ", ".join(f"{fmt_count(v)} {name}" for name, v in sums.items()) + f" ({unit})"
    return {
        "kind": "chart",
        "title": title,
        "frame": frame,
        "bars": bars,
        "lines": [],
        "legend": [{"name": name, "cls": cls} for name, cls, _ in series],
        "summary": summary,
        "empty": not bars,
    }


def line_chart(
    title: str,
    edges: Sequence[float],
    bucket_s: int,
    series: Sequence[Series],
    *,
    fmt: Callable[[float], str] = fmt_count,
    summary: str = "",
) -> dict[str, Any]:
    """A line per series through the middle of each bucket; a bucket without a value (None)
    breaks the line, and a lone value is drawn as a dot."""
    n = len(edges)
    peak = max((float(v) for _, _, vs in series for v in vs if v is not None), default=0.0)
    top = count_ceiling(peak) if fmt is fmt_count else 4 * nice_ceiling(peak / 4)
    frame = _frame(edges, bucket_s, top, fmt)
    slot, plot_h = frame["slot"], frame["plot_h"]
    lines = []
    for name, cls, values in series:
        d, dots, runs = "", [], []
        run: list[tuple[float, float, float]] = []
        for i in range(n):
            value = values[i]
            if value is None:
                if run:
                    runs.append(run)
                run = []
                continue
            x = PAD_LEFT + (i + 0.5) * slot
            y = frame["bottom"] - float(value) / top * plot_h
            run.append((round(x, 2), round(y, 2), float(value)))
        if run:
            runs.append(run)
        for part in runs:
            d += "M" + " L".join(f"{x},{y}" for x, y, _ in part) + " "
            if len(part) == 1:
                x, y, v = part[0]
                dots.append({"x": x, "y": y, "value": fmt(v)})
        shown = [float(v) for v in values if v is not None]
        lines.append(
            {
                "name": name,
                "cls": cls,
                "d": d.strip(),
                "dots": dots,
                "max": fmt(max(shown)) if shown else "",
                "nonzero": any(v > 0 for v in shown),
            }
        )
    return {
        "kind": "chart",
        "title": title,
        "frame": frame,
        "bars": [],
        "lines": lines,
        "legend": [{"name": name, "cls": cls} for name, cls, _ in series],
        "summary": summary,
        "empty": not any(line["d"] for line in lines),
    }
