"""``submit_task``: the only code that inserts a run (ADR-0072 D1/D2, DESIGN.md R8); its
``admit_task`` form also says whether the call inserted the row (HTTP's 201 or 200).

Validation and canonicalisation happen before any SQL; a failure writes nothing. The insert is
``INSERT ... ON CONFLICT DO NOTHING`` followed by a read and a hash comparison, so the same key
with the same application returns the original id forever, and a different application raises
``TaskIdempotencyConflict`` without touching either task.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

from taskward.adapters import build_registry
from taskward.applications import ADMISSION_SOURCES as ADMISSION_SOURCES
from taskward.applications import MAX_ARGS_BYTES as MAX_ARGS_BYTES
from taskward.applications import MAX_CAPABILITIES as MAX_CAPABILITIES
from taskward.applications import MAX_CAPABILITY_LENGTH as MAX_CAPABILITY_LENGTH
from taskward.applications import MAX_KEY_LENGTH as MAX_KEY_LENGTH
from taskward.applications import AdmittedApplication as AdmittedApplication
from taskward.applications import application_hash_of as application_hash_of
from taskward.applications import validate_application as validate_application
from taskward.canonical import dumps
from taskward.dependencies import link_admitted
from taskward.errors import TaskIdempotencyConflict, TaskValidationError
from taskward.ids import new_id
from taskward.models import TaskApplication
from taskward.registry import TaskAdapterRegistry
from taskward.store.open import (
    caller_transaction,
    in_driver_thread,
    is_async_connection,
    is_caller_connection,
)
from taskward.store.port import Params, Row, StateDB, SyncStatements, Tx
from taskward.tracing import NOT_TRACED, Admitting, admission_span

T = TypeVar("T")


@dataclass(frozen=True)
class Admission:
    """What ``admit_task`` decided: the task id, and whether this call inserted the row (False
    when the key had already admitted the same application)."""

    task_id: str
    created: bool


async def submit_task(
    db: StateDB | Any,
    app: TaskApplication,
    *,
    registry: TaskAdapterRegistry | None = None,
    admission_source: str = "library",
    schedule_id: str | None = None,
    now: float | None = None,
) -> str:
    """Admit ``app`` as a queued run and return its id (the existing id for a replayed key).

    ``db`` is a store (``open_db``), or (R24) the caller's own connection in an open
    transaction (``store.open.CALLER_CONNECTIONS``): the row and its wake-up then commit with
    the caller's transaction or not at all (``submit_task_sync`` for a synchronous one from code
    without an event loop). In a caller's transaction the time is the store's (``now`` is not
    used) and the key's semantics are the same: a concurrent transaction holding the same key
    makes this one wait until it ends, then return its task or conflict.

    Raises:
        TaskValidationError: bad input (nothing written); AdapterNotRegistered for the kind.
        TaskIdempotencyConflict: the key already admitted a different application.
    """
    if is_caller_connection(db):
        return await _submit_in(db, app, registry, admission_source)
    admission = await admit_task(
        db,
        app,
        registry=registry,
        admission_source=admission_source,
        schedule_id=schedule_id,
        now=now,
    )
    return admission.task_id


async def _submit_in(
    conn: Any, app: TaskApplication, registry: TaskAdapterRegistry | None, admission_source: str
) -> str:
    """R24: ``app`` admitted in the caller's transaction on ``conn`` (``admit_in``, in a
    savepoint of it: a conflict or a missing dependency undoes only admission's writes)."""
    admitted = validate_admission(app, registry, admission_source)
    # The span is this thread's: the driver's thread below gets its context explicitly.
    with admission_span(
        admission_source, kind=admitted.action_kind, key=admitted.idempotency_key
    ) as span:
        # A driver that confines its connection to a thread of its own (aiosqlite) runs the
        # whole admission there, synchronously: every await in it is of a call already done.
        threaded = await in_driver_thread(
            conn, lambda raw: _completed(_admit_on(raw, admitted, admission_source, span))
        )
        if threaded is not None:
            return threaded
        return await _admit_on(conn, admitted, admission_source, span)


async def _admit_on(
    conn: Any, admitted: AdmittedApplication, admission_source: str, span: Admitting
) -> str:
    async with caller_transaction(conn) as tx:
        ids = await admit_in(tx, [admitted], admission_source, span=span)
    return ids[admitted.idempotency_key]


