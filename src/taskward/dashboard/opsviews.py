"""View model of the dashboard's outbox page (rows -> regions, as ``views`` does, built from its
cells and tables); the schedules page's is ``scheduleviews``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, urlencode

from taskward.dashboard.views import (
    Cell,
    Region,
    action_cell,
    cell,
    fmt_time,
    table,
    task_href,
)

OUTBOX_COLUMNS = (
    "notification",
    "kind",
    "status",
    "attempts",
    "task",
    "next attempt",
    "last error",
    "created",
    "",
)


def _outbox_status(row: Mapping[str, Any]) -> Cell:
    if row["status"] == "expired" and not row.get("attempts"):
        return cell("expired (never sent)", cls="outbox-unsent")
    return cell(row["status"], cls=f"outbox-{row['status']}")


def outbox_regions(
    rows: Iterable[Mapping[str, Any]],
    counts: Mapping[str, int],
    next_cursor: str | None,
    status: str | None,
    *,
    can_operate: bool,
    notice: str | None = None,
) -> dict[str, Region]:
    """The outbox page; ``notice``: ``outbox.no_target_notice``, shown above the counts. A row
    that expired without ever being sent (no target was configured) is shown as that, in a
    neutral colour: nothing failed."""
    count_rows = [
        [
            cell(
                name,
                href=f"/outbox?status={name}" if n else None,
                # no target: what expired was never sent, nothing failed (neutral, not red)
                cls="outbox-unsent" if notice and name == "expired" else f"outbox-{name}",
            ),
            cell(n),
        ]
        for name, n in counts.items()
    ]
    lines = []
    for row in rows:
        retryable = row["status"] in {"dead_letter", "expired"}
        ref = quote(str(row["id"]), safe="")
        lines.append(
            [
                cell(row["id"], cls="mono"),
                cell(row.get("kind")),
                _outbox_status(row),
                cell(f"{row.get('attempts', 0)}/{row.get('max_attempts', '-')}"),
                cell(
                    row.get("schedule_run_id"),
                    href=task_href(row["schedule_run_id"]) if row.get("schedule_run_id") else None,
                    cls="mono",
                ),
                cell(fmt_time(row.get("next_attempt_at")) if row["status"] == "pending" else "-"),
                cell(row.get("last_error")),
                cell(fmt_time(row.get("created_at"))),
                action_cell(
                    [("retry", f"/outbox/{ref}/retry")] if retryable and can_operate else []
                ),
            ]
        )
    link: Region = {"kind": "link", "text": "", "href": None}
    if next_cursor:
        query = urlencode({k: v for k, v in (("status", status), ("cursor", next_cursor)) if v})
        link = {"kind": "link", "text": "next page", "href": f"/outbox?{query}"}
    return {
        "outbox-notice": {"kind": "text", "text": notice or ""},
        "outbox-counts": table(("status", "notifications"), count_rows, empty="-"),
        "outbox": table(OUTBOX_COLUMNS, lines, empty="no notifications"),
        "next": link,
    }
