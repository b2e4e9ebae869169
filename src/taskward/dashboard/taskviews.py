"""View model of a task's page: its fields (times readable, each with its instant for the page's
script to show it in the reader's zone beside UTC), one output block, the evidence as
readable fields, the timeline from the facts, and the links to the task it retries and the
tasks that retried it.

A task's output is shown once: the last evidence's ``output_tail`` (a process adapter's), else
an error of more than one line (a traceback), in one monospace block with its newlines. The
reason, error and timeline show one line each. An ended task shows no lease or deadline: they
describe a claim that is over.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from taskward.dashboard.listviews import first_line, priority_text
from taskward.dashboard.views import (
    TERMINAL_STATUSES,
    Region,
    cell,
    fmt_duration,
    fmt_runs_at,
    fmt_time,
    limit_href,
    runs_at,
    status_cell,
    table,
    task_href,
)

# What the flash says after the cancel form's redirect (``?cancel=<state>``).
CANCEL_FLASH: Final = {
    "cancelled": "cancelled: the task will not run",
    "cancellation_requested": "cancellation requested: the worker running it stops it "
    "and the task ends as cancelled",
    "already_terminal": "not cancelled: the task had already ended",
}
_EVIDENCE_LABELS: Final = {
    "argv0": "program",
    "exit_code": "exit code",
    "duration_s": "ran",
    "output_bytes": "output",
    "output_truncated": "output cut",
    "memory_limit_mb": "memory limit",
}
_EVIDENCE_SKIP: Final = frozenset({"kind", "output_tail"})


def iso(at: Any) -> str | None:
    if not isinstance(at, int | float) or isinstance(at, bool):
        return None
    return datetime.fromtimestamp(float(at), tz=UTC).isoformat(timespec="seconds")


def time_item(key: str, label: str, at: Any, suffix: str = "") -> dict[str, Any]:
    """A field holding an instant: the UTC text, and ``at`` (epoch seconds) for the page's
    script, which writes the reader's local time beside it."""
    item: dict[str, Any] = {"key": key, "label": label, "text": fmt_time(at) + suffix}
    if iso(at) is not None:
        item["at"] = float(at)
        item["iso"] = iso(at)
    return item


def started_at(facts: Sequence[Mapping[str, Any]]) -> float | None:
    """When the task's last attempt started: its last fact into ``running``."""
    runs = [float(f["created_at"]) for f in facts if f.get("status") == "running"]
    return runs[-1] if runs else None


def reason_text(row: Mapping[str, Any]) -> str:
    code = row.get("status_reason_code")
    summary = first_line(row.get("status_reason_summary"), 300)
    if code and summary:
        return f"{code}: {summary}"
    return code or summary or "-"


def output_text(row: Mapping[str, Any]) -> str:
    """The task's output, once: the last evidence's output tail, else an error of more than
    one line; empty when it has neither."""
    for ref in reversed(row.get("status_evidence_refs") or []):
        tail = ref.get("output_tail") if isinstance(ref, Mapping) else None
        if isinstance(tail, str) and tail.strip():
            return tail.rstrip("\n")
    error = str(row.get("error_detail") or "")
    return error.rstrip("\n") if "\n" in error.strip() else ""


def _evidence_value(key: str, value: Any) -> tuple[str, dict[str, Any]]:
    extra: dict[str, Any] = {}
    if key.endswith("_at") and iso(value) is not None:
        extra = {"at": float(value), "iso": iso(value)}
        return fmt_time(value), extra
    if key.endswith("_s") and isinstance(value, int | float) and not isinstance(value, bool):
        return fmt_duration(float(value)), extra
    if key == "output_bytes" and isinstance(value, int):
        return (f"{value} bytes" if value < 2048 else f"{value / 1024:.1f} KiB"), extra
    if key.endswith("_mb") and isinstance(value, int | float):
        return f"{value:g} MiB", extra
    if isinstance(value, bool):
        return ("yes" if value else "no"), extra
    if value is None:
        return "-", extra
    if isinstance(value, str | int | float):
        return str(value), extra
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return ", ".join(str(v) for v in value), extra
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str), extra


def evidence_region(refs: Any) -> Region:
    """The last transition's evidence as fields, one group per reference (its ``kind`` as the
    group's first line); times, durations and sizes in words; the output tail left to the
    output block."""
    items: list[dict[str, Any]] = []
    for n, ref in enumerate(refs or []):
        if not isinstance(ref, Mapping):
            continue
        items.append(
            {"key": f"evidence-{n}", "label": "evidence", "text": str(ref.get("kind") or "-")}
        )
        for key, value in ref.items():
            if key in _EVIDENCE_SKIP:
                continue
            text, extra = _evidence_value(str(key), value)
            label = _EVIDENCE_LABELS.get(str(key), str(key).replace("_", " "))
            items.append({"key": f"evidence-{n}-{key}", "label": label, "text": text, **extra})
    return {"kind": "fields", "items": items, "empty": "no evidence recorded"}


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


