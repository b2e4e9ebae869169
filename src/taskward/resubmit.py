"""Operator retry (DESIGN.md R19): ADR-0072's "new submission" of a task that has ended.

A retry never changes the original: it admits a new task with the original's application
(kind, args, target, capabilities, library reference), through the one admission statement,
keyed ``retry:<task-id>:<operator key>`` so the same operator key returns the same new task
forever, with ``chain_parent_id`` naming the original, ``chain_depth`` one more, admission
source ``retry``, and the operator and the original recorded in its ``trigger_context``. Only a
terminal task is retried (``TaskNotRetryable`` otherwise); its row, facts and events stay as
they are.
"""

from __future__ import annotations

from typing import Final

from taskward.admission import insert_params, replayed_admission, validate_admission
from taskward.canonical import dumps
from taskward.errors import TaskNotFound, TaskNotRetryable, TaskValidationError
from taskward.lifecycle import is_terminal
from taskward.models import MAX_KEY_LENGTH, Actor, TaskApplication, check_key, shown_text
from taskward.registry import TaskAdapterRegistry
from taskward.store.port import StateDB
from taskward.tracing import admission_span

RETRY_KEY_PREFIX: Final = "retry:"


def retry_key(task_id: str, idempotency_key: str) -> str:
    """The new task's admission key: ``retry:<task-id>:<operator key>`` (R19)."""
    return f"{RETRY_KEY_PREFIX}{task_id}:{idempotency_key}"


async def retry_task(
    db: StateDB,
    task_id: str,
    *,
    actor: Actor,
    idempotency_key: str,
    registry: TaskAdapterRegistry | None = None,
    now: float | None = None,
) -> str:
    """Admit a terminal task again as a new task and return the new task's id (the same id for
    the same ``idempotency_key``).

    Raises:
        TaskNotFound: no task has ``task_id``.
        TaskNotRetryable: the task has not ended.
        TaskValidationError: a bad ``idempotency_key`` (admission's key rule, with room for the
            ``retry:<task-id>:`` prefix), or an application today's registry refuses (a kind
            no longer registered, args its adapter no longer accepts); nothing is written.
    """
    check_key("idempotency_key", idempotency_key)
    if not isinstance(task_id, str) or shown_text(task_id) != task_id or "\x00" in task_id:
        raise TaskNotFound(shown_text(task_id) if isinstance(task_id, str) else repr(task_id))
    key = retry_key(task_id, idempotency_key.strip())
    if len(key) > MAX_KEY_LENGTH:
        room = MAX_KEY_LENGTH - len(retry_key(task_id, ""))
        raise TaskValidationError(
            "idempotency_key",
            f"{len(idempotency_key.strip())} characters",
            f"at most {room} characters (the new task's key is retry:<task-id>:<key>)",
        )
    row = await db.fetchone("run_get", {"id": task_id})
    if row is None:
        raise TaskNotFound(task_id)
    if not is_terminal(row["status"]):
        raise TaskNotRetryable(task_id, row["status"])
    app = TaskApplication(
        action_kind=row["action_kind"],
        args=row["action_args"] or {},
        execution_target=row["execution_target"],
        idempotency_key=key,
        required_capabilities=list(row["required_capabilities"] or []),
        library_ref=row["library_ref"],
        library_content_hash=row["library_content_hash"],
        # R15-R20: the original's priority, limit key and attempt ceiling come along (a ceiling
        # above the per-task range, a queue setting of over 100, is resolved again); its
        # run_after does not: a retry runs now.
        priority=int(row["priority"]),
        limit_key=row["limit_key"],
        max_attempts=ceiling if 1 <= (ceiling := int(row["max_attempts"])) <= 100 else None,
    )
    admitted = validate_admission(app, registry, "retry")
    with admission_span("retry", kind=admitted.action_kind, key=admitted.idempotency_key) as span:
        params = insert_params(
            admitted,
            "retry",
            row["schedule_id"],
            now,
            trigger_context=dumps({"retry_of": task_id, "actor": actor.label()}),
            chain_parent_id=task_id,
            chain_depth=int(row["chain_depth"] or 0) + 1,
            trace_context=span.trace_context,
        )
        if await db.execute("run_insert_if_new", params):
            db.wake("queued")
            span.admitted(params["id"], True)
            return str(params["id"])
        existing = await db.fetchone(
            "run_get_by_key", {"idempotency_key": admitted.idempotency_key}
        )
        replayed = replayed_admission(admitted, existing).task_id
        span.admitted(replayed, False)
        return replayed


__all__ = ["RETRY_KEY_PREFIX", "retry_key", "retry_task"]
