"""View model of the task list (``/tasks``) and the overview's recent tasks: rows of
``activity.search_tasks`` -> a table with a selection box per row, relative times (the absolute
one in the cell's tooltip), run durations, kind, an argument preview and why a task ended;
the page's count, previous/next links and the flash after a bulk action.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from taskward.activity import TaskPage
from taskward.dashboard.graphviews import short_id
from taskward.dashboard.views import (
    TERMINAL_STATUSES,
    Cell,
    Region,
    cell,
    fmt_ago,
    fmt_duration,
    fmt_time,
    table,
    task_href,
    task_status_cell,
    tasks_href,
)

TASK_COLUMNS: Final = (
    "task",
    "status",
    "kind",
    "priority",
    "arguments",
    "attempts",
    "created",
    "ran",
    "why",
)
LIST_COLUMNS: Final = ("", *TASK_COLUMNS)
_WHY_CHARS: Final = 120

# What a bulk action did, shown above the list after its redirect: ``?done=<what>&n=&of=``.
BULK_FLASH: Final = {
    "retried": "retried {n} of {of} selected tasks: each runs again as a new task",
    "cancelled": "cancelled {n} of {of} selected tasks",
    "requested": "cancelled {n} of {of} selected tasks (a running one stops when its worker "
    "sees the request)",
    "none": "nothing was selected",
}


def first_line(text: Any, limit: int = _WHY_CHARS) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters."""
    if not text:
        return ""
    for line in str(text).splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 1] + "\u2026"
    return ""


def why_text(row: Mapping[str, Any]) -> str:
    """Why a task is where it is, in one line: the reason code, then the error's first line."""
    code = row.get("status_reason_code") or ""
    said = first_line(row.get("error_detail")) or first_line(row.get("status_reason_summary"))
    if code and said:
        return f"{code}: {said}"
    return code or said


def ran_text(row: Mapping[str, Any], now: float) -> tuple[str, str | None]:
    """(the run's duration, its tooltip): ended - last claim, or running for so long; "-" for
    a task that never ran."""
    started = row.get("started_at")
    if started is None:
        return "-", None
    ended = row.get("ended_at")
    if row["status"] in TERMINAL_STATUSES and ended is not None:
        return fmt_duration(float(ended) - float(started)), f"started {fmt_time(started)}"
    if row["status"] == "running":
        return f"{fmt_duration(now - float(started))} so far", f"started {fmt_time(started)}"
    return "-", None


def priority_text(row: Mapping[str, Any]) -> str | None:
    priority = row.get("priority") or 0
    return f"{priority:+d}" if priority else None


def attempts_cell(row: Mapping[str, Any]) -> Cell:
    taken = int(row.get("lease_attempts") or 0)
    ceiling = row.get("max_attempts")
    return cell(str(taken) if ceiling is None else f"{taken}/{ceiling}", cls="num")


def task_rows(
    rows: Iterable[Mapping[str, Any]], now: float, *, selectable: bool = False
) -> list[list[Cell]]:
    out = []
    for row in rows:
        task_id = str(row["id"])
        ran, ran_title = ran_text(row, now)
        line: list[Cell] = []
        if selectable:
            line.append({"text": "", "check": task_id, "label": f"select task {task_id}"})
        created = row.get("created_at")
        line += [
            cell(short_id(task_id), href=task_href(task_id), cls="mono", title=task_id),
            task_status_cell(row, now),
            cell(row.get("action_kind"), href=tasks_href(kind=row.get("action_kind"))),
            cell(priority_text(row), cls="num"),
            cell(row.get("args_preview"), cls="mono args", title=row.get("args_preview")),
            attempts_cell(row),
            cell(
                fmt_ago(now - float(created)) if created is not None else None,
                title=fmt_time(created),
                cls="when",
            ),
            cell(ran, title=ran_title, cls="num"),
            cell(why_text(row), cls="why", title=first_line(row.get("status_reason_summary"), 500)),
        ]
        out.append(line)
    return out


def recent_region(rows: Iterable[Mapping[str, Any]], now: float) -> Region:
    return table(TASK_COLUMNS, task_rows(rows, now), empty="no tasks yet")


def _count_text(page: TaskPage, filtered: bool) -> str:
    total = f"{page.total}+" if page.capped else str(page.total)
    noun = "task" if page.total == 1 and not page.capped else "tasks"
    shown = len(page.rows)
    what = f"{total} {noun}" + (" match" if filtered else "")
    return f"{what} \u00b7 {shown} shown" if shown < page.total else what


def tasks_regions(
    page: TaskPage,
    filters: Mapping[str, str | None],
    now: float,
    *,
    can_operate: bool = False,
) -> dict[str, Region]:
    """The list (with selection boxes for an operator), its count and its page links; when
    filtered to an ended status, what the "retry these" form posts (the ids shown, kept
    current while the page polls) and their count."""
    kept = {k: v for k, v in filters.items() if v}
    newer: Region = {"kind": "link", "text": "", "href": None}
    older: Region = {"kind": "link", "text": "", "href": None}
    if page.newer_cursor:
        newer = {
            "kind": "link",
            "text": "\u2190 newer",
            "href": tasks_href(**kept, newer=page.newer_cursor),
        }
    if page.next_cursor:
        older = {
            "kind": "link",
            "text": "older \u2192",
            "href": tasks_href(**kept, cursor=page.next_cursor),
        }
    columns = LIST_COLUMNS if can_operate else TASK_COLUMNS
    regions: dict[str, Region] = {
        "tasks": table(
            columns,
            task_rows(page.rows, now, selectable=can_operate),
            empty="no tasks match" if kept else "no tasks yet",
        ),
        "count": {"kind": "text", "text": _count_text(page, bool(kept))},
        "newer": newer,
        "next": older,
    }
    if filters.get("status") in TERMINAL_STATUSES:
        regions["bulk-retry"] = {"kind": "toggle", "visible": bool(page.rows)}
        regions["bulk-ids"] = {"kind": "value", "value": " ".join(r["id"] for r in page.rows)}
        regions["bulk-count"] = {"kind": "text", "text": str(len(page.rows))}
    return regions


def flash_text(query: Mapping[str, str]) -> str | None:
    """The flash of a bulk action's redirect (fixed texts: the query only picks one and its
    two numbers, so a crafted link cannot make the page say anything else)."""
    done = query.get("done")
    if done not in BULK_FLASH:
        return None
    numbers = {k: (query.get(k) or "0") for k in ("n", "of")}
    if not all(v.isdigit() and len(v) <= 4 for v in numbers.values()):
        return None
    return BULK_FLASH[done].format(**numbers)
