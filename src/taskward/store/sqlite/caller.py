"""R24: a transaction of the caller's own ``sqlite3`` connection on the store's file, as the
``Tx`` admission writes in.

``caller_transaction(conn)`` yields a ``_SQLiteTx`` over the caller's connection; every call
completes without suspending (sqlite3 is synchronous), so a synchronous caller drives it without
an event loop (``admission.submit_task_sync``). It never commits or rolls back the caller's
transaction:

- when the connection is not yet in a transaction (Python's default mode opens one only before
  the caller's first write), it begins one (``BEGIN``), which the caller's ``commit()`` or
  ``rollback()`` ends as any other;
- it runs inside a ``SAVEPOINT``, so a failure rolls back exactly what it wrote;
- its statements use cursors of its own (dict rows, JSON columns decoded), so the connection's
  ``row_factory`` is not changed;
- workers in other processes learn of the row by polling, as of any other process's (SQLite's
  wake-ups are in-process signals of a store the caller does not hold).

A connection in autocommit mode (``isolation_level=None``) outside a transaction is refused:
admission would commit alone.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from taskward.errors import TaskValidationError
from taskward.store.sqlite.connection import row_factory
from taskward.store.sqlite.errors import _translate
from taskward.store.sqlite.tx import _SQLiteTx

CALLER_TYPES = (sqlite3.Connection,)


class _CallerConnection:
    """What ``_SQLiteTx`` asks of a connection, on cursors of its own."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._rows = row_factory()

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        cursor = self._conn.cursor()
        cursor.row_factory = self._rows
        return cursor.execute(sql, params)

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        return self._conn.executemany(sql, rows)


@asynccontextmanager
async def caller_transaction(conn: sqlite3.Connection) -> AsyncIterator[_SQLiteTx]:
    """A ``Tx`` in the caller's transaction on ``conn`` (see the module's docstring)."""
    if not conn.in_transaction:
        if conn.isolation_level is None:
            raise TaskValidationError(
                "connection",
                "autocommit outside a transaction",
                "a connection inside a transaction (BEGIN first, or the default isolation)",
                message="the connection is in autocommit mode (isolation_level=None) outside a "
                "transaction: admission would commit alone; execute BEGIN first",
            )
        with _translate(""):
            conn.execute("BEGIN")
    tx = _SQLiteTx(_CallerConnection(conn), time.time())  # type: ignore[arg-type]
    async with tx.savepoint():
        yield tx
