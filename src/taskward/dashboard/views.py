"""View models of the dashboard: rows from the library -> regions of a page.

A region is plain JSON (a table, a field list, a timeline, a link or a toggle). The server
renders it into the first HTML (``templates/regions.html``) and the page's script re-renders it
from ``/ui/data/...`` while the page is open (``static/dashboard.js``), so both draw the same
thing from one description. Values are text here; escaping happens where they are drawn
(Jinja autoescape on the server, ``textContent`` in the browser), never by building HTML.
"""

from __future__ import annotations

import json
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


def cell(text: Any, *, href: str | None = None, cls: str | None = None) -> Cell:
    out: Cell = {"text": "-" if text is None or text == "" else str(text)}
    if href:
        out["href"] = href
    if cls:
        out["cls"] = cls
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


def _priority_text(row: Mapping[str, Any]) -> str | None:
    priority = row.get("priority") or 0
    return f"{priority:+d}" if priority else None


def _attempts_of(row: Mapping[str, Any]) -> str:
    taken = row.get("lease_attempts") or 0
    ceiling = row.get("max_attempts")
    return str(taken) if ceiling is None else f"{taken}/{ceiling}"


def task_rows(rows: Iterable[Mapping[str, Any]], now: float) -> list[list[Cell]]:
    return [
        [
            cell(row["id"], href=task_href(row["id"]), cls="mono"),
            task_status_cell(row, now),
            cell(row["action_kind"]),
            cell(row.get("execution_target")),
            cell(_priority_text(row), cls="priority"),
            cell(_attempts_of(row)),
            cell(fmt_time(row.get("created_at"))),
            cell(row.get("status_reason_code")),
        ]
        for row in rows
    ]


TASK_COLUMNS = ("id", "status", "kind", "target", "priority", "attempts", "created", "reason")


def counts_region(pairs: Iterable[Mapping[str, Any]]) -> Region:
    """Status x execution target, with totals; every number links to the filtered list."""
    grid: dict[tuple[str, str], int] = {}
    for row in pairs:
        key = (row["status"], row["execution_target"] or "")
        grid[key] = grid.get(key, 0) + int(row["n"])
    targets = TARGETS + sorted({t for _, t in grid if t not in TARGETS})
    rows = []
    for status in STATUSES:
        line = [status_cell(status)]
        for target in targets:
            n = grid.get((status, target), 0)
            line.append(cell(n, href=tasks_href(status=status, target=target) if n else None))
        total = sum(grid.get((status, t), 0) for t in targets)
        line.append(cell(total, href=tasks_href(status=status) if total else None, cls="total"))
        rows.append(line)
    totals = [cell("all", cls="total")]
    for target in targets:
        n = sum(grid.get((s, target), 0) for s in STATUSES)
        totals.append(cell(n, href=tasks_href(target=target) if n else None, cls="total"))
    totals.append(cell(sum(grid.values()), href=tasks_href(), cls="total"))
    rows.append(totals)
    return table(["status", *(t or "(none)" for t in targets), "total"], rows, empty="no tasks")


def overview_regions(
    pairs: Iterable[Mapping[str, Any]], recent: Iterable[Mapping[str, Any]], now: float
) -> dict[str, Region]:
    """The overview's tasks; its workers regions are ``workerviews.workers_regions``'."""
    return {
        "counts": counts_region(pairs),
        "recent": table(TASK_COLUMNS, task_rows(recent, now), empty="no tasks yet"),
    }


