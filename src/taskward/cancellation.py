"""Cancellation (ADR-0072 D5): immediate for unowned rows, cooperative for running ones.

- queued / waiting_dependency / retry_wait -> cancelled through ``transition_task``;
- running: record ``cancel_requested_at/by`` and a ``cancel_requested`` event, status unchanged;
  the owning worker forwards the request to the adapter's token, and the adapter's
  acknowledgement moves the run ``running -> cancelled`` under the lease guard;
- terminal: ``already_terminal``, nothing rewritten.
Requests are idempotent by key: the same key returns the original answer.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Mapping

from taskward.canonical import dumps
from taskward.errors import TaskNotFound, TaskValidationError
from taskward.ids import new_id
from taskward.lifecycle import Status, is_terminal
from taskward.loops import raise_if_cancelling
from taskward.models import (
    Actor,
    CancelResult,
    check_key,
    check_text,
    shown_text,
)
from taskward.registry import CancellationToken
from taskward.store.port import StateDB, Tx
from taskward.transitions import KeyAlreadyUsed, apply, cancelled, move_of, prepared

_DIRECT = (Status.QUEUED, Status.WAITING_DEPENDENCY, Status.RETRY_WAIT)
_MAX_ROUNDS = 8
MAX_REASON_LENGTH = 1000  # as the HTTP body's and the dashboard form's limit


def _cancel_key(key: str) -> str:
    return f"cancel:{key}"


async def _replayed(tx: Tx, task_id: str, key: str) -> CancelResult | None:
    fact = await tx.fetchone(
        "fact_get_by_key", {"entity_id": task_id, "idempotency_key": _cancel_key(key)}
    )
    if fact is not None:
        return CancelResult(task_id=task_id, state="cancelled", current_status=fact["status"])
    event = await tx.fetchone("event_get_cancel_request", {"task_id": task_id, "key": key})
    if event is not None:
        # ADR-0072 D5: "Repeated request with the same key: returns the original cancel result"
        # -- the status the task had when the request was recorded, stored in the event's
        # payload, not the task's status now. A request is recorded only on a running task, so
        # an event written before the payload carried it answers ``running``.
        payload = event["payload"]
        recorded = (json.loads(payload) if isinstance(payload, str) else payload or {}).get(
            "current_status"
        )
        return CancelResult(
            task_id=task_id,
            state="cancellation_requested",
            current_status=recorded if isinstance(recorded, str) else Status.RUNNING,
        )
    return None


def validate_cancel_request(idempotency_key: str, reason: str) -> None:
    """``request_task_cancel``'s checks of its key and reason, before any SQL (R14): the same
    key and text rules as admission, so a NUL or a lone surrogate is a validation error on both
    backends, never a driver error. The CLI asks before it announces a generated key."""
    check_key("idempotency_key", idempotency_key)
    if not isinstance(reason, str) or len(reason) > MAX_REASON_LENGTH:
        shown = f"{len(reason)} characters" if isinstance(reason, str) else reason
        raise TaskValidationError(
            "reason", shown, f"text of at most {MAX_REASON_LENGTH} characters"
        )
    check_text("reason", reason)


async def request_task_cancel(
    db: StateDB,
    task_id: str,
    *,
    actor: Actor,
    idempotency_key: str,
    reason: str = "",
    now: float | None = None,
) -> CancelResult:
    """Cancel ``task_id`` now when no worker owns it, else record a cooperative request.

    Raises:
        TaskNotFound: no such task.
        TaskValidationError: a bad idempotency key (the key rule of admission,
            ``models.check_key``) or reason (text of at most ``MAX_REASON_LENGTH`` characters).
    """
    validate_cancel_request(idempotency_key, reason)
    if not isinstance(task_id, str) or "\x00" in task_id or shown_text(task_id) != task_id:
        raise TaskNotFound(shown_text(task_id) if isinstance(task_id, str) else repr(task_id))
    for _ in range(_MAX_ROUNDS):
        try:
            async with db.transaction(now=now) as tx:
                replay = await _replayed(tx, task_id, idempotency_key)
                if replay is not None:
                    return replay
                row = await tx.fetchone("run_get", {"id": task_id})
                if row is None:
                    raise TaskNotFound(task_id)
                status = row["status"]
                if is_terminal(status):
                    return CancelResult(
                        task_id=task_id, state="already_terminal", current_status=status
                    )
                if status in _DIRECT:
                    built = cancelled(
                        task_id,
                        status,
                        actor=actor,
                        key=_cancel_key(idempotency_key),
                        summary=reason or "cancel requested",
                        now=tx.now,
                    )
                    [(result, _)] = await apply(tx, [move_of(*prepared(*built), tx.now)])
                    if result.applied:
                        return CancelResult(
                            task_id=task_id, state="cancelled", current_status=Status.CANCELLED
                        )
                    continue  # the row moved under us; look again
                # running: record the request; the owner's adapter decides when it stops.
                changed = await tx.execute(
                    "run_request_cancel",
                    {"id": task_id, "by": actor.label()},
                )
                if not changed:
                    continue
                tx.notify("cancel")
                await tx.execute(
                    "event_insert",
                    {
                        "id": new_id(),
                        "task_id": task_id,
                        "kind": "cancel_requested",
                        "transition_id": None,
                        "status": status,
                        "payload": dumps(
                            {
                                "idempotency_key": idempotency_key,
                                "actor": actor.label(),
                                "reason": reason,
                                "current_status": status,
                            }
                        ),
                    },
                )
                return CancelResult(
                    task_id=task_id, state="cancellation_requested", current_status=status
                )
        except KeyAlreadyUsed:
            continue  # a concurrent request with this key won: the next round replays it
    raise TaskNotFound(task_id)  # pragma: no cover - only under pathological churn


async def cancel_task(db: StateDB, run_id: str, *, actor: Actor, now: float | None = None) -> bool:
    """ADR-0071 form: True when the task is cancelled or cancellation was requested."""
    result = await request_task_cancel(
        db, run_id, actor=actor, idempotency_key=f"cancel_task:{uuid.uuid4()}", now=now
    )
    return result.state != "already_terminal"


# How often a running worker looks for recorded requests when no wake-up came (a fallback).
CANCEL_POLL_SECONDS = 1.0


async def watch_cancellations(
    db: StateDB,
    tokens: Callable[[], Mapping[str, CancellationToken]],
    *,
    poll_s: float = CANCEL_POLL_SECONDS,
) -> None:
    """Forward recorded cancellation requests to the running adapters' tokens, until cancelled.

    Wakes on the store's ``cancel`` signal (NOTIFY on PostgreSQL, in-process on SQLite) and
    polls every ``poll_s`` as a fallback.
    """
    signal = db.signal("cancel")
    while True:
        raise_if_cancelling()
        seen = signal.seq
        live = tokens()
        active = [task_id for task_id, token in live.items() if not token.is_cancelled]
        if active:
            with contextlib.suppress(Exception):
                rows = await db.fetchall("run_cancel_requested_among", {"ids": json.dumps(active)})
                for row in rows:
                    if row["id"] in live:
                        live[row["id"]].cancel("cancellation requested")
        await signal.wait(seen, poll_s)
