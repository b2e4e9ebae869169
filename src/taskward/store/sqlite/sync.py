"""SQLite for the synchronous client: one connection per thread, each statement its own
transaction, the calling thread waiting for the lock and the fsync itself.

The async store's connection is bound to its event loop; a program without one (a Django or
Flask view, a script) writes here instead, through the same named statements and settings
(``set_pragmas``). Waiting for another process's lock is SQLite's own busy handler, bounded by
the URL's ``lock_timeout_s``; past it the call raises ``StoreUnavailable``.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from taskward.errors import StoreError, StoreUnavailable
from taskward.store.migrate import MIGRATIONS_TABLE
from taskward.store.port import Params, Row
from taskward.store.sqlite.connection import (
    connect_private,
    row_count,
    row_factory,
    set_pragmas,
    statement,
)
from taskward.store.sqlite.errors import translate_error


class SQLiteSyncDB:
    """``SyncStatements`` over one SQLite file."""

    dialect = "sqlite"

    def __init__(
        self, path: str, *, url: str, synchronous: str = "FULL", lock_budget_s: float = 30.0
    ) -> None:
        self.path = path
        self.url = url
        self.synchronous = synchronous.upper()
        self.lock_budget_s = lock_budget_s
        self._local = threading.local()
        # Every connection opened (with the process that opened it), so close() reaches those
        # of other threads too; guarded by the lock, as threads open theirs concurrently.
        self._opened: list[tuple[int, sqlite3.Connection]] = []
        self._opened_lock = threading.Lock()
        self._closed = False

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        # A connection inherited through fork() belongs to the parent: never used here.
        if conn is not None and self._local.pid == os.getpid():
            return conn
        if self._closed:
            raise StoreError("this client was closed; open a new one")
        try:
            # Not check_same_thread: each thread only ever uses its own (the thread-local above),
            # and close() must reach the other threads' connections.
            conn = connect_private(
                self.path,
                isolation_level=None,
                timeout=self.lock_budget_s,
                check_same_thread=False,
            )
            conn.row_factory = row_factory()
            conn.execute("PRAGMA journal_mode=WAL").fetchone()
            set_pragmas(conn, self.synchronous)
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(f"cannot open SQLite database {self.path!r}: {exc}") from exc
        pid = os.getpid()
        self._local.conn, self._local.pid = conn, pid
        with self._opened_lock:
            self._opened.append((pid, conn))
        return conn

    @contextmanager
    def _translate(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise translate_error(exc, self.path) from exc

    def fetchall(self, name: str, params: Params | None = None) -> list[Row]:
        sql, merged = statement(name, params, time.time)
        conn = self._connection()
        with self._translate():
            rows: list[Row] = conn.execute(sql, merged).fetchall()
        return rows

    def execute(self, name: str, params: Params | None = None) -> int:
        sql, merged = statement(name, params, time.time)
        conn = self._connection()
        with self._translate():
            return row_count(conn.execute(sql, merged))

    def fetchone(self, name: str, params: Params | None = None) -> Row | None:
        rows = self.fetchall(name, params)
        return rows[0] if rows else None

    def schema_version(self) -> int:
        conn = self._connection()
        with self._translate():
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                (MIGRATIONS_TABLE,),
            ).fetchone()
            if found is None:
                return 0
            row = conn.execute(f"SELECT max(version) AS version FROM {MIGRATIONS_TABLE}").fetchone()
        return int(row["version"] or 0)

    def close(self) -> None:
        """Close this process's connections (call it when no statement is in flight); one
        inherited through fork() is left to the process that opened it."""
        self._closed = True
        with self._opened_lock:
            opened, self._opened = self._opened, []
        pid = os.getpid()
        for owner, conn in opened:
            if owner == pid:
                conn.close()
        self._local = threading.local()
