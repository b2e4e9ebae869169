"""PostgreSQL for the synchronous client: psycopg's synchronous driver, a connection pool, and
one hot connection.

A program without an event loop (a Django or Flask view, a script) writes here instead of
through the async store, with the same named statements, adapters (``configure_adapters``) and
error translation (``translate``): each statement is its own transaction and the store's clock
is the server's (R9). The hot connection is kept checked out of the pool for whichever thread
finds it free (a non-blocking lock), so one thread's calls in a row skip the pool's checkout
and return; threads that find it taken use the pool. A process forked after the client was
used starts a pool of its own: connections are never shared across processes.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from taskward.errors import StoreError, StoreUnavailable
from taskward.store.migrate import MIGRATIONS_TABLE
from taskward.store.port import Params, Row
from taskward.store.postgres.connection import (
    DEFAULT_RECONNECT_TIMEOUT_S,
    configure_adapters,
    pool_settings,
    statement,
)
from taskward.store.postgres.errors import one_line, translate

SyncConn = psycopg.Connection[dict[str, Any]]
SyncCursor = psycopg.Cursor[dict[str, Any]]
T = TypeVar("T")
_IDLE = psycopg.pq.TransactionStatus.IDLE


def _all_rows(cursor: SyncCursor) -> list[Row]:
    return cursor.fetchall()


def _row_count(cursor: SyncCursor) -> int:
    return cursor.rowcount


class PostgresSyncDB:
    """``SyncStatements`` over a PostgreSQL database."""

    dialect = "postgresql"

    def __init__(
        self,
        conninfo: str,
        *,
        url: str,
        pool_min: int = 1,
        pool_max: int = 10,
        connect_timeout_s: float = 10.0,
        reconnect_timeout_s: float = DEFAULT_RECONNECT_TIMEOUT_S,
    ) -> None:
        self.conninfo = conninfo
        self.url = url
        self._pool_min = pool_min
        self._pool_max = pool_max
        self._timeout_s = connect_timeout_s
        self._reconnect_timeout_s = reconnect_timeout_s
        self._pool: ConnectionPool[SyncConn] | None = None
        self._pid = 0
        self._opening = threading.Lock()
        self._hot: SyncConn | None = None
        self._hot_lock = threading.Lock()
        self._closed = False
        # Pools inherited through fork(): kept referenced, never closed, so the child neither
        # runs their finalisers nor ends the parent's sessions.
        self._inherited: list[ConnectionPool[SyncConn]] = []

    def _current_pool(self) -> ConnectionPool[SyncConn]:
        pool = self._pool
        if pool is not None and self._pid == os.getpid():
            return pool
        with self._opening:
            if self._closed:
                raise StoreError("this client was closed; open a new one")
            if self._pool is not None and self._pid == os.getpid():
                return self._pool
            if self._pool is not None:
                self._inherited.append(self._pool)
                self._hot = None
                self._hot_lock = threading.Lock()
            pool = ConnectionPool(
                self.conninfo,
                **pool_settings(
                    self._pool_min, self._pool_max, self._timeout_s, self._reconnect_timeout_s
                ),
                configure=configure_adapters,
            )
            try:
                with translate():
                    pool.open(wait=True, timeout=self._timeout_s)
            except StoreUnavailable as exc:
                # The pool says only that it timed out; one connection of our own says why,
                # as the async store's connect() does.
                pool.close()
                raise StoreUnavailable(f"{exc}; connecting: {self._connect_error()}") from exc
            self._pool, self._pid = pool, os.getpid()
            return pool

    def _connect_error(self) -> str:
        """Why one direct connection attempt fails (the pool says only that it timed out):
        the server refused or is away, a wrong password, a bad sslmode..."""
        try:
            psycopg.connect(
                self.conninfo, connect_timeout=max(1, int(min(self._timeout_s, 2)))
            ).close()
        except (psycopg.Error, OSError) as exc:
            return one_line(exc)
        else:
            return "a direct connection succeeded; the pool did not in time"

    def _run(self, sql: str, params: Params | None, read: Callable[[SyncCursor], T]) -> T:
        """``sql`` with ``params`` on the hot connection when it is free (else on a pool
        connection), and what ``read`` takes from its cursor. After any error, or with a
        transaction left open, the hot connection goes back to the pool, which checks, resets
        or discards it."""
        pool = self._current_pool()
        if not self._hot_lock.acquire(blocking=False):
            with translate(), pool.connection() as conn:
                return read(conn.execute(sql, params))
        try:
            if self._hot is None:
                with translate():
                    self._hot = pool.getconn()
            conn = self._hot
            try:
                with translate():
                    result = read(conn.execute(sql, params))
            except BaseException:
                self._return_hot(pool, conn)
                raise
            if conn.pgconn.transaction_status != _IDLE or self._closed:
                self._return_hot(pool, conn)
            return result
        finally:
            self._hot_lock.release()

    def _return_hot(self, pool: ConnectionPool[SyncConn], conn: SyncConn) -> None:
        self._hot = None
        with contextlib.suppress(Exception):  # a closed pool takes nothing back
            pool.putconn(conn)

    def fetchall(self, name: str, params: Params | None = None) -> list[Row]:
        return self._run(*statement(name, params), _all_rows)

    def execute(self, name: str, params: Params | None = None) -> int:
        return self._run(*statement(name, params), _row_count)

    def fetchone(self, name: str, params: Params | None = None) -> Row | None:
        rows = self.fetchall(name, params)
        return rows[0] if rows else None

    def schema_version(self) -> int:
        [found] = self._run(
            f"SELECT to_regclass('{MIGRATIONS_TABLE}') IS NOT NULL AS present", None, _all_rows
        )
        if not found["present"]:
            return 0
        [row] = self._run(
            f"SELECT max(version) AS version FROM {MIGRATIONS_TABLE}", None, _all_rows
        )
        return int(row["version"] or 0)

    def close(self) -> None:
        """Close the pool of this process (call it when no statement is in flight); safe to
        call twice."""
        with self._opening:
            self._closed = True
            pool, self._pool = self._pool, None
            hot, self._hot = self._hot, None
        if pool is None or self._pid != os.getpid():
            return
        if hot is not None:
            with contextlib.suppress(Exception):  # closing regardless
                pool.putconn(hot)
        pool.close()
