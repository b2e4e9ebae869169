"""``SyncClient``: admission for programs without an event loop (a Django or Flask view, a
script, a cron job), with ``submit_task``'s semantics exactly (ADR-0072 D1/D2, R8).

The async API runs on the caller's event loop; a synchronous caller would otherwise start a
loop, open a store (a pool, a migration check) and close it again for every submission. The
client opens its store once, lazily, on the first call, and writes through the driver's
synchronous path through admission's own code (``admission.admit_alone_sync``: the async
path's ``admit_alone`` driven without an event loop): the same validation, statement, span,
replay and conflict rule. Idle workers learn of the new row as they do of any other
process's: NOTIFY on PostgreSQL (in the statement), polling on SQLite.

The rest of the API -- bulk admission, reads, results (R22), cancellation -- runs the async
functions themselves on a private event loop on a thread of the client's own, over an async
store opened on the first such call (a portal: no second implementation of any of them). Those
calls block the calling thread; inside a running event loop, await the async API instead.

Threads may share one client (each statement is its own transaction; on SQLite each thread
has its own connection, on PostgreSQL a pool serves them). A process forked after the client
was used opens connections (and a portal) of its own on its first call; it never uses its
parent's. Fork while no other thread is inside a call (as a pre-forking server does): a lock
held by another thread at fork() stays held in the child.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any, TypeVar

from taskward.adapters import build_registry
from taskward.admission import (
    Admission,
    admit_alone_sync,
    admit_task,
    submit_tasks,
    validate_admission,
)
from taskward.cancellation import request_task_cancel
from taskward.errors import StoreError
from taskward.models import Actor, CancelResult, TaskApplication
from taskward.reads import get_task, list_tasks, list_transitions
from taskward.registry import TaskAdapterRegistry
from taskward.results import get_task_result
from taskward.store.open import check_url, open_db, open_sync_db, resolve_url
from taskward.store.port import Row, StateDB, SyncStatements
from taskward.workflows import Workflow

T = TypeVar("T")


class _Portal:
    """An event loop on a daemon thread, holding an open async store: ``call`` runs one of
    the async API's functions there and waits for its answer."""

    def __init__(self, url: str) -> None:
        self.pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="taskward-sync-client", daemon=True
        )
        self._thread.start()
        try:
            self.db: StateDB = self._run(_opened(url))
        except BaseException:
            self._stop()
            raise

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def call(self, function: Callable[[StateDB], Coroutine[Any, Any, T]]) -> T:
        return self._run(function(self.db))

    def close(self) -> None:
        try:
            self._run(self.db.close())
        finally:
            self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


async def _opened(url: str) -> StateDB:
    return await open_db(url)


