"""SQLite dialect: the embedded default (one file, WAL, ``synchronous=FULL``).

One connection per StateDB, used on the event-loop thread: statements are in-process and
short, and a thread hop per statement would cost more than it saves. Write transactions start
with ``BEGIN IMMEDIATE`` so lock waits happen up front; the connection's busy timeout is zero
and waiting for another process's lock is an ``asyncio.sleep`` backoff, so the loop keeps
serving other tasks while it waits.

A lock held past ``lock_budget_s`` (URL option ``lock_timeout_s``) and the errors that pass by
themselves (I/O, disk full, cannot open) are ``StoreUnavailable``, which callers retry
(``taskward.store.retry``); any other driver error is a ``StoreError``.

Known limits: writers on one file share one host (SQLite has no network protocol), so the local
clock is the store's clock (R9); idle workers in other processes learn of new work by polling.

``SQLiteDB`` owns the connection, its lock, the busy backoff, the polling of other processes'
commits, BEGIN/COMMIT/ROLLBACK and the migrations; the rest of the dialect sits beside it,
imports pointing one way (each module imports only those before it): ``errors`` (driver errors
as store errors), ``connection`` (every connection's file mode, pragmas and row factory),
``positional`` (set-based writes bound by position), ``tx`` (the transaction, ``_SQLiteTx``),
then this module. ``store.open`` imports the store and ``SYNCHRONOUS_MODES`` from here, and the
names other code imports from here (``translate_error``...) are re-exported below.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from taskward.errors import StoreError, StoreUnavailable
from taskward.loops import raise_if_cancelling
from taskward.store.migrate import MIGRATIONS_TABLE, load_migrations
from taskward.store.port import Params, Row
from taskward.store.signals import Signal, Signals
from taskward.store.sqlite.connection import (
    PRIVATE_FILE_MODE,
    SYNCHRONOUS_MODES,
    RowFactory,
    connect_private,
    row_count,
    row_factory,
    set_pragmas,
    statement,
)
from taskward.store.sqlite.errors import BUSY_CODES, TRANSIENT_CODES, _is_busy, translate_error
from taskward.store.sqlite.tx import _SQLiteTx

if TYPE_CHECKING:
    from taskward.metrics import TaskMetrics

__all__ = [
    "BUSY_CODES",
    "PRIVATE_FILE_MODE",
    "SYNCHRONOUS_MODES",
    "TRANSIENT_CODES",
    "RowFactory",
    "SQLiteDB",
    "_SQLiteTx",
    "connect_private",
    "row_count",
    "row_factory",
    "set_pragmas",
    "statement",
    "translate_error",
]

T = TypeVar("T")


class SQLiteDB:
    """A StateDB over one SQLite file."""

    dialect = "sqlite"
    supports_listen_notify = False
    concurrent_writers = False

    def __init__(
        self,
        path: str,
        *,
        url: str,
        synchronous: str = "FULL",
        lock_budget_s: float = 30.0,
        poll_interval_s: float = 0.005,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if synchronous.upper() not in SYNCHRONOUS_MODES:
            raise ValueError(
                f"synchronous {synchronous!r} is invalid; allowed: {', '.join(SYNCHRONOUS_MODES)}"
            )
        self.path = path
        self.url = url
        self.synchronous = synchronous.upper()
        self.lock_budget_s = lock_budget_s
        self._clock = clock
        self._conn: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self.metrics: TaskMetrics | None = None  # set by its owner (StateDB.metrics)
        self._signals = Signals()
        self._watcher: asyncio.Task[None] | None = None
        self.poll_interval_s = poll_interval_s

    # -- lifecycle -------------------------------------------------------------------------

    async def connect(self) -> None:
        if self._closed:
            raise StoreError("this store was closed; open a new one")
        try:
            conn = connect_private(
                self.path, isolation_level=None, check_same_thread=False, timeout=0
            )
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(f"cannot open SQLite database {self.path!r}: {exc}") from exc
        conn.row_factory = row_factory()
        self._conn = conn
        await self._retry_busy(lambda: conn.execute("PRAGMA journal_mode=WAL").fetchone())
        set_pragmas(conn, self.synchronous)

    async def close(self) -> None:
        """Close the connection; safe to call twice."""
        self._closed = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        if self._conn is not None:
            conn, self._conn = self._conn, None
            async with self._lock:
                conn.close()

    async def __aenter__(self) -> SQLiteDB:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError("store is not open")
        return self._conn

    # -- locking ---------------------------------------------------------------------------

    async def _retry_busy(self, op: Callable[[], T]) -> T:
        """Run ``op``; while another process holds the lock, back off asynchronously."""
        deadline = time.monotonic() + self.lock_budget_s
        delay = 0.0005
        while True:
            try:
                return op()
            except sqlite3.Error as exc:
                if not _is_busy(exc):
                    raise translate_error(exc, self.path) from exc
                if time.monotonic() >= deadline:
                    raise StoreUnavailable(
                        f"SQLite database {self.path!r} stayed locked by another connection for"
                        f" {self.lock_budget_s:g}s (lock_timeout_s); retry later"
                    ) from exc
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.02)

    # -- wake-ups --------------------------------------------------------------------------

    def wake(self, channel: str) -> None:
        self._signals.bump(channel)

    def signal(self, channel: str) -> Signal:
        """In-process commits bump at once; other processes' commits are seen by polling
        ``PRAGMA data_version`` every ``poll_interval_s`` (it changes only when another
        connection commits, and costs no I/O)."""
        if self._watcher is None and not self._closed:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return self._signals.get(channel)

    async def _watch(self) -> None:
        last: int | None = None
        deferred = 0
        while not self._closed:
            raise_if_cancelling()
            # A busy connection is not made to wait for a poll: skip a few rounds while a
            # transaction holds it (this process is at work; at most ~5 rounds late).
            if self._lock.locked() and deferred < 4:
                deferred += 1
                await asyncio.sleep(self.poll_interval_s)
                continue
            deferred = 0
            try:
                async with self._lock:
                    conn = self._connection()
                    row = conn.execute("PRAGMA data_version").fetchone()
                version = row["data_version"] if row else None
            except (sqlite3.Error, StoreError):
                version = None
            if last is not None and version != last:
                self._signals.bump()
            last = version
            await asyncio.sleep(self.poll_interval_s)

    # -- port ------------------------------------------------------------------------------

    async def now(self) -> float:
        return self._clock()

    @asynccontextmanager
    async def transaction(self, *, now: float | None = None) -> AsyncIterator[_SQLiteTx]:
        async with self._lock:
            conn = self._connection()
            await self._retry_busy(lambda: conn.execute("BEGIN IMMEDIATE"))
            tx = _SQLiteTx(conn, self._clock() if now is None else now, self.path)
            try:
                yield tx
            except BaseException:
                if conn.in_transaction:  # an I/O error may have rolled it back already
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise
            try:
                await _commit_off_loop(conn)
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise translate_error(exc, self.path) from exc
        if tx.channels:
            self._signals.bump(*tx.channels)

    async def fetchone(self, name: str, params: Params | None = None) -> Row | None:
        rows = await self.fetchall(name, params)
        return rows[0] if rows else None

    async def fetchall(self, name: str, params: Params | None = None) -> list[Row]:
        sql, merged = self._statement(name, params)
        async with self._lock:
            conn = self._connection()
            rows: list[Row] = await self._retry_busy(lambda: conn.execute(sql, merged).fetchall())
            return rows

    async def execute(self, name: str, params: Params | None = None) -> int:
        sql, merged = self._statement(name, params)
        async with self._lock:
            conn = self._connection()
            count: int = await self._retry_busy(lambda: row_count(conn.execute(sql, merged)))
            return count

    def _statement(self, name: str, params: Params | None) -> tuple[str, dict[str, Any]]:
        return statement(name, params, self._clock)

    async def migrate(self) -> list[str]:
        """Apply the pending migrations in one transaction.

        Foreign keys are off for that transaction and checked before its COMMIT, SQLite's
        documented procedure for a migration that rebuilds a table (0015: a dropped table's
        implicit DELETE would otherwise check the rows that refer to it, and none may be left
        dangling once its copy takes the name). ``PRAGMA foreign_keys`` does nothing inside a
        transaction, so it is switched around it; the connection has them on again after."""
        applied: list[str] = []
        async with self._lock:
            conn = self._connection()
            conn.execute("PRAGMA foreign_keys=OFF")
            try:
                await self._retry_busy(lambda: conn.execute("BEGIN IMMEDIATE"))
                try:
                    applied = self._apply_migrations(conn)
                    if applied:
                        dangling = conn.execute("PRAGMA foreign_key_check").fetchall()
                        if dangling:
                            raise StoreError(
                                f"migration {applied[-1]} left {len(dangling)} row(s) referring "
                                f"to rows that do not exist (first: {tuple(dangling[0])})"
                            )
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
            finally:
                conn.execute("PRAGMA foreign_keys=ON")
        return applied

    def _apply_migrations(self, conn: sqlite3.Connection) -> list[str]:
        """Every migration not yet recorded, each with its row in the migrations table; inside
        ``migrate``'s transaction."""
        applied: list[str] = []
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} ("
            "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
        )
        done = {r["version"] for r in conn.execute(f"SELECT version FROM {MIGRATIONS_TABLE}")}
        for migration in load_migrations("sqlite"):
            if migration.version in done:
                continue
            for text in _split_statements(migration.sql):
                conn.execute(text)
            conn.execute(
                f"INSERT INTO {MIGRATIONS_TABLE} (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, self._clock()),
            )
            applied.append(f"{migration.version:04d}_{migration.name}")
        return applied


async def _commit_off_loop(conn: sqlite3.Connection) -> None:
    """COMMIT in a worker thread: with ``synchronous=FULL`` it waits for an fsync, and the event
    loop keeps running tasks meanwhile (one thread hop per transaction, never per statement;
    the caller holds the connection lock throughout, so nothing else touches the connection).

    The commit cannot be abandoned half way: a cancellation that arrives meanwhile is held until
    the commit has finished and then delivered at the caller's next await, exactly as it would
    have been had the commit run on the loop thread.
    """
    commit = asyncio.get_running_loop().run_in_executor(None, conn.execute, "COMMIT")
    cancelled = False
    try:
        while not commit.done():
            try:
                await asyncio.shield(commit)
            except asyncio.CancelledError:
                cancelled = True
        commit.result()  # the commit's own error, if any
    finally:
        task = asyncio.current_task()
        if cancelled and task is not None:
            task.cancel()


def _split_statements(script: str) -> list[str]:
    """Split a migration into statements, keeping trigger bodies whole."""
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        if not buffer and (not line.strip() or line.lstrip().startswith("--")):
            continue
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        raise ValueError(f"incomplete statement at the end of a migration: {buffer[:80]!r}")
    return statements