def submit_task_sync(
    conn: Any,
    app: TaskApplication,
    *,
    registry: TaskAdapterRegistry | None = None,
    admission_source: str = "library",
) -> str:
    """R24 for a synchronous connection (a Django or Flask view, a script): ``submit_task``
    inside the caller's open transaction on ``conn`` -- a ``psycopg.Connection``, a
    ``sqlite3.Connection`` on the store's file, or a SQLAlchemy ``Connection``/``Session`` over
    one -- without an event loop. The row commits with the caller's transaction or not at all.

    Raises:
        TaskValidationError: bad input or an async connection (await ``submit_task``);
            nothing written.
        TaskIdempotencyConflict: the key already admitted a different application.
    """
    if not is_caller_connection(conn) or is_async_connection(conn):
        raise TaskValidationError(
            "connection",
            type(conn).__name__,
            "a synchronous connection (for an async one: await taskward.submit_task(conn, ...))",
        )
    return _completed(_submit_in(conn, app, registry, admission_source))


def _completed(coroutine: Coroutine[Any, Any, T]) -> T:
    """The value of a coroutine that never suspends (one over a synchronous connection: every
    await in it is of a call that has already done its I/O), run without an event loop."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("admission over a synchronous connection suspended")  # pragma: no cover


async def admit_task(
    db: StateDB,
    app: TaskApplication,
    *,
    registry: TaskAdapterRegistry | None = None,
    admission_source: str = "library",
    schedule_id: str | None = None,
    now: float | None = None,
) -> Admission:
    """``submit_task`` that also says whether the row is new (HTTP answers 201 or 200 by it).

    Raises: as ``submit_task``.
    """
    admitted = validate_admission(app, registry, admission_source)
    if admitted.depends_on:
        with admission_span(
            admission_source, kind=admitted.action_kind, key=admitted.idempotency_key
        ) as span:
            admission = await _admit_with_dependencies(
                db, admitted, admission_source, schedule_id, now, span.trace_context
            )
            span.admitted(admission.task_id, admission.created)
    else:
        admission = await admit_alone(db, admitted, admission_source, schedule_id, now)
    if db.metrics is not None:  # after the commit: the one place admissions are counted
        db.metrics.admitted(admitted.action_kind, created=admission.created)
    return admission


class SingleStatements(Protocol):
    """What one admission without dependencies needs of a store: the async store itself, or
    the synchronous client's through ``SynchronousStatements``."""

    async def execute(self, name: str, params: Params | None = None) -> int: ...

    async def fetchone(self, name: str, params: Params | None = None) -> Row | None: ...

    def wake(self, channel: str) -> None: ...


async def admit_alone(
    db: SingleStatements,
    admitted: AdmittedApplication,
    admission_source: str,
    schedule_id: str | None,
    now: float | None,
) -> Admission:
    """One admission without dependencies, in its span: one statement, its own transaction
    (R8): INSERT ... ON CONFLICT DO NOTHING. Only when it inserted nothing is the existing row
    read and its hash compared. The async store's path and the synchronous client's (over
    ``SynchronousStatements``, driven by ``admit_alone_sync``): one path for both."""
    with admission_span(
        admission_source, kind=admitted.action_kind, key=admitted.idempotency_key
    ) as span:
        params = insert_params(
            admitted, admission_source, schedule_id, now, trace_context=span.trace_context
        )
        if await db.execute("run_insert_if_new", params):
            db.wake("queued")
            admission = Admission(task_id=params["id"], created=True)
        else:
            existing = await db.fetchone(
                "run_get_by_key", {"idempotency_key": admitted.idempotency_key}
            )
            admission = replayed_admission(admitted, existing)
        span.admitted(admission.task_id, admission.created)
    return admission


class SynchronousStatements:
    """The synchronous client's store (``SyncStatements``) as ``SingleStatements``: each call
    has done its I/O when its awaitable is made, so ``admit_alone`` over it never suspends and
    ``_completed`` runs it without an event loop. No in-process wake-up: other processes learn
    of the row as of any other (the insert's own NOTIFY on PostgreSQL, polling on SQLite)."""

    def __init__(self, db: SyncStatements) -> None:
        self._db = db

    async def execute(self, name: str, params: Params | None = None) -> int:
        return self._db.execute(name, params)

    async def fetchone(self, name: str, params: Params | None = None) -> Row | None:
        return self._db.fetchone(name, params)

    def wake(self, channel: str) -> None:
        pass


def admit_alone_sync(
    db: SyncStatements,
    admitted: AdmittedApplication,
    admission_source: str,
    schedule_id: str | None,
    now: float | None,
) -> Admission:
    """``admit_alone`` on the synchronous client's store, without an event loop."""
    return _completed(
        admit_alone(SynchronousStatements(db), admitted, admission_source, schedule_id, now)
    )


