"""Read-side functions over the store: a task, listings, its transition facts and events."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from taskward.canonical import canonical_json
from taskward.cursors import decode_cursor, encode_cursor
from taskward.errors import TaskNotFound, TaskValidationError
from taskward.lifecycle import Status
from taskward.store.port import Row, StateDB

MAX_LIST_LIMIT: Final = 500

# A listing shows a preview of each task's args, never the args themselves (a page of 500 tasks
# with 1 MiB of args each was a 500 MiB answer): ``args_preview`` is at most ARGS_PREVIEW_CHARS
# characters of the (redacted) canonical JSON, then an ellipsis; ``args_bytes`` their stored size.
# The store sends args whole only up to ARGS_INLINE_BYTES (store/*/queries.sql ``run_list``).
ARGS_PREVIEW_CHARS: Final = 200
ARGS_INLINE_BYTES: Final = 2048
ELLIPSIS: Final = "\u2026"

# The value every ``args.env`` value is shown as: env values are secrets (API keys, tokens).
REDACTED: Final = "***"


def redact_args(args: Any) -> Any:
    """``args`` with each ``env`` value replaced by REDACTED, the variable names kept.

    The one redaction every read binding goes through (HTTP API, dashboard, CLI, SyncClient:
    they all read through ``get_task`` / ``list_tasks``). The worker never does: it executes
    the row the store hands its claim (``claims``), so a child still gets the real values.
    Returns ``args`` itself when there is nothing to redact; never mutates it.
    """
    if not isinstance(args, Mapping):
        return args
    env = args.get("env")
    if not isinstance(env, Mapping) or not env:
        return args
    return {**args, "env": dict.fromkeys(env, REDACTED)}


def args_preview(args: Any) -> str:
    """The redacted canonical JSON of ``args``, cut to ARGS_PREVIEW_CHARS plus an ellipsis."""
    return _cut(canonical_json(redact_args(args)))


def _cut(text: str) -> str:
    return text if len(text) <= ARGS_PREVIEW_CHARS else text[:ARGS_PREVIEW_CHARS] + ELLIPSIS


def _redacted_row(row: Row) -> Row:
    row["action_args"] = redact_args(row.get("action_args"))
    return row


async def get_task(db: StateDB, task_id: str, *, reveal_env: bool = False) -> Row:
    """The schedule_runs row of ``task_id`` as a dict; raises TaskNotFound.

    ``action_args.env`` values are redacted (``redact_args``) unless ``reveal_env``: this is
    what every binding shows. The row a worker executes comes from its claim, not from here.
    """
    row = await db.fetchone("run_get", {"id": task_id})
    if row is None:
        archived = await _archived(db, task_id)
        if archived is None:
            raise TaskNotFound(task_id)
        row = {**archived["run"], "archived": True, "archived_at": archived["archived_at"]}
    return row if reveal_env else _redacted_row(row)


async def _archived(db: StateDB, task_id: str) -> dict[str, Any] | None:
    """R23: an archived task's document (``archive``), with its ``archived_at``; None when the
    id names no archived task. Read only once the live row is missing."""
    row = await db.fetchone("archived_run_get", {"id": task_id})
    if row is None:
        return None
    document = row["document"]
    document = json.loads(document) if isinstance(document, str) else dict(document)
    return {**document, "archived_at": row["archived_at"]}


async def list_transitions(db: StateDB, task_id: str) -> list[Row]:
    """The task's status_transitions facts, oldest first; raises TaskNotFound. An archived
    task's (R23) come from its archived document."""
    facts = await db.fetchall("fact_list", {"entity_id": task_id})
    if not facts and await db.fetchone("run_status", {"id": task_id}) is None:
        archived = await _archived(db, task_id)
        if archived is None:
            raise TaskNotFound(task_id)
        return list(archived.get("facts") or [])
    return facts


async def list_task_events(db: StateDB, task_id: str) -> list[Row]:
    """The task's events, oldest first (an archived task's from its document, R23)."""
    events = await db.fetchall("event_list", {"task_id": task_id})
    if not events and await db.fetchone("run_status", {"id": task_id}) is None:
        archived = await _archived(db, task_id)
        return list(archived.get("events") or []) if archived else []
    return events


