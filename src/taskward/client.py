"""``SyncClient``: admission for programs without an event loop (a Django or Flask view, a
script, a cron job), with ``submit_task``'s semantics exactly (ADR-0072 D1/D2, R8).

The async API runs on the caller's event loop; a synchronous caller would otherwise start a
loop, open a store (a pool, a migration check) and close it again for every submission. The
client opens its store once, lazily, on the first call, and writes through the driver's
synchronous path: the same validation and hash (``admission.validate_admission``), the same
``run_insert_if_new`` statement, the same replay and conflict rule
(``admission.replayed_admission``). Idle workers learn of the new row as they do of any other
process's: NOTIFY on PostgreSQL (in the statement), polling on SQLite.

Threads may share one client (each statement is its own transaction; on SQLite each thread
has its own connection, on PostgreSQL a pool serves them). A process forked after the client
was used opens connections of its own on its first call; it never uses its parent's.
"""

from __future__ import annotations

import threading
from types import TracebackType

from taskward.adapters import build_registry
from taskward.admission import Admission, insert_params, replayed_admission, validate_admission
from taskward.errors import StoreError
from taskward.models import TaskApplication
from taskward.registry import TaskAdapterRegistry
from taskward.store.open import check_url, open_sync_db, resolve_url
from taskward.store.port import SyncStatements


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
            app, admission_source=admission_source, schedule_id=schedule_id, now=now
        ).task_id

    def admit_task(
        self,
        app: TaskApplication,
        *,
        admission_source: str = "library",
        schedule_id: str | None = None,
        now: float | None = None,
    ) -> Admission:
        """``submit_task`` that also says whether this call inserted the row."""
        admitted = validate_admission(app, self._registry, admission_source)
        db = self._store()
        params = insert_params(admitted, admission_source, schedule_id, now)
        if db.execute("run_insert_if_new", params):
            return Admission(task_id=params["id"], created=True)
        existing = db.fetchone("run_get_by_key", {"idempotency_key": admitted.idempotency_key})
        return replayed_admission(admitted, existing)

    def close(self) -> None:
        """Close the store's connections; safe to call twice. A closed client refuses calls."""
        with self._opening:
            self._closed = True
            db, self._db = self._db, None
        if db is not None:
            db.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