class SyncClient:
    """Synchronous admission into the store at ``url`` (default: ``TASKWARD_DATABASE_URL``,
    else ``sqlite:///taskward.db``). A bad URL raises ``TaskValidationError`` here; the store
    is opened (and migrated, unless the URL says ``migrate=false``) on the first call or by
    ``open()``. Close it with ``close()`` or use it as a context manager."""

    def __init__(self, url: str | None = None, *, registry: TaskAdapterRegistry | None = None):
        self._url = resolve_url(url)
        check_url(self._url)  # every option checked now, before anything connects
        self._registry = registry if registry is not None else build_registry()
        self._db: SyncStatements | None = None
        self._portal: _Portal | None = None
        # Portals inherited through fork(): their threads did not survive it and their
        # connections are the parent's; kept referenced, never closed.
        self._inherited: list[_Portal] = []
        self._opening = threading.Lock()
        self._closed = False

    def open(self) -> SyncClient:
        """Open the store now (the first call would otherwise): connection and schema errors
        surface here. Returns the client."""
        self._store()
        return self

    def _store(self) -> SyncStatements:
        db = self._db
        if db is not None:
            return db
        with self._opening:
            if self._closed:
                raise StoreError("this client was closed; make a new one")
            if self._db is None:
                self._db = open_sync_db(self._url)
            return self._db

    def submit_task(
        self,
        app: TaskApplication,
        *,
        admission_source: str = "library",
        schedule_id: str | None = None,
        now: float | None = None,
        registry: TaskAdapterRegistry | None = None,
    ) -> str:
        """Admit ``app`` as a queued run and return its id (the existing id for a replayed
        key), as ``taskward.submit_task`` does.

        Raises:
            TaskValidationError: bad input (nothing written); AdapterNotRegistered for the kind.
            TaskIdempotencyConflict: the key already admitted a different application.
            StoreUnavailable: the store is away or locked past its timeout (safe to retry with
                the same key).
        """
        return self.admit_task(
            app,
            admission_source=admission_source,
            schedule_id=schedule_id,
            now=now,
            registry=registry,
        ).task_id

    def admit_task(
        self,
        app: TaskApplication,
        *,
        admission_source: str = "library",
        schedule_id: str | None = None,
        now: float | None = None,
        registry: TaskAdapterRegistry | None = None,
    ) -> Admission:
        """``submit_task`` that also says whether this call inserted the row (``registry``:
        instead of the client's, for this call: a typed handle's own)."""
        registry = registry if registry is not None else self._registry
        admitted = validate_admission(app, registry, admission_source)
        if admitted.depends_on:
            # R21: the insert, the links and the first readiness move are one transaction of
            # transitions; the async admission writes them, through the portal.
            return self._call(
                lambda db: admit_task(
                    db,
                    app,
                    registry=registry,
                    admission_source=admission_source,
                    schedule_id=schedule_id,
                    now=now,
                )
            )
        return admit_alone_sync(self._store(), admitted, admission_source, schedule_id, now)

    # -- the rest of the API, through the portal ------------------------------------------------

    def _call(self, function: Callable[[StateDB], Coroutine[Any, Any, T]]) -> T:
        portal = self._portal
        if portal is None or portal.pid != os.getpid():
            with self._opening:
                if self._closed:
                    raise StoreError("this client was closed; make a new one")
                portal = self._portal
                if portal is not None and portal.pid != os.getpid():
                    self._inherited.append(portal)
                    portal = None
                if portal is None:
                    portal = self._portal = _Portal(self._url)
        return portal.call(function)

    def submit_workflow(
        self, workflow: Workflow, *, admission_source: str = "library", now: float | None = None
    ) -> dict[str, str]:
        """``Workflow.submit``: every step in one transaction; step name -> task id."""
        registry = self._registry
        return self._call(
            lambda db: workflow.submit(
                db, registry=registry, admission_source=admission_source, now=now
            )
        )

    def submit_tasks(
        self,
        apps: Sequence[TaskApplication],
        *,
        admission_source: str = "library",
        now: float | None = None,
    ) -> list[str]:
        """``taskward.submit_tasks``: many applications in one transaction, all or nothing."""
        return self._call(
            lambda db: submit_tasks(
                db, apps, registry=self._registry, admission_source=admission_source, now=now
            )
        )

    def get_task(self, task_id: str) -> Row:
        """``taskward.get_task``: the task's row; TaskNotFound when there is none."""
        return self._call(lambda db: get_task(db, task_id))

    def get_task_result(self, task_id: str) -> Any:
        """``taskward.get_task_result``: the completed task's decoded return value (R22);
        TaskNotFound when there is no such task, TaskNotCompleted when it is not completed."""
        return self._call(lambda db: get_task_result(db, task_id))

    def list_transitions(self, task_id: str) -> list[Row]:
        """``taskward.list_transitions``: the task's transition facts, oldest first."""
        return self._call(lambda db: list_transitions(db, task_id))

    def list_tasks(
        self,
        *,
        status: str | None = None,
        action_kind: str | None = None,
        execution_target: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[Row], str | None]:
        """``taskward.list_tasks``: newest first, ``(rows, next_cursor)``."""
        return self._call(
            lambda db: list_tasks(
                db,
                status=status,
                action_kind=action_kind,
                execution_target=execution_target,
                limit=limit,
                cursor=cursor,
            )
        )

    def request_task_cancel(
        self,
        task_id: str,
        *,
        actor: Actor,
        idempotency_key: str,
        reason: str = "",
        now: float | None = None,
    ) -> CancelResult:
        """``taskward.request_task_cancel``: cancel now when no worker owns the task, else
        record a cooperative request."""
        return self._call(
            lambda db: request_task_cancel(
                db, task_id, actor=actor, idempotency_key=idempotency_key, reason=reason, now=now
            )
        )

    def close(self) -> None:
        """Close the store's connections (and the portal's loop); safe to call twice. A closed
        client refuses calls."""
        with self._opening:
            self._closed = True
            db, self._db = self._db, None
            portal, self._portal = self._portal, None
        try:
            if db is not None:
                db.close()
        finally:
            if portal is not None and portal.pid == os.getpid():
                portal.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