async def list_tasks(
    db: StateDB,
    *,
    status: str | None = None,
    action_kind: str | None = None,
    execution_target: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
    full_args: bool = False,
) -> tuple[list[Row], str | None]:
    """Tasks newest first; returns ``(rows, next_cursor)`` (None on the last page).

    A row is the task's row without ``action_args``, with ``args_preview`` (``args_preview``)
    and ``args_bytes`` instead, so a page's size is bounded whatever the args (``get_task``
    has them whole). ``full_args=True`` adds ``action_args`` (redacted, as ``get_task``'s),
    read whole from the store: for library callers that need them, at their memory's cost.
    """
    if status is not None and status not in {s.value for s in Status}:
        raise TaskValidationError("status", status, [s.value for s in Status])
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise TaskValidationError("limit", limit, f"1..{MAX_LIST_LIMIT}")
    cursor_at, cursor_id = decode_cursor(cursor) if cursor else (None, None)
    params: dict[str, Any] = {
        "status": status,
        "action_kind": action_kind,
        "execution_target": execution_target,
        "cursor_created_at": cursor_at,
        "cursor_id": cursor_id,
        "limit": limit + 1,
        "full_args": bool(full_args),
        "args_inline_bytes": ARGS_INLINE_BYTES,
        # One more than shown, so a head that was cut gets its ellipsis.
        "args_head_chars": ARGS_PREVIEW_CHARS + 1,
    }
    rows = await db.fetchall("run_list", params)
    next_cursor = encode_cursor(rows[limit - 1]) if len(rows) > limit else None
    return [_listed(row, full_args=full_args) for row in rows[:limit]], next_cursor


async def list_retries(db: StateDB, task_id: str, *, limit: int = 50) -> list[Row]:
    """The tasks ``retry_task`` admitted from ``task_id`` (R19: admission source ``retry``,
    ``chain_parent_id`` naming it), oldest first, at most ``limit``; each row has ``id``,
    ``status``, ``created_at`` and ``idempotency_key``. An unknown id has none. One range of
    ``idx_schedule_runs_chain_parent`` (migration 0011).
    """
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise TaskValidationError("limit", limit, f"1..{MAX_LIST_LIMIT}")
    return await db.fetchall("run_list_retries", {"task_id": task_id, "limit": limit})


def _listed(row: Row, *, full_args: bool) -> Row:
    """A run_list row as a listing shows it: the preview from the whole args when the store
    sent them (redacted, canonical), else from its head (cut in SQL, ``env`` already removed:
    the store's JSON text, which on PostgreSQL is jsonb's own spacing and key order)."""
    args = row.pop("action_args", None)
    head = row.pop("args_head", None)
    row["args_bytes"] = int(row["args_bytes"] or 0)
    row["args_preview"] = args_preview(args) if head is None else _cut(head)
    if full_args:
        row["action_args"] = redact_args(args)
    return row


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


# A worker's state (issue 28): ``stopped`` once it recorded a clean stop (it wins: the row of a
# stopped worker keeps its last heartbeat), ``stale`` when its heartbeat is older than the TTL
# without one (R6: it claims nothing; it probably crashed), else ``live``.
WORKER_STATES: Final = ("live", "stale", "stopped")


def worker_state(worker: Mapping[str, Any], *, heartbeat_ttl: float, now: float) -> str:
    """``live``, ``stale`` or ``stopped`` (``WORKER_STATES``) of a ``workers`` row at ``now``."""
    if worker.get("stopped_at") is not None:
        return "stopped"
    return "live" if now - float(worker["last_heartbeat_at"]) <= heartbeat_ttl else "stale"


async def list_workers(
    db: StateDB, *, heartbeat_ttl: float, limit: int = 200, now: float | None = None
) -> list[Row]:
    """Workers, most recent heartbeat first, each with ``heartbeat_age_s``, ``state``
    (``worker_state``), ``lease_task_ids`` (every running task whose lease it holds, read for
    the whole page in one statement) and ``is_live`` (``state == "live"``; kept for callers
    from before ``state``)."""
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise TaskValidationError("limit", limit, f"1..{MAX_LIST_LIMIT}")
    if now is None:
        now = await db.now()
    workers = await db.fetchall("worker_list", {"limit": limit})
    leases: dict[str, list[str]] = {}
    if workers:
        ids = canonical_json([w["worker_id"] for w in workers])
        for row in await db.fetchall("worker_leases", {"worker_ids": ids}):
            leases.setdefault(row["worker_id"], []).append(row["id"])
    for worker in workers:
        worker["heartbeat_age_s"] = max(0.0, now - float(worker["last_heartbeat_at"]))
        worker["state"] = worker_state(worker, heartbeat_ttl=heartbeat_ttl, now=now)
        worker["is_live"] = worker["state"] == "live"
        worker["lease_task_ids"] = leases.get(worker["worker_id"], [])
    return workers
