"""View models of the dashboard: rows from the library -> regions of a page.

A region is plain JSON (a table, a field list, a timeline, a link or a toggle). The server
renders it into the first HTML (``templates/regions.html``) and the page's script re-renders it
from ``/ui/data/...`` while the page is open (``static/dashboard.js``), so both draw the same
thing from one description. Values are text here; escaping happens where they are drawn
(Jinja autoescape on the server, ``textContent`` in the browser), never by building HTML.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import quote, urlencode

from taskward.lifecycle import TERMINAL, Status
from taskward.models import EXECUTION_TARGETS

Region = dict[str, Any]
Cell = dict[str, Any]

TARGETS = sorted(EXECUTION_TARGETS)
STATUSES = [s.value for s in Status]
TERMINAL_STATUSES: Final = frozenset(s.value for s in TERMINAL)

# Tasks on one page of a listing: the most one bulk retry takes (``actions``) and the most
# "Retried as" shows.
PAGE_SIZE: Final = 50


def fmt_time(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return "-" if value is None else str(value)


def fmt_age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def fmt_ago(seconds: float) -> str:
    """A past time relative to now, as lists show it: ``just now``, ``3 min ago``, ``2 h ago``,
    ``4 d ago`` (the absolute time goes in the cell's tooltip)."""
    if seconds < 0:
        return "in " + fmt_duration(-seconds)
    if seconds < 10:
        return "just now"
    if seconds < 60:
        return f"{int(seconds)} s ago"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    if seconds < 2 * 86400:
        return f"{int(seconds // 3600)} h ago"
    return f"{int(seconds // 86400)} d ago"


def fmt_duration(seconds: float) -> str:
    """A run's length: ``0.42 s``, ``12.3 s``, ``4 min 05 s``, ``2 h 07 min``."""
    if seconds < 0:
        seconds = 0.0
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def runs_at(row: Mapping[str, Any], now: float) -> float | None:
    """When a delayed queued task runs (R16: ``queued_at = run_after`` while it is in the
    future), or None when it is not waiting for its ``run_after``."""
    queued_at = row.get("queued_at")
    if row.get("status") != "queued" or row.get("run_after") is None or queued_at is None:
        return None
    return float(queued_at) if queued_at > now else None


def fmt_runs_at(at: float, now: float) -> str:
    """``2026-12-24 18:00:00 UTC (in 59.9 min)``: absolute in the pages' format, then relative."""
    return f"{fmt_time(at)} (in {fmt_age(at - now)})"


def limit_href(key: str) -> str:
    """The limits page with ``key`` chosen (its row marked, the set form filled in)."""
    return "/limits?" + urlencode({"key": key})


def cell(
    text: Any, *, href: str | None = None, cls: str | None = None, title: str | None = None
) -> Cell:
    """A table cell: its text ("-" for none), and a link, classes and tooltip when given."""
    out: Cell = {"text": "-" if text is None or text == "" else str(text)}
    if href:
        out["href"] = href
    if cls:
        out["cls"] = cls
    if title:
        out["title"] = title
    return out


def status_cell(status: str) -> Cell:
    return cell(status, cls=f"status status-{status}")


def task_href(task_id: str) -> str:
    return "/tasks/" + quote(task_id, safe="")


def tasks_href(**filters: str | None) -> str:
    query = urlencode({k: v for k, v in filters.items() if v})
    return "/tasks" + (f"?{query}" if query else "")


def table(columns: Sequence[str], rows: Iterable[Sequence[Cell]], *, empty: str) -> Region:
    return {
        "kind": "table",
        "columns": list(columns),
        "rows": [list(r) for r in rows],
        "empty": empty,
    }


def task_status_cell(row: Mapping[str, Any], now: float) -> Cell:
    """The status, and for a delayed queued task when it runs: ``queued · runs in 5.0 min``."""
    status = str(row["status"])
    at = runs_at(row, now)
    if at is None:
        return status_cell(status)
    return cell(f"{status} \u00b7 runs in {fmt_age(at - now)}", cls=f"status status-{status}")


def action_cell(actions: Iterable[tuple[str, str] | tuple[str, str, Mapping[str, str]]]) -> Cell:
    """Buttons that POST (with the page's CSRF token) to each ``(label, href)``, or
    ``(label, href, fields)`` to post ``fields`` as the form's hidden inputs too."""
    out = []
    for label, href, *rest in actions:
        action: dict[str, Any] = {"label": label, "href": href}
        if rest:
            action["fields"] = dict(rest[0])
        out.append(action)
    return {"text": "", "actions": out}