def tasks_regions(
    rows: Sequence[Mapping[str, Any]],
    next_cursor: str | None,
    filters: Mapping[str, str | None],
    now: float,
) -> dict[str, Region]:
    """The list, its next-page link and, when it is filtered to an ended status, what the bulk
    retry form posts: the ids shown (kept current while the page polls) and their count."""
    link: Region = {"kind": "link", "text": "", "href": None}
    if next_cursor:
        link = {
            "kind": "link",
            "text": "next page",
            "href": tasks_href(**filters, cursor=next_cursor),
        }
    regions: dict[str, Region] = {
        "tasks": table(TASK_COLUMNS, task_rows(rows, now), empty="no tasks match"),
        "next": link,
    }
    if filters.get("status") in TERMINAL:
        regions["bulk-retry"] = {"kind": "toggle", "visible": bool(rows)}
        regions["bulk-ids"] = {"kind": "value", "value": " ".join(row["id"] for row in rows)}
        regions["bulk-count"] = {"kind": "text", "text": str(len(rows))}
    return regions


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def task_regions(
    row: Mapping[str, Any],
    placement: Mapping[str, Any] | None,
    facts: Iterable[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
    retries: Sequence[Mapping[str, Any]] | None = None,
    *,
    now: float,
) -> dict[str, Region]:
    """The task's page. ``retries`` (``reads.list_retries``) adds its "Retried as" regions;
    without them the page keeps the ones it was rendered with. A field shown only sometimes
    (when it runs, priority, limit key) is left out, not drawn as "-", when it does not apply."""
    status = row["status"]
    items: list[dict[str, Any]] = [
        {"key": "status", "label": "status", "text": status, "cls": f"status status-{status}"},
    ]
    at = runs_at(row, now)
    if at is not None:
        items.append({"key": "runs_at", "label": "runs at", "text": fmt_runs_at(at, now)})
    items += [
        {"key": "reason", "label": "reason", "text": _reason_text(row)},
        {"key": "kind", "label": "kind", "text": row["action_kind"]},
        {"key": "target", "label": "target", "text": row.get("execution_target") or "-"},
        {
            "key": "capabilities",
            "label": "capabilities",
            "text": ", ".join(row.get("required_capabilities") or []) or "-",
        },
    ]
    priority = _priority_text(row)
    if priority is not None:
        items.append({"key": "priority", "label": "priority", "text": priority})
    limit_key = row.get("limit_key")
    if limit_key:
        items.append(
            {
                "key": "limit_key",
                "label": "limit key",
                "text": limit_key,
                "href": limit_href(limit_key),
            }
        )
    items += [
        {"key": "attempts", "label": "attempts", "text": attempts_text(row)},
        {"key": "leased_by", "label": "leased by", "text": row.get("leased_by") or "-"},
        {"key": "created", "label": "created", "text": fmt_time(row.get("created_at"))},
        {"key": "ended", "label": "ended", "text": fmt_time(row.get("ended_at"))},
        {"key": "exit_code", "label": "exit code", "text": _text(row.get("exit_code"))},
        {"key": "error", "label": "error", "text": row.get("error_detail") or "-"},
        {"key": "key", "label": "idempotency key", "text": row.get("idempotency_key") or "-"},
        {"key": "source", "label": "admitted by", "text": row.get("admission_source") or "-"},
    ]
    if row.get("cancel_requested_at") is not None:
        items.append(
            {
                "key": "cancel_requested",
                "label": "cancel requested",
                "text": f"{fmt_time(row['cancel_requested_at'])} by "
                f"{row.get('cancel_requested_by') or '-'}",
            }
        )
    if placement is not None:
        items.append(placement_item(placement))
    regions: dict[str, Region] = {
        "fields": {"kind": "fields", "items": items},
        "args": {"kind": "pre", "text": _pretty(row.get("action_args"))},
        "evidence": {"kind": "pre", "text": _pretty(row.get("status_evidence_refs") or [])},
        "timeline": timeline_region(row, facts, events),
        "cancel": {
            "kind": "toggle",
            "visible": status not in TERMINAL and row.get("cancel_requested_at") is None,
        },
        "retry": {"kind": "toggle", "visible": status in TERMINAL},
        "retry-of": retry_of_region(row),
    }
    if retries is not None:
        regions["retried"] = {"kind": "toggle", "visible": bool(retries)}
        regions["retries"] = table(
            ("task", "status", "created", "idempotency key"),
            (
                [
                    cell(r["id"], href=task_href(r["id"]), cls="mono"),
                    status_cell(r["status"]),
                    cell(fmt_time(r.get("created_at"))),
                    cell(r.get("idempotency_key"), cls="mono"),
                ]
                for r in retries
            ),
            empty="not retried",
        )
    return regions


def attempts_text(row: Mapping[str, Any]) -> str:
    """``attempt 2 of 3``: the leases taken of the ceiling stored on the row (R18)."""
    taken = int(row.get("lease_attempts") or 0)
    ceiling = row.get("max_attempts")
    if ceiling is None:
        return str(taken)
    if taken == 0:
        return f"no attempt yet (at most {ceiling})"
    return f"attempt {taken} of {ceiling}"


def placement_item(placement: Mapping[str, Any]) -> dict[str, Any]:
    """Why a queued task is not running. Held by a limit (R20), it links to that limit on the
    limits page, and the key is set off by a dash (keys hold colons: ``kind:send_email``)."""
    text = str(placement["reason"])
    item: dict[str, Any] = {"key": "placement", "label": "placement", "text": text}
    key = placement.get("limit_key")
    if key:
        prefix = f"held by limit {key}: "
        if text.startswith(prefix):
            item["text"] = f"held by limit {key} \u2014 {text[len(prefix) :]}"
        item["href"] = limit_href(str(key))
    return item


def retry_of_region(row: Mapping[str, Any]) -> Region:
    """A link to the task this one is an operator retry of (R19), or an empty link."""
    parent = row.get("chain_parent_id")
    if row.get("admission_source") != "retry" or not parent:
        return {"kind": "link", "text": "", "href": None}
    return {"kind": "link", "text": str(parent), "href": task_href(str(parent))}


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


def _reason_text(row: Mapping[str, Any]) -> str:
    code = row.get("status_reason_code")
    summary = row.get("status_reason_summary")
    if code and summary:
        return f"{code}: {summary}"
    return code or summary or "-"


def timeline_region(
    row: Mapping[str, Any],
    facts: Iterable[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
) -> Region:
    """The task's life from its transition facts (plus cancellation requests), oldest first."""
    items: list[dict[str, Any]] = [
        {
            "at": float(row["created_at"]),
            "time": fmt_time(row["created_at"]),
            "title": "admitted as queued",
            "detail": f"by {row.get('admission_source') or '-'}",
            "actor": "",
            "cls": "status-queued",
        }
    ]
    for fact in facts:
        previous = fact.get("previous_status") or "-"
        summary = fact.get("reason_summary") or ""
        items.append(
            {
                "at": float(fact["created_at"]),
                "time": fmt_time(fact["created_at"]),
                "title": f"{previous} \u2192 {fact['status']}",
                "detail": f"{fact['reason_code']}" + (f": {summary}" if summary else ""),
                "actor": fact.get("actor") or "",
                "lease": fact.get("lease_id") or "",
                "cls": f"status-{fact['status']}",
            }
        )
    for event in events:
        if event.get("kind") == "transition":
            continue  # the fact above is this change
        payload = event.get("payload") or {}
        title = {
            "cancel_requested": "cancellation requested",
            "stale_result": "result of a stale owner kept as evidence",
        }.get(str(event.get("kind")), str(event.get("kind")))
        items.append(
            {
                "at": float(event["created_at"]),
                "time": fmt_time(event["created_at"]),
                "title": title,
                "detail": str(payload.get("reason") or payload.get("detail") or ""),
                "actor": str(payload.get("actor") or ""),
                "cls": "event",
            }
        )
    items.sort(key=lambda i: i["at"])
    for item in items:
        del item["at"]
    return {"kind": "timeline", "items": items}


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
