"""Crash injection for the fault scenarios: test-only, nothing of it is in ``src/``.

``python -m tests.faults.crashing [taskward CLI arguments]`` runs the taskward CLI with one crash
point armed by ``TASKWARD_CRASH=<when>:<boundary>:<n>``. The process ends with
``os._exit(CRASH_EXIT)`` -- no cleanup, no reply, no flushed buffers, as a SIGKILL would leave
it -- right ``before`` or right ``after`` the n-th commit of that boundary. ``before`` dies with
the transaction open (the store rolls it back); ``after`` dies between the commit and whatever
the committer would have done next (reply, acknowledge, the next step).

The store is wrapped where every write passes: the ``transaction()`` of both dialects (each
statement a transaction runs is recorded through a proxy of its ``Tx``) and the single-statement
writes that run outside one (``execute``/``fetchone``/``fetchall`` of an INSERT/UPDATE/DELETE
query, such as admission's ``run_insert_if_new`` and the summary fallback). A committed unit of
work is classified by what it wrote (``boundaries_of``). ``run`` is not a commit: it wraps the
adapter run of the resident host (``before`` the adapter starts, ``after`` it returned, before the
summary and the acknowledgement).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final

CRASH_ENV: Final = "TASKWARD_CRASH"
CRASH_EXIT: Final = 137
WHENS: Final = ("before", "after")
BOUNDARIES: Final = (
    "admission",  # run_insert_if_new: a new row
    "claim",  # a queued -> running fact
    "run",  # the adapter run (not a commit)
    "summary",  # summary_write
    "complete",  # a running -> completed fact
    "outbox_claim",  # outbox_claim_due that leased at least one row
    "outbox_ack",  # outbox_ack that recorded a delivery
    "reap",  # a reaper fact leaving running (key reap:)
    "promote",  # a reaper fact retry_wait -> queued (key ready:)
    "cancel",  # a cancel fact (key cancel:) or a recorded cancellation request
)


@dataclass(frozen=True)
class Statement:
    """A named statement a unit ran, and what it returned (rows, or a count for ``execute``)."""

    name: str
    params: Mapping[str, Any]
    result: int | list[Any]

    @property
    def rows(self) -> int:
        return self.result if isinstance(self.result, int) else len(self.result)

    def expanded(self) -> list[Statement]:
        """A set-based ``<name>_many`` (recorded from ``Tx.write_many``: the one-row parameter
        sets in ``rows``, the count written as the result) as the one-row statements it stands
        for. A short count means the transaction is rolled back, or which rows were skipped is
        unknown here: none of them counts as written."""
        single = _MANY.get(self.name)
        if single is None:
            return [self]
        rows = list(self.params["rows"])
        whole = self.rows >= len(rows)
        return [Statement(single, row, [row] if whole else []) for row in rows]


_MANY: Final = {
    "fact_insert_many": "fact_insert",
    "summary_write_many": "summary_write",
    "summary_insert_many": "summary_write",  # a one-step finish's plain insert of the same rows
    "event_insert_many": "event_insert",
    "outbox_enqueue_many": "outbox_enqueue",
    "run_insert_many_if_new": "run_insert_if_new",
}


def _fact_boundary(params: Mapping[str, Any]) -> str | None:
    key = str(params.get("idempotency_key") or "")
    previous, status = params.get("previous_status"), params.get("status")
    if previous == "queued" and status == "running":
        return "claim"
    if status == "completed":
        return "complete"
    for prefix, boundary in (("reap:", "reap"), ("ready:", "promote"), ("cancel:", "cancel")):
        if key.startswith(prefix):
            return boundary
    return None


def boundaries_of(statements: Sequence[Statement]) -> set[str]:
    """The boundaries a unit of work crosses when it commits these statements."""
    found: set[str] = set()
    for s in (one for statement in statements for one in statement.expanded()):
        if s.name == "run_insert_if_new" and s.rows:
            found.add("admission")
        elif s.name == "fact_insert" and s.rows:
            boundary = _fact_boundary(s.params)
            if boundary:
                found.add(boundary)
        elif s.name == "run_request_cancel" and s.rows:
            found.add("cancel")
        elif s.name == "summary_write":
            found.add("summary")
        elif s.name == "outbox_claim_due" and s.rows:
            found.add("outbox_claim")
        elif s.name == "outbox_ack" and s.rows:
            found.add("outbox_ack")
    return found


@dataclass
class CrashPoint:
    when: str
    boundary: str
    n: int
    seen: int = 0

    @classmethod
    def parse(cls, spec: str) -> CrashPoint:
        when, boundary, n = spec.split(":")
        if when not in WHENS or boundary not in BOUNDARIES or int(n) < 1:
            raise ValueError(f"{CRASH_ENV}={spec!r}: expected <{'|'.join(WHENS)}>:<boundary>:<n>")
        return cls(when, boundary, int(n))

    def crash(self, why: str) -> None:
        sys.stderr.write(f"taskward-crash: {why}\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT)

    def before(self, boundaries: set[str]) -> bool:
        """Count a unit about to commit; crash if it is the armed one. True if it is armed."""
        if self.boundary not in boundaries:
            return False
        self.seen += 1
        if self.seen == self.n and self.when == "before":
            self.crash(f"before {self.boundary} #{self.n}")
        return self.seen == self.n

    def after(self, armed: bool) -> None:
        if armed and self.when == "after":
            self.crash(f"after {self.boundary} #{self.n}")


@dataclass
class _Recording:
    statements: list[Statement] = field(default_factory=list)

    def add(self, name: str, params: Mapping[str, Any] | None, result: Any) -> None:
        if result is None:
            result = []
        elif not isinstance(result, int | list):
            result = [result]
        self.statements.append(Statement(name, dict(params or {}), result))


class _RecordingTx:
    """A ``Tx`` that records every named statement and its result size."""

    def __init__(self, tx: Any, recording: _Recording) -> None:
        self._tx = tx
        self._recording = recording

    def __getattr__(self, name: str) -> Any:
        # Named statements must pass through a recording method above: a new Tx method that
        # runs them would otherwise go unrecorded and its commits would cross no boundary
        # (the long-form crash cases then wait for a crash that never comes).
        if name.startswith(("fetch", "execute", "write", "claim", "finish", "together")):
            raise AttributeError(f"_RecordingTx does not record Tx.{name}: wrap it")
        return getattr(self._tx, name)

    @property
    def now(self) -> float:
        value: float = self._tx.now
        return value

    async def execute(self, name: str, params: Mapping[str, Any] | None = None) -> int:
        count: int = await self._tx.execute(name, params)
        self._recording.add(name, params, count)
        return count

    async def fetchone(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        row = await self._tx.fetchone(name, params)
        self._recording.add(name, params, row)
        return row

    async def fetchall(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        rows = await self._tx.fetchall(name, params)
        self._recording.add(name, params, list(rows))
        return rows

    async def fetchone_each(self, name: str, params_list: Sequence[Mapping[str, Any]]) -> Any:
        rows = await self._tx.fetchone_each(name, params_list)
        for params, row in zip(params_list, rows, strict=True):
            self._recording.add(name, params, row)
        return rows

    async def fetch_batch(self, statements: Sequence[tuple[str, Mapping[str, Any]]]) -> Any:
        rows = await self._tx.fetch_batch(statements)
        for (name, params), row in zip(statements, rows, strict=True):
            self._recording.add(name, params, row)
        return rows

    async def fetchall_batch(self, statements: Sequence[tuple[str, Mapping[str, Any]]]) -> Any:
        results = await self._tx.fetchall_batch(statements)
        for (name, params), rows in zip(statements, results, strict=True):
            self._recording.add(name, params, list(rows))
        return results

    async def write_many(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[int]:
        counts: list[int] = await self._tx.write_many(statements)
        for (name, rows), count in zip(statements, counts, strict=True):
            self._recording.add(name, {"rows": list(rows)}, count)
        return counts

    def auditing(self) -> _RecordingTx | None:
        return self if self._tx.auditing() is not None else None

    async def finish_running(self, params: Mapping[str, Any]) -> Any:
        """Recorded as the fact inserts it made, one ``fact_insert`` per fact written
        (PostgreSQL writes a group's terminal transitions in one statement)."""
        rows = await self._tx.finish_running(params)
        self._record_finish(params, rows)
        return rows

    async def claim_queued(self, params: Mapping[str, Any]) -> Any:
        """Recorded as ``run_claim_batch`` (a write: it crosses boundaries) and as the fact
        inserts it made, one ``fact_insert`` per claimed row (PostgreSQL claims a page's rows
        and writes their facts in one statement)."""
        rows = await self._tx.claim_queued(params)
        self._record_claim(params, rows)
        return rows

    async def together(
        self,
        writes: Sequence[tuple[str, Sequence[Any]]],
        finishes: Sequence[Mapping[str, Any]],
        claims: Sequence[Mapping[str, Any]],
    ) -> Any:
        """Recorded statement by statement, in the order sent, as ``write_many``,
        ``finish_running`` and ``claim_queued`` record theirs."""
        written, finished, claimed = await self._tx.together(writes, finishes, claims)
        for (name, rows), count in zip(writes, written, strict=True):
            self._recording.add(name, {"rows": list(rows)}, count)
        for params, rows in zip(finishes, finished, strict=True):
            self._record_finish(params, rows)
        for params, rows in zip(claims, claimed, strict=True):
            self._record_claim(params, rows)
        return written, finished, claimed

    def _record_finish(self, params: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> None:
        written = {row["id"] for row in rows if row.get("fact_written")}
        for run_id, attempt in zip(params["ids"], params["attempts"], strict=True):
            if run_id in written:
                fact = {
                    "entity_id": run_id,
                    "previous_status": params["from_state"],
                    "status": params["to_state"],
                    "idempotency_key": f"{params['key_head']}{attempt}{params['key_tail']}",
                }
                self._recording.add("fact_insert", fact, [fact])

    def _record_claim(self, params: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> None:
        self._recording.add("run_claim_batch", params, list(rows))
        for row in rows:
            if row.get("id") is not None and row.get("fact_written"):
                fact = {
                    "entity_id": row["id"],
                    "previous_status": params["from_state"],
                    "status": params["to_state"],
                    "idempotency_key": (
                        f"{params['key_head']}{row['lease_attempts']}{params['key_tail']}"
                    ),
                }
                self._recording.add("fact_insert", fact, [fact])


_in_store_call: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "in_store_call", default=False
)


def _write_names(dialect: str) -> frozenset[str]:
    """Named queries that write (``WITH ... INSERT`` too); a read that locks (``FOR UPDATE``)
    may be counted in, which is harmless: it crosses no boundary."""
    from taskward.store.queries import load_queries

    verb = re.compile(r"\b(INSERT|UPDATE|DELETE)\b", re.IGNORECASE)

    def is_write(sql: str) -> bool:
        code = "\n".join(ln for ln in sql.splitlines() if not ln.lstrip().startswith("--"))
        return bool(verb.search(code))

    return frozenset(name for name, sql in load_queries(dialect).items() if is_write(sql))


def _wrap_store(cls: Any, point: CrashPoint, dialect: str) -> None:
    original_transaction = cls.transaction
    writes = _write_names(dialect)

    @asynccontextmanager
    async def transaction(self: Any, *, now: float | None = None) -> AsyncIterator[Any]:
        recording = _Recording()
        token = _in_store_call.set(True)
        try:
            async with original_transaction(self, now=now) as tx:
                yield _RecordingTx(tx, recording)
                armed = point.before(boundaries_of(recording.statements))
        finally:
            _in_store_call.reset(token)
        point.after(armed)

    cls.transaction = transaction

    for method in ("execute", "fetchone", "fetchall"):
        original = getattr(cls, method)

        def wrap(
            original: Callable[..., Awaitable[Any]],
        ) -> Callable[..., Awaitable[Any]]:
            async def call(self: Any, name: str, params: Mapping[str, Any] | None = None) -> Any:
                if name not in writes or _in_store_call.get():
                    return await original(self, name, params)
                token = _in_store_call.set(True)
                try:
                    # one statement, its own transaction: classified by its name alone
                    armed = point.before(boundaries_of([Statement(name, dict(params or {}), 1)]))
                    result = await original(self, name, params)
                finally:
                    _in_store_call.reset(token)
                point.after(armed)
                return result

            return call

        setattr(cls, method, wrap(original))


def _wrap_adapter_runs(point: CrashPoint) -> None:
    import taskward.host.runner as runner

    original = runner.execute_lease

    async def execute_lease(*args: Any, **kwargs: Any) -> Any:
        armed = point.before({"run"})
        result = await original(*args, **kwargs)
        point.after(armed)
        return result

    runner.execute_lease = execute_lease  # type: ignore[assignment]


def arm(spec: str) -> CrashPoint:
    """Install the crash point ``spec`` in this process."""
    from taskward.store.postgres.db import PostgresDB
    from taskward.store.sqlite.db import SQLiteDB

    point = CrashPoint.parse(spec)
    _wrap_store(SQLiteDB, point, "sqlite")
    _wrap_store(PostgresDB, point, "postgres")
    _wrap_adapter_runs(point)
    return point


def main(argv: Sequence[str] | None = None) -> int:
    spec = os.environ.get(CRASH_ENV)
    if spec:
        arm(spec)
    from taskward.cli.main import main as taskward_main

    return taskward_main(argv)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
