"""R24: a transaction of the caller's own psycopg connection, as the ``Tx`` admission writes in.

``caller_transaction(conn)`` yields a ``_PgTx`` over the caller's ``psycopg.AsyncConnection``
or ``psycopg.Connection`` (sync: every call completes without suspending, so the coroutines
that use it can be driven without an event loop, ``admission.submit_task_sync``). It never
begins, commits or rolls back the caller's transaction:

- it runs inside a ``SAVEPOINT``, so a failure (a conflict, a missing dependency, a driver error)
  rolls back exactly what it wrote and leaves the caller's transaction usable;
- its wake-ups are ``NOTIFY`` statements in the caller's transaction, which PostgreSQL delivers
  when (and only if) that transaction commits;
- its statements use cursors of its own (server-side binding, dict rows, taskward's JSON loaders
  and array dumpers on the cursor), so the caller's connection settings are not changed;
- its time is the server's clock (R9), read in the caller's transaction.

A connection in autocommit mode outside a ``conn.transaction()`` block, or whose transaction
has failed, is refused: admission would not commit with anything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import pq
from psycopg.rows import dict_row

from taskward.errors import TaskValidationError
from taskward.store.postgres.connection import configure_adapters
from taskward.store.postgres.errors import translate
from taskward.store.postgres.listen import notify_sql
from taskward.store.postgres.tx import _PgTx

_NOW_SQL = b"SELECT extract(epoch FROM clock_timestamp())::float8 AS now"
CALLER_TYPES = (psycopg.AsyncConnection, psycopg.Connection)


class _SyncCursor:
    """A finished sync cursor read through ``_PgTx``'s awaits (nothing suspends): its fetches
    awaitable, everything else (``rowcount``, ``description``, ``nextset``) the cursor's."""

    def __init__(self, cursor: psycopg.Cursor[Any]) -> None:
        self._cursor = cursor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    async def fetchone(self) -> Any:
        return self._cursor.fetchone()

    async def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()


class _CallerConnection:
    """What ``_PgTx`` asks of a connection (``execute``, ``pipeline``), on cursors of its own."""

    def __init__(self, conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any]) -> None:
        self._conn = conn

    async def execute(self, query: Any, params: Any = None) -> Any:
        # Server-side binding whatever the connection's cursor_factory (Django's is client-side
        # binding, which cannot send taskward's binary arrays).
        conn = self._conn
        if isinstance(conn, psycopg.AsyncConnection):
            cursor = psycopg.AsyncCursor(conn, row_factory=dict_row)
            configure_adapters(cursor)
            await cursor.execute(query, params)
            return cursor
        sync_cursor = psycopg.Cursor(conn, row_factory=dict_row)
        configure_adapters(sync_cursor)
        sync_cursor.execute(query, params)
        return _SyncCursor(sync_cursor)

    @asynccontextmanager
    async def pipeline(self) -> AsyncIterator[None]:
        conn = self._conn
        if isinstance(conn, psycopg.AsyncConnection):
            async with conn.pipeline():
                yield
        else:
            with conn.pipeline():
                yield


def _check_open(conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any]) -> None:
    status = conn.info.transaction_status
    if status == pq.TransactionStatus.INERROR:
        raise TaskValidationError(
            "connection",
            "a failed transaction",
            "a connection whose transaction can still commit",
            message="the connection's transaction has failed: roll it back before admitting",
        )
    if status == pq.TransactionStatus.IDLE and conn.autocommit:
        raise TaskValidationError(
            "connection",
            "autocommit outside a transaction",
            "a connection inside a transaction (conn.transaction(), or autocommit off)",
            message="the connection is in autocommit mode outside a transaction: admission "
            "would commit alone; open `with conn.transaction():` first",
        )


@asynccontextmanager
async def caller_transaction(
    conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any],
) -> AsyncIterator[_PgTx]:
    """A ``Tx`` in the caller's transaction on ``conn`` (see the module's docstring)."""
    _check_open(conn)
    proxy = _CallerConnection(conn)
    with translate():
        row = await (await proxy.execute(_NOW_SQL)).fetchone()
    tx = _PgTx(proxy, float(row["now"]))  # type: ignore[arg-type]
    async with tx.savepoint():
        yield tx
        if tx.channels:
            with translate():
                await proxy.execute(notify_sql(tx.channels))
