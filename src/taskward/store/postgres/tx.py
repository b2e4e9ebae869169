"""The transaction ``PostgresDB.transaction`` yields: the named statements on the connection
it holds, the guarded compare-and-swap updates, and the set-based writes in one round trip.

Owns what a statement inside a transaction binds (``now`` is the transaction's time) and how
several travel together (one pipeline, one Sync: the server runs them in order and the first
error aborts the rest). Invariant: a second running row of a serialization key is
``ConcurrencyKeyBusy`` (R7) and a taken transition key ``KeyAlreadyUsed``, raised inside the one
translation of driver errors (``errors.translate``); a notification names a channel of
``signals.CHANNELS`` or is refused before anything is sent.

``PostgresDB.transaction`` owns BEGIN, COMMIT (with the NOTIFYs) and ROLLBACK; this class
never ends the transaction it runs in.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from psycopg import errors as pg_errors

from taskward.store.guarded import (
    build_run_update,
    build_run_update_many,
)
from taskward.store.port import ConcurrencyKeyBusy, Params, Row, RunUpdate
from taskward.store.postgres.arrays import _claim_arrays, _columns, _finish_arrays
from taskward.store.postgres.connection import AsyncConn
from taskward.store.postgres.errors import _transition_key_taken, translate
from taskward.store.queries import load_queries, to_pyformat
from taskward.store.signals import CHANNELS

_RUNNING_KEY_INDEX = "idx_schedule_runs_running_concurrency"


class _PgTx:
    def __init__(self, conn: AsyncConn, now: float) -> None:
        self._conn = conn
        self._queries = load_queries("postgres")
        self.now = now
        self.channels: set[str] = set()

    def notify(self, channel: str) -> None:
        if channel not in CHANNELS:
            raise ValueError(f"unknown channel {channel!r}; allowed: {', '.join(CHANNELS)}")
        self.channels.add(channel)

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        """A nested scope whose failure rolls back only itself."""
        with translate():
            await self._conn.execute(b"SAVEPOINT tw_sp")
        try:
            yield
        except BaseException:
            with translate():
                await self._conn.execute(b"ROLLBACK TO SAVEPOINT tw_sp")
                await self._conn.execute(b"RELEASE SAVEPOINT tw_sp")
            raise
        with translate():
            await self._conn.execute(b"RELEASE SAVEPOINT tw_sp")

    def _params(self, params: Params | None) -> dict[str, Any]:
        merged = dict(params or {})
        merged.setdefault("now", self.now)
        return merged

    async def execute(self, name: str, params: Params | None = None) -> int:
        with translate():
            cur = await self._conn.execute(self._queries[name], self._params(params))
            return cur.rowcount

    async def fetchone(self, name: str, params: Params | None = None) -> Row | None:
        with translate():
            cur = await self._conn.execute(self._queries[name], self._params(params))
            return await cur.fetchone()

    async def fetchall(self, name: str, params: Params | None = None) -> list[Row]:
        with translate():
            cur = await self._conn.execute(self._queries[name], self._params(params))
            return await cur.fetchall()

    async def fetchone_each(self, name: str, params_list: Sequence[Params]) -> list[Row | None]:
        """The named statement once per parameter set, pipelined: one round trip for all."""
        return await self.fetch_batch([(name, p) for p in params_list])

    async def fetch_batch(self, statements: Sequence[tuple[str, Params]]) -> list[Row | None]:
        """Several named statements in one round trip (pipeline mode), results in order."""
        return [rows[0] if rows else None for rows in await self.fetchall_batch(statements)]

    async def fetchall_batch(self, statements: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """Several named statements in one round trip (pipeline mode), every row of each."""
        with translate():
            async with self._conn.pipeline():
                cursors = [
                    await self._conn.execute(self._queries[name], self._params(params))
                    for name, params in statements
                ]
            return [await cur.fetchall() if cur.description else [] for cur in cursors]

    async def write_many(self, statements: Sequence[tuple[str, Sequence[Params]]]) -> list[int]:
        """Each statement once over its rows, a binary array per column, all in one round
        trip (queries.sql: the set-based writes; ``together``)."""
        written, _, _ = await self.together(statements, [], [])
        return written

    async def run_update_if(
        self,
        run_id: str,
        from_state: str,
        values: Mapping[str, Any],
        guard: Mapping[str, Any],
        returning: Sequence[str] = (),
    ) -> Row | None:
        sql, params = build_run_update(values, guard, returning, json_cast="::jsonb")
        params.update(g_id=run_id, g_status=from_state)
        rows = await self._compare_and_swap(sql, params)
        return rows[0] if rows else None

    async def run_update_many(
        self, items: Sequence[RunUpdate], returning: Sequence[str] = ()
    ) -> list[Row]:
        sql, params = build_run_update_many(items, returning, dialect="postgresql")
        return await self._compare_and_swap(sql, params)

    def auditing(self) -> _PgTx:
        """A group's facts, events and notifications travel in its compare-and-swap's statement
        (data-modifying CTEs): one statement and one round trip instead of four and two."""
        return self

    async def finish_running(self, params: Mapping[str, Any]) -> list[Row]:
        """``run_finish_batch``: a group's terminal transitions, one statement (its per-row
        columns as binary arrays)."""
        _, [rows], _ = await self.together([], [params], [])
        return rows

    async def claim_queued(self, params: Mapping[str, Any]) -> list[Row]:
        """``run_claim_batch``: a claim pass's first page and its transitions, one statement
        (its new rows' ids as binary text arrays, not through psycopg's list dumper)."""
        _, _, [rows] = await self.together([], [], [params])
        return rows

    async def together(
        self,
        writes: Sequence[tuple[str, Sequence[Params]]],
        finishes: Sequence[Mapping[str, Any]],
        claims: Sequence[Mapping[str, Any]],
    ) -> tuple[list[int], list[list[Row]], list[list[Row]]]:
        """The statements in one round trip: several in one pipeline (one Sync), which the
        server runs in order, the first error skipping the rest and aborting the transaction;
        a lone one without entering pipeline mode (one round trip anyway). ``write_many``,
        ``finish_running`` and ``claim_queued`` are this with one kind of statement. The batch
        statements insert facts plainly: a taken transition key is the unique index's refusal,
        raised as ``KeyAlreadyUsed``."""
        sent = [(name, _columns(name, rows, self.now)) for name, rows in writes if rows]
        statements = [
            *sent,
            *(("run_finish_batch", _finish_arrays(params)) for params in finishes),
            *(("run_claim_batch", _claim_arrays(params)) for params in claims),
        ]
        if not statements:  # nothing to write: no round trip
            return [0] * len(writes), [], []
        with translate(), _transition_key_taken():
            if len(statements) == 1:
                [(name, params)] = statements
                cursors = [await self._conn.execute(self._queries[name], self._params(params))]
            else:
                async with self._conn.pipeline():
                    cursors = [
                        await self._conn.execute(self._queries[name], self._params(params))
                        for name, params in statements
                    ]
            counts = iter(cursor.rowcount for cursor in cursors[: len(sent)])
            answers = [await cursor.fetchall() for cursor in cursors[len(sent) :]]
        written = [next(counts) if rows else 0 for _, rows in writes]
        return written, answers[: len(finishes)], answers[len(finishes) :]

    async def _compare_and_swap(self, sql: str, params: dict[str, Any]) -> list[Row]:
        """A guarded update's rows; a second running row of a serialization key (the unique
        index refuses it) is ConcurrencyKeyBusy (R7)."""
        with translate():
            try:
                cur = await self._conn.execute(to_pyformat(sql), params)
            except pg_errors.UniqueViolation as exc:
                if exc.diag.constraint_name == _RUNNING_KEY_INDEX:
                    raise ConcurrencyKeyBusy(str(exc)) from exc
                raise
            return await cur.fetchall()