def _claim_items(row: Mapping[str, Any], now: float) -> list[dict[str, Any]]:
    """Who holds a running task and until when; nothing for any other status."""
    if row["status"] != "running":
        return []
    items = [{"key": "leased_by", "label": "leased by", "text": row.get("leased_by") or "-"}]
    if row.get("lease_expires_at") is not None:
        left = float(row["lease_expires_at"]) - now
        items.append(
            time_item(
                "lease_expires",
                "lease expires",
                row["lease_expires_at"],
                f" (in {fmt_duration(left)})" if left >= 0 else " (lapsed)",
            )
        )
    if row.get("deadline_at") is not None:
        items.append(time_item("deadline", "deadline", row["deadline_at"]))
    return items


def field_items(
    row: Mapping[str, Any],
    placement: Mapping[str, Any] | None,
    facts: Sequence[Mapping[str, Any]],
    now: float,
) -> list[dict[str, Any]]:
    status = row["status"]
    items: list[dict[str, Any]] = [
        {"key": "status", "label": "status", "text": status, "cls": f"status status-{status}"},
    ]
    at = runs_at(row, now)
    if at is not None:
        items.append({"key": "runs_at", "label": "runs at", "text": fmt_runs_at(at, now)})
    items.append({"key": "reason", "label": "reason", "text": reason_text(row)})
    error = first_line(row.get("error_detail"), 300)
    if error:
        items.append({"key": "error", "label": "error", "text": error})
    if row.get("exit_code") is not None:
        items.append({"key": "exit_code", "label": "exit code", "text": str(row["exit_code"])})
    items += [
        {"key": "kind", "label": "kind", "text": row["action_kind"]},
        {"key": "target", "label": "target", "text": row.get("execution_target") or "-"},
    ]
    capabilities = ", ".join(row.get("required_capabilities") or [])
    if capabilities:
        items.append({"key": "capabilities", "label": "capabilities", "text": capabilities})
    priority = priority_text(row)
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
    items.append({"key": "attempts", "label": "attempts", "text": attempts_text(row)})
    items += _claim_items(row, now)
    items.append(time_item("created", "created", row.get("created_at")))
    started = started_at(facts)
    if started is not None:
        items.append(time_item("started", "started", started))
    if row.get("ended_at") is not None:
        items.append(time_item("ended", "ended", row["ended_at"]))
    if started is not None:
        end = float(row["ended_at"]) if status in TERMINAL_STATUSES and row.get("ended_at") else now
        so_far = "" if status in TERMINAL_STATUSES else " so far"
        items.append({"key": "ran", "label": "ran", "text": fmt_duration(end - started) + so_far})
    items += [
        {"key": "key", "label": "idempotency key", "text": row.get("idempotency_key") or "-"},
        {"key": "source", "label": "admitted by", "text": row.get("admission_source") or "-"},
    ]
    if row.get("cancel_requested_at") is not None:
        by = row.get("cancel_requested_by") or "-"
        items.append(
            time_item(
                "cancel_requested", "cancel requested", row["cancel_requested_at"], f" by {by}"
            )
        )
    if placement is not None:
        items.append(placement_item(placement))
    return items


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def task_regions(
    row: Mapping[str, Any],
    placement: Mapping[str, Any] | None,
    facts: Sequence[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
    retries: Sequence[Mapping[str, Any]] | None = None,
    *,
    now: float,
) -> dict[str, Region]:
    """The task's page. ``retries`` (``reads.list_retries``) adds its "Retried as" regions;
    without them the page keeps the ones it was rendered with. A field shown only sometimes
    (when it runs, priority, limit key, the lease of a running task) is left out, not drawn
    as "-", when it does not apply."""
    status = row["status"]
    output = output_text(row)
    regions: dict[str, Region] = {
        "fields": {"kind": "fields", "items": field_items(row, placement, facts, now)},
        "args": {"kind": "pre", "text": _pretty(row.get("action_args"))},
        "output-section": {"kind": "toggle", "visible": bool(output)},
        "output": {"kind": "pre", "text": output},
        "evidence": evidence_region(row.get("status_evidence_refs")),
        "timeline": timeline_region(row, facts, events),
        "cancel": {
            "kind": "toggle",
            "visible": status not in TERMINAL_STATUSES and row.get("cancel_requested_at") is None,
        },
        "retry": {"kind": "toggle", "visible": status in TERMINAL_STATUSES},
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


_EVENT_TITLES: Final = {
    "cancel_requested": "cancellation requested",
    "stale_result": "result of a stale owner kept as evidence",
}


def timeline_region(
    row: Mapping[str, Any],
    facts: Iterable[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
) -> Region:
    """The task's life from its transition facts (plus cancellation requests), oldest first;
    one line of detail each (the output is the page's output block)."""
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
        summary = first_line(fact.get("reason_summary"), 160)
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
        items.append(
            {
                "at": float(event["created_at"]),
                "time": fmt_time(event["created_at"]),
                "title": _EVENT_TITLES.get(str(event.get("kind")), str(event.get("kind"))),
                "detail": first_line(payload.get("reason") or payload.get("detail"), 160),
                "actor": str(payload.get("actor") or ""),
                "cls": "event",
            }
        )
    items.sort(key=lambda i: i["at"])
    for item in items:
        item["iso"] = iso(item["at"])
    return {"kind": "timeline", "items": items}


def cancel_flash(state: str | None) -> str | None:
    return CANCEL_FLASH.get(state or "")
