"""View model of the overview page: what is queued where (only the statuses, targets and kinds
in use), activity over time as charts (``chartviews``, from ``activity.read_activity``), the
newest tasks and the workers.

The counts, recent tasks and workers poll; the charts and the kinds table are read when the
page is drawn (``overview_page_regions``), as the workflow view is: a reload redraws them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from taskward.activity import RANGES, Activity
from taskward.dashboard import chartviews, workerviews
from taskward.dashboard.listviews import recent_region
from taskward.dashboard.views import (
    STATUSES,
    Region,
    cell,
    status_cell,
    table,
    tasks_href,
)
from taskward.lifecycle import TERMINAL

# The kinds charted one by one (the busiest in the range); the rest are summed as "other".
MAX_CHARTED_KINDS: Final = 6
# How each ended status is drawn in the stacked bars (bottom first) and its legend.
ENDINGS: Final = (
    ("completed", "completed", "c-completed"),
    ("failed", "failed", "c-failed"),
    ("timed_out", "timed out", "c-failed-2"),
    ("cancelled", "cancelled", "c-cancelled"),
    ("skipped", "skipped", "c-skipped"),
)
DEPTH_LINES: Final = (
    ("queued", "queued", "c-queued"),
    ("running", "running", "c-running"),
    ("retry_wait", "waiting to retry", "c-retry"),
    ("waiting_dependency", "waiting for dependencies", "c-waiting"),
)
BUCKET_WORDS: Final = {60: "minute", 300: "5 min", 900: "15 min", 7200: "2 h"}


def counts_region(pairs: Iterable[Mapping[str, Any]]) -> Region:
    """Status x execution target, with totals, of the statuses and targets that hold a task
    (a fresh store: one line saying so); every number links to the filtered list."""
    grid: dict[tuple[str, str], int] = {}
    for row in pairs:
        key = (str(row["status"]), row["execution_target"] or "")
        grid[key] = grid.get(key, 0) + int(row["n"])
    targets = sorted({t for (_, t), n in grid.items() if n})
    statuses = [s for s in STATUSES if any(grid.get((s, t), 0) for t in targets)]
    rows = []
    for status in statuses:
        line = [status_cell(status)]
        for target in targets:
            n = grid.get((status, target), 0)
            href = tasks_href(status=status, target=target or None) if n else None
            line.append(cell(n, href=href, cls="num"))
        total = sum(grid.get((status, t), 0) for t in targets)
        line.append(cell(total, href=tasks_href(status=status), cls="num total"))
        rows.append(line)
    if (rows and len(targets) > 1) or len(rows) > 1:
        totals = [cell("all", cls="total")]
        for target in targets:
            n = sum(grid.get((s, target), 0) for s in statuses)
            totals.append(cell(n, href=tasks_href(target=target or None), cls="num total"))
        totals.append(cell(sum(grid.values()), href=tasks_href(), cls="num total"))
        rows.append(totals)
    columns = ["status", *(t or "(no target)" for t in targets), "total"]
    return table(columns, rows, empty="no tasks yet: submit one and it shows here")


def kinds_region(pairs: Iterable[Mapping[str, Any]]) -> Region:
    """Kinds in use: how many of each are waiting, running and ended, and how many failed."""
    per: dict[str, dict[str, int]] = {}
    for row in pairs:
        per.setdefault(str(row["action_kind"]), {})[str(row["status"])] = int(row["n"])
    rows = []
    for kind in sorted(per, key=lambda k: (-sum(per[k].values()), k)):
        n = per[kind]
        waiting = sum(v for s, v in n.items() if s not in TERMINAL and s != "running")
        failed = n.get("failed", 0) + n.get("timed_out", 0)
        rows.append(
            [
                cell(kind, href=tasks_href(kind=kind)),
                cell(waiting, href=tasks_href(kind=kind, status="queued") if waiting else None),
                cell(n.get("running", 0), cls="num"),
                cell(n.get("completed", 0), cls="num"),
                cell(
                    failed,
                    href=tasks_href(kind=kind, status="failed") if failed else None,
                    cls="num bad" if failed else "num",
                ),
                cell(sum(n.values()), href=tasks_href(kind=kind), cls="num total"),
            ]
        )
    return table(
        ("kind", "waiting", "running", "completed", "failed", "total"), rows, empty="no tasks yet"
    )


def _kind_charts(activity: Activity) -> list[dict[str, Any]]:
    edges = activity.edges()
    per = BUCKET_WORDS.get(activity.bucket_s, f"{activity.bucket_s} s")
    shown = activity.kinds[:MAX_CHARTED_KINDS]
    out = []
    for series in shown:
        ended = [
            (label, cls, series.ended.get(status, [0] * activity.buckets))
            for status, label, cls in ENDINGS
            if any(series.ended.get(status, []))
        ]
        peak = [v for v in series.p95_s if v is not None]
        p95_summary = (
            f"highest p95 {chartviews.fmt_seconds(max(peak))}" if peak else "no task of it ran"
        )
        out.append(
            {
                "kind": series.kind,
                "href": tasks_href(kind=series.kind),
                "ended": chartviews.bar_chart(
                    f"{series.kind}: tasks ended per {per}",
                    edges,
                    activity.bucket_s,
                    ended,
                    unit=f"in the last {activity.range}",
                ),
                "p95": chartviews.line_chart(
                    f"{series.kind}: p95 run time per {per}",
                    edges,
                    activity.bucket_s,
                    [("p95 run time", "c-p95", series.p95_s)],
                    fmt=chartviews.fmt_seconds,
                    summary=p95_summary,
                ),
            }
        )
    return out


def charts_region(activity: Activity) -> dict[str, Any]:
    """The overview's charts: queue depth per state, and per kind in use its endings (stacked
    by status) and p95 run time; with the range's links."""
    edges = activity.edges()
    depth_series = [
        (label, cls, activity.depth[state])
        for state, label, cls in DEPTH_LINES
        if any(activity.depth.get(state, [])) or state == "queued"
    ]
    now_depth = ", ".join(f"{values[-1]} {label}" for label, _, values in depth_series)
    depth = chartviews.line_chart(
        "Queue depth",
        edges,
        activity.bucket_s,
        depth_series,
        summary=f"now: {now_depth}",
    )
    hidden = activity.kinds[MAX_CHARTED_KINDS:]
    per = BUCKET_WORDS.get(activity.bucket_s, f"{activity.bucket_s} s")
    every_kind = [
        (
            label,
            cls,
            [
                sum(k.ended.get(status, [0] * activity.buckets)[i] for k in activity.kinds)
                for i in range(activity.buckets)
            ],
        )
        for status, label, cls in ENDINGS
        if any(any(k.ended.get(status, [])) for k in activity.kinds)
    ]
    ended = chartviews.bar_chart(
        f"Tasks ended per {per}, every kind",
        edges,
        activity.bucket_s,
        every_kind,
        unit=f"in the last {activity.range}",
    )
    return {
        "kind": "charts",
        "range": activity.range,
        "ranges": [
            {"name": r, "href": f"/?range={r}", "current": r == activity.range} for r in RANGES
        ],
        "depth": depth,
        "ended": ended,
        "kinds": _kind_charts(activity),
        "more": f"{len(hidden)} more kinds ended tasks in this range: "
        + ", ".join(s.kind for s in hidden)
        if hidden
        else "",
    }


def overview_regions(
    pairs: Iterable[Mapping[str, Any]],
    recent: Iterable[Mapping[str, Any]],
    workers: Sequence[Mapping[str, Any]],
    now: float,
) -> dict[str, Region]:
    """What the overview polls (its workers as ``workerviews`` draws them)."""
    return {
        "counts": counts_region(pairs),
        "recent": recent_region(recent, now),
        **workerviews.workers_regions(workers),
    }


def overview_page_regions(
    polled: dict[str, Region],
    kind_pairs: Iterable[Mapping[str, Any]],
    activity: Activity,
) -> dict[str, Any]:
    """The page as drawn: what it polls, the kinds in use and the charts."""
    return {**polled, "kinds": kinds_region(kind_pairs), "charts": charts_region(activity)}
