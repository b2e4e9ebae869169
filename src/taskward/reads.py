"""Read-side functions over the store: a task, listings, its transition facts and events."""

from __future__ import annotations

import base64
import json
from typing import Any, Final

from taskward.errors import TaskNotFound, TaskValidationError
from taskward.lifecycle import Status
from taskward.store.port import Row, StateDB

MAX_LIST_LIMIT: Final = 500


async def get_task(db: StateDB, task_id: str) -> Row:
    """The schedule_runs row of ``task_id`` as a dict; raises TaskNotFound."""
    row = await db.fetchone("run_get", {"id": task_id})
    if row is None:
        raise TaskNotFound(task_id)
    return row


async def list_transitions(db: StateDB, task_id: str) -> list[Row]:
    """The task's status_transitions facts, oldest first; raises TaskNotFound."""
    facts = await db.fetchall("fact_list", {"entity_id": task_id})
    if not facts:
        await get_task(db, task_id)
    return facts


async def list_task_events(db: StateDB, task_id: str) -> list[Row]:
    return await db.fetchall("event_list", {"task_id": task_id})


def _encode_cursor(row: Row) -> str:
    raw = json.dumps([row["created_at"], row["id"]]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created_at, task_id = json.loads(base64.urlsafe_b64decode(padded))
        return float(created_at), str(task_id)
    except (ValueError, TypeError) as exc:
        raise TaskValidationError("cursor", cursor, "a cursor returned by a previous page") from exc


async def list_tasks(
    db: StateDB,
    *,
    status: str | None = None,
    action_kind: str | None = None,
    execution_target: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[list[Row], str | None]:
    """Tasks newest first; returns ``(rows, next_cursor)`` (None on the last page)."""
    if status is not None and status not in {s.value for s in Status}:
        raise TaskValidationError("status", status, [s.value for s in Status])
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise TaskValidationError("limit", limit, f"1..{MAX_LIST_LIMIT}")
    cursor_at, cursor_id = _decode_cursor(cursor) if cursor else (None, None)
    params: dict[str, Any] = {
        "status": status,
        "action_kind": action_kind,
        "execution_target": execution_target,
        "cursor_created_at": cursor_at,
        "cursor_id": cursor_id,
        "limit": limit + 1,
    }
    rows = await db.fetchall("run_list", params)
    next_cursor = _encode_cursor(rows[limit - 1]) if len(rows) > limit else None
    return rows[:limit], next_cursor


async def count_by_status(db: StateDB) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for row in await db.fetchall("run_count_by_status"):
        counts[row["status"]] = int(row["n"])
    return counts


async def count_by_status_and_target(db: StateDB) -> list[Row]:
    """``{"status", "execution_target", "n"}`` for every pair that has tasks."""
    return [
        {"status": r["status"], "execution_target": r["execution_target"], "n": int(r["n"])}
        for r in await db.fetchall("run_count_by_status_target")
    ]


async def count_admissions_by_source(db: StateDB) -> dict[str, int]:
    """Tasks ever admitted, by ``admission_source``: a counter, since runs are never deleted
    (R11). Historical rows without a source count under ``"unknown"``."""
    return {
        (r["admission_source"] or "unknown"): int(r["n"])
        for r in await db.fetchall("run_count_by_source")
    }


async def count_transitions_by_edge(db: StateDB) -> list[Row]:
    """``{"previous_status", "status", "reason_code", "n"}``: transitions ever applied, by edge
    and reason. A counter: facts are append-only (ADR-0072 D3)."""
    return [
        {
            "previous_status": r["previous_status"],
            "status": r["status"],
            "reason_code": r["reason_code"],
            "n": int(r["n"]),
        }
        for r in await db.fetchall("fact_count_by_edge")
    ]


async def list_workers(
    db: StateDB, *, heartbeat_ttl: float, limit: int = 200, now: float | None = None
) -> list[Row]:
    """Workers, most recent heartbeat first, each with ``heartbeat_age_s`` and ``is_live``
    (a heartbeat is stale when ``now - last_heartbeat_at > heartbeat_ttl``, R6)."""
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise TaskValidationError("limit", limit, f"1..{MAX_LIST_LIMIT}")
    if now is None:
        now = await db.now()
    workers = await db.fetchall("worker_list", {"limit": limit})
    for worker in workers:
        age = max(0.0, now - float(worker["last_heartbeat_at"]))
        worker["heartbeat_age_s"] = age
        worker["is_live"] = age <= heartbeat_ttl
    return workers