async def _admit_with_dependencies(
    db: StateDB,
    admitted: AdmittedApplication,
    admission_source: str,
    schedule_id: str | None,
    now: float | None,
    trace_context: str | None,
) -> Admission:
    """``admit_task`` for an application with ``depends_on`` (R21): the insert, the links and
    the first readiness move in one transaction (``dependencies.link_admitted``); a replayed
    key links nothing (its task was linked when it was admitted)."""
    params = insert_params(
        admitted, admission_source, schedule_id, None, trace_context=trace_context
    )
    del params["now"]  # the statement's time is the transaction's
    async with db.transaction(now=now) as tx:
        if await tx.execute("run_insert_if_new", params):
            after = await link_admitted(
                tx, [(params["id"], admitted.depends_on, admitted.run_after)]
            )
            if after[params["id"]] == "queued":
                tx.notify("queued")
            return Admission(task_id=params["id"], created=True)
        existing = await tx.fetchone(
            "run_get_by_key", {"idempotency_key": admitted.idempotency_key}
        )
    return replayed_admission(admitted, existing)


def validate_admission(
    app: TaskApplication, registry: TaskAdapterRegistry | None, admission_source: str
) -> AdmittedApplication:
    """``admit_task``'s checks before any SQL (shared with ``taskward.client.SyncClient``)."""
    if admission_source not in ADMISSION_SOURCES:
        raise TaskValidationError("admission_source", admission_source, sorted(ADMISSION_SOURCES))
    return validate_application(app, registry if registry is not None else build_registry())


def insert_params(
    admitted: AdmittedApplication,
    admission_source: str,
    schedule_id: str | None,
    now: float | None,
    *,
    trigger_context: str = "{}",
    chain_parent_id: str | None = None,
    chain_depth: int = 0,
    trace_context: str | None = None,
) -> dict[str, Any]:
    """``run_insert_if_new``'s parameters for one admission, with a new time-ordered id; the
    chain columns are an operator retry's (R19, ``resubmit.retry_task``); ``trace_context`` the
    W3C trace context of admission's span (``tracing.admission_span``), stored with the task
    and not part of its application (a replay with another context is the same task)."""
    return {
        "id": new_id(),
        "schedule_id": schedule_id,
        "trigger_context": trigger_context,
        "chain_parent_id": chain_parent_id,
        "chain_depth": chain_depth,
        "action_kind": admitted.action_kind,
        "action_args": admitted.args_json,
        "concurrency_key": admitted.concurrency_key,
        "required_capabilities": dumps(admitted.required_capabilities),
        "execution_target": admitted.execution_target,
        "library_ref": admitted.library_ref,
        "library_content_hash": admitted.library_content_hash,
        "idempotency_key": admitted.idempotency_key,
        "application_hash": admitted.application_hash,
        "admission_source": admission_source,
        # R16: the statement sets queued_at to the later of its time and run_after; R18: a NULL
        # max_attempts stores the queue's ceiling read by the statement itself (R6).
        "run_after": admitted.run_after,
        "priority": admitted.priority,
        "max_attempts": admitted.max_attempts,
        "limit_key": admitted.limit_key,
        "trace_context": trace_context,
        "now": now,
    }


def replayed_admission(
    admitted: AdmittedApplication, existing: Mapping[str, Any] | None
) -> Admission:
    """The answer when the insert found the key taken: ``existing`` (``run_get_by_key``'s row)
    must hold the same application (ADR-0072 D2), else TaskIdempotencyConflict."""
    if existing is None:  # pragma: no cover - the unique index makes this unreachable
        raise RuntimeError("admission insert conflicted but no row holds the key")
    if existing["application_hash"] != admitted.application_hash:
        raise TaskIdempotencyConflict(admitted.idempotency_key, existing["id"])
    return Admission(task_id=existing["id"], created=False)


MAX_BULK: Final = 10_000


