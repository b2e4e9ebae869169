"""The transaction ``SQLiteDB.transaction`` yields: the named statements on the store's one
connection, the guarded compare-and-swap updates, and the set-based writes.

Everything runs in process on the event-loop thread (no round trips to save: a batch is the
statements in order). Invariant: a second running row of a serialization key is
``ConcurrencyKeyBusy`` (R7), any other driver error is translated once (``errors``); the
channels a commit should wake are collected here and bumped by the store after COMMIT.

``SQLiteDB.transaction`` owns BEGIN IMMEDIATE, COMMIT and ROLLBACK; this class never ends the
transaction it runs in, and runs only while the store holds its connection lock.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from taskward.store.guarded import build_run_update, build_run_update_many
from taskward.store.port import ConcurrencyKeyBusy, Params, Row, RunUpdate
from taskward.store.queries import load_queries
from taskward.store.sqlite.connection import row_count
from taskward.store.sqlite.errors import _translate, translate_error
from taskward.store.sqlite.positional import _positional_rows


class _SQLiteTx:
    def __init__(self, conn: sqlite3.Connection, now: float, path: str = "") -> None:
        self._conn = conn
        self._path = path
        self._queries = load_queries("sqlite")
        self.now = now
        self.channels: set[str] = set()

    def notify(self, channel: str) -> None:
        self.channels.add(channel)

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        """A nested scope whose failure rolls back only itself."""
        with _translate(self._path):
            self._conn.execute("SAVEPOINT tw_sp")
        try:
            yield
        except BaseException:
            with _translate(self._path):
                self._conn.execute("ROLLBACK TO SAVEPOINT tw_sp")
                self._conn.execute("RELEASE SAVEPOINT tw_sp")
            raise
        with _translate(self._path):
            self._conn.execute("RELEASE SAVEPOINT tw_sp")

    def _params(self, params: Params | None) -> dict[str, Any]:
        merged = dict(params or {})
        merged.setdefault("now", self.now)
        return merged

    async def execute(self, name: str, params: Params | None = None) -> int:
        with _translate(self._path):
            return row_count(self._conn.execute(self._queries[name], self._params(params)))

    async def fetchone(self, name: str, params: Params | None = None) -> Row | None:
        with _translate(self._path):
            row: Row | None = self._conn.execute(
                self._queries[name], self._params(params)
            ).fetchone()
        return row

    async def fetchall(self, name: str, params: Params | None = None) -> list[Row]:
        with _translate(self._path):
            return self._conn.execute(self._queries[name], self._params(params)).fetchall()

    async def fetchone_each(self, name: str, params_list: Sequence[Params]) -> list[Row | None]:
        """The named statement once per parameter set, in order."""
        return await self.fetch_batch([(name, p) for p in params_list])

    async def fetch_batch(self, statements: Sequence[tuple[str, Params]]) -> list[Row | None]:
        """Several named statements in order (in-process: no round trips to save)."""
        return [rows[0] if rows else None for rows in await self.fetchall_batch(statements)]

    async def fetchall_batch(self, statements: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """Several named statements in order, every row of each."""
        with _translate(self._path):
            return [
                self._conn.execute(self._queries[name], self._params(params)).fetchall()
                for name, params in statements
            ]

    async def write_many(self, statements: Sequence[tuple[str, Sequence[Params]]]) -> list[int]:
        """``executemany`` of each statement: one execution per row, bound directly (the
        ``_many`` statements in queries.sql are one-row statements without RETURNING), by
        position (``_positional_rows``)."""
        counts = []
        with _translate(self._path):
            for name, rows in statements:
                if not rows:
                    counts.append(0)
                    continue
                sql, bound = _positional_rows(self._queries[name], rows, self.now)
                counts.append(self._conn.executemany(sql, bound).rowcount)
        return counts

    async def run_update_if(
        self,
        run_id: str,
        from_state: str,
        values: Mapping[str, Any],
        guard: Mapping[str, Any],
        returning: Sequence[str] = (),
    ) -> Row | None:
        sql, params = build_run_update(values, guard, returning)
        params.update(g_id=run_id, g_status=from_state)
        rows = self._compare_and_swap(sql, params)
        return rows[0] if rows else None

    def auditing(self) -> None:
        """SQLite has no data-modifying CTEs: transitions writes a group's facts, events and
        notifications with write_many (executemany, in process) after run_update_many."""
        return None

    async def run_update_many(
        self, items: Sequence[RunUpdate], returning: Sequence[str] = ()
    ) -> list[Row]:
        sql, params = build_run_update_many(items, returning, dialect="sqlite")
        return self._compare_and_swap(sql, params)

    def _compare_and_swap(self, sql: str, params: dict[str, Any] | list[Any]) -> list[Row]:
        """The guarded update's rows; a second running row of a serialization key (the unique
        index on running keys refuses it, R7) is ``ConcurrencyKeyBusy``."""
        try:
            rows: list[Row] = self._conn.execute(sql, params).fetchall()
        except sqlite3.IntegrityError as exc:
            if "schedule_runs.concurrency_key" in str(exc):
                raise ConcurrencyKeyBusy(str(exc)) from exc
            raise translate_error(exc, self._path) from exc
        except sqlite3.Error as exc:
            raise translate_error(exc, self._path) from exc
        return rows
