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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from taskward.errors import StoreError, StoreUnavailable
from taskward.store.migrate import MIGRATIONS_TABLE
from taskward.store.port import Params, Row
from taskward.store.postgres.db import configure_adapters, statement, translate

SyncConn = psycopg.Connection[dict[str, Any]]


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
    ) -> None:
        self.conninfo = conninfo
        self.url = url
        self._pool_min = pool_min
        self._pool_max = pool_max
        self._timeout_s = connect_timeout_s
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
                min_size=self._pool_min,
                max_size=self._pool_max,
                open=False,
                timeout=self._timeout_s,
                kwargs={"autocommit": True, "row_factory": dict_row},
                configure=configure_adapters,
            )
            with translate():
                try:
                    pool.open(wait=True, timeout=self._timeout_s)
                except psycopg.OperationalError as exc:  # the pool's timeout says no more
                    pool.close()
                    raise StoreUnavailable(
                        f"PostgreSQL unavailable: no connection within {self._timeout_s:g} s"
                        f" (open_timeout_s); connecting: {self._connect_error()}"
                    ) from exc
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
            return " ".join(str(exc).split())
        else:
            return "a direct connection succeeded; the pool did not in time"

    @contextmanager
    def _connection(self) -> Iterator[SyncConn]:
        pool = self._current_pool()
        if not self._hot_lock.acquire(blocking=False):
            with translate(), pool.connection() as conn:
                yield conn
            return
        try:
            with translate():
                if self._hot is None:
                    self._hot = pool.getconn()
            conn = self._hot
            clean = False
            try:
                yield conn
                clean = conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
            finally:
                if not clean or self._closed:
                    # After any error the pool checks, resets or discards the connection.
                    self._hot = None
                    with contextlib.suppress(Exception):  # a closed pool takes nothing back
                        pool.putconn(conn)
        finally:
            self._hot_lock.release()

    def fetchall(self, name: str, params: Params | None = None) -> list[Row]:
        sql, merged = statement(name, params)
        with self._connection() as conn, translate():
            return conn.execute(sql, merged).fetchall()

    def execute(self, name: str, params: Params | None = None) -> int:
        sql, merged = statement(name, params)
        with self._connection() as conn, translate():
            return conn.execute(sql, merged).rowcount

    def fetchone(self, name: str, params: Params | None = None) -> Row | None:
        rows = self.fetchall(name, params)
        return rows[0] if rows else None

    def schema_version(self) -> int:
        with self._connection() as conn, translate():
            row = conn.execute(
                f"SELECT to_regclass('{MIGRATIONS_TABLE}') IS NOT NULL AS present"
            ).fetchone()
            if row is None or not row["present"]:
                return 0
            row = conn.execute(f"SELECT max(version) AS version FROM {MIGRATIONS_TABLE}").fetchone()
        return int(row["version"] or 0) if row else 0

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