async def submit_tasks(
    db: StateDB,
    apps: Sequence[TaskApplication],
    *,
    registry: TaskAdapterRegistry | None = None,
    admission_source: str = "library",
    now: float | None = None,
) -> list[str]:
    """Admit many applications in one transaction; returns their ids in order.

    Each application has ``submit_task``'s per-key semantics (a replayed key returns its
    original id; the same key within the call twice is one task). The call is all or nothing:
    any invalid application raises before anything is written, and a key that already admitted
    a different application raises ``TaskIdempotencyConflict`` and writes none of the batch.
    """
    if admission_source not in ADMISSION_SOURCES:
        raise TaskValidationError("admission_source", admission_source, sorted(ADMISSION_SOURCES))
    if len(apps) > MAX_BULK:
        raise TaskValidationError("apps", f"{len(apps)} applications", f"at most {MAX_BULK}")
    registry = registry if registry is not None else build_registry()
    admitted: list[AdmittedApplication] = []
    for index, app in enumerate(apps):
        try:
            admitted.append(validate_application(app, registry))
        except TaskValidationError as exc:
            exc.message = f"application {index}: {exc.message}"
            raise
    by_key: dict[str, AdmittedApplication] = {}
    for item in admitted:
        first = by_key.setdefault(item.idempotency_key, item)
        if first.application_hash != item.application_hash:
            raise TaskValidationError(
                "idempotency_key",
                item.idempotency_key,
                "one application per key within a call",
                message=f"idempotency_key {item.idempotency_key!r} names two different "
                "applications in this call",
            )
    unique = list(by_key.values())
    created: set[str] = set()
    with admission_span(admission_source, count=len(unique)) as span:
        async with db.transaction(now=now) as tx:
            ids = await admit_in(tx, unique, admission_source, created=created, span=span)
    count_admissions(db, unique, ids, created)
    return [ids[a.idempotency_key] for a in admitted]


def count_admissions(
    db: StateDB, unique: Sequence[AdmittedApplication], ids: dict[str, str], created: set[str]
) -> None:
    """Count ``admit_in``'s admissions in this process's metrics, once its transaction
    committed (``created``: the ids it inserted)."""
    metrics = db.metrics
    if metrics is not None:
        for item in unique:
            metrics.admitted(item.action_kind, created=ids[item.idempotency_key] in created)


async def admit_in(
    tx: Tx,
    unique: Sequence[AdmittedApplication],
    admission_source: str,
    *,
    created: set[str] | None = None,
    span: Admitting = NOT_TRACED,
) -> dict[str, str]:
    """Admit validated applications with distinct keys inside the open transaction ``tx``:
    one set-based insert, a replay check for each key that was taken, and R21's links for the
    new rows that have dependencies. Returns key -> task id. ``submit_tasks``, a workflow's
    layers (``workflows``) and R24's admission in a caller's transaction write through it; the
    caller's rollback leaves nothing. ``span``: the caller's admission span, whose trace
    context every new row stores and which records each task's answer.

    Raises:
        TaskIdempotencyConflict: a key already admitted a different application.
        TaskValidationError: a ``depends_on`` names tasks that do not exist.
    """
    if not unique:
        return {}
    # One set-based write for the whole call; a key already taken inserts nothing.
    trace_context = span.trace_context
    rows: list[dict[str, Any]] = [
        insert_params(a, admission_source, None, None, trace_context=trace_context) for a in unique
    ]
    for params in rows:
        del params["now"]  # the statement's time is the transaction's
    [inserted] = await tx.write_many([("run_insert_many_if_new", rows)])
    ids: dict[str, str] = {}
    new_ids: set[str] = set()
    if inserted == len(unique):
        ids = {a.idempotency_key: row["id"] for a, row in zip(unique, rows, strict=True)}
        new_ids = set(ids.values())
    else:
        # Some key was taken: the row holding each key says whose it is (ours carries the id
        # we made; another's must hold the same application).
        found = await tx.fetchone_each(
            "run_get_by_key", [{"idempotency_key": a.idempotency_key} for a in unique]
        )
        for item, row, ours in zip(unique, found, rows, strict=True):
            assert row is not None  # the unique index holds the key
            if row["id"] != ours["id"] and row["application_hash"] != item.application_hash:
                raise TaskIdempotencyConflict(item.idempotency_key, row["id"])
            ids[item.idempotency_key] = row["id"]
            if row["id"] == ours["id"]:
                new_ids.add(row["id"])
    links = [
        (ids[a.idempotency_key], a.depends_on, a.run_after)
        for a in unique
        if a.depends_on and ids[a.idempotency_key] in new_ids
    ]
    if created is not None:  # the caller counts them once its transaction committed
        created.update(new_ids)
    if links:  # R21: the new rows with dependencies, linked and moved in this transaction
        await link_admitted(tx, links)
    if inserted:
        tx.notify("queued")
    if span.recording:
        for item in unique:
            task_id = ids[item.idempotency_key]
            span.admitted(task_id, task_id in new_ids)
    return ids
