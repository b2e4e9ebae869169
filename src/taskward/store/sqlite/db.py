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
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from functools import lru_cache
from operator import itemgetter
from typing import Any, Final, TypeVar

from taskward.canonical import loads
from taskward.errors import StoreError, StoreUnavailable
from taskward.loops import raise_if_cancelling
from taskward.store.guarded import build_run_update, build_run_update_many
from taskward.store.migrate import MIGRATIONS_TABLE, load_migrations
from taskward.store.port import JSON_COLUMNS, ConcurrencyKeyBusy, Params, Row, RunUpdate
from taskward.store.queries import load_queries, to_positional
from taskward.store.signals import Signal, Signals

T = TypeVar("T")

SYNCHRONOUS_MODES = ("FULL", "NORMAL", "EXTRA")


RowFactory = Callable[[sqlite3.Cursor, tuple[Any, ...]], Row]


def row_factory() -> RowFactory:
    """A connection's row factory (one each): rows as dicts, JSON columns decoded.

    The column names and JSON column positions of the statement whose rows are being read are
    worked out once per statement, not once per row: a cursor keeps one ``description`` object for
    all its rows, so the factory keeps the last statement's plan with its description (whose
    identity then cannot be reused). The plan is the factory's own state, never shared.
    """
    plan: tuple[object, tuple[str, ...], tuple[int, ...]] | None = None

    def read(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> Row:
        nonlocal plan
        description = cursor.description
        current = plan
        if current is None or current[0] is not description:
            names = tuple(column[0] for column in description)
            json_at = tuple(i for i, name in enumerate(names) if name in JSON_COLUMNS)
            current = plan = (description, names, json_at)
        out: Row = dict(zip(current[1], row, strict=True))
        for i in current[2]:
            value = row[i]
            if isinstance(value, str):
                out[current[1][i]] = loads(value)
        return out

    return read


# Primary result codes: another connection holds the lock (retried up to the lock budget) ...
BUSY_CODES: Final = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
# ... and failures that pass by themselves: I/O, out of memory, disk full, cannot open, locking
# protocol. Both become StoreUnavailable.
TRANSIENT_CODES: Final = frozenset(
    {
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
    }
)


def _primary_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def _is_busy(exc: sqlite3.Error) -> bool:
    code = _primary_code(exc)
    if code is not None:
        return code in BUSY_CODES
    text = str(exc)
    return "locked" in text or "busy" in text


def translate_error(exc: sqlite3.Error, path: str) -> StoreError:
    """The store error of a driver error: ``StoreUnavailable`` when it passes by itself."""
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    if _is_busy(exc) or _primary_code(exc) in TRANSIENT_CODES:
        return StoreUnavailable(
            f"SQLite database {path!r} unavailable, retry later: {exc} [{name}]"
        )
    return StoreError(f"SQLite error on {path!r}: {exc} [{name}]")


@contextmanager
def _translate(path: str) -> Iterator[None]:
    """Translate driver errors once, at the store boundary."""
    try:
        yield
    except sqlite3.Error as exc:
        raise translate_error(exc, path) from exc


def statement(
    name: str, params: Params | None, clock: Callable[[], float]
) -> tuple[str, dict[str, Any]]:
    """A named statement outside a transaction and its parameters, ``now`` from ``clock`` when
    not given (the local clock is SQLite's store clock, R9); the async store's and the
    synchronous client's."""
    merged = dict(params or {})
    if merged.get("now") is None:
        merged["now"] = clock()
    return load_queries("sqlite")[name], merged


# A new store file is readable and writable by its owner alone: it holds task args (often
# secrets). SQLite creates the -wal and -shm files with the database file's own permissions, so
# all three are 0600. A file that already exists keeps the mode its operator gave it.
PRIVATE_FILE_MODE: Final = 0o600


def connect_private(path: str, **options: Any) -> sqlite3.Connection:
    """``sqlite3.connect(path, **options)``, the file created first with ``PRIVATE_FILE_MODE``
    when it does not exist yet (an empty file is an empty database)."""
    if path != ":memory:" and not path.startswith("file:"):
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE_FILE_MODE))
    conn: sqlite3.Connection = sqlite3.connect(path, **options)
    return conn


def row_count(cursor: sqlite3.Cursor) -> int:
    """``StateDB.execute``'s answer: the rows a statement wrote, or those a SELECT returned
    (sqlite3's ``rowcount`` is -1 for a statement that returns rows)."""
    if cursor.description is not None and cursor.rowcount == -1:
        return len(cursor.fetchall())
    return cursor.rowcount


def set_pragmas(conn: sqlite3.Connection, synchronous: str) -> None:
    """Every connection's settings after ``journal_mode=WAL`` (the async store's and the
    synchronous client's alike; each sets its own busy timeout)."""
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA foreign_keys=ON")
    # Statement journals and the scratch tables of RETURNING, sorts and the like in memory,
    # not in temporary files: a write statement inside a transaction that already changed
    # its pages (a group commit's claims after its completions) opened and wrote one, which
    # made every compare-and-swap of a drain dearer (measured:
    # docs/benchmarks.md#figures-that-justified-design-choices).
    # They are as small as the statement's own changes; taskward sorts no large result.
    conn.execute("PRAGMA temp_store=MEMORY")


@lru_cache(maxsize=64)
def _positional(sql: str) -> tuple[str, bool, Callable[[Mapping[str, Any]], tuple[Any, ...]]]:
    """A named statement as a positional one (``queries.to_positional``), whether it takes
    ``now`` (then its first parameter, the transaction's time), and what reads a row's other
    values in their parameters' order."""
    text, names = to_positional(sql)
    takes_now = names[:1] == ("now",)
    rest = names[1:] if takes_now else names
    if not rest:
        return text, takes_now, lambda row: ()
    if len(rest) == 1:
        only = rest[0]
        return text, takes_now, lambda row: (row[only],)
    return text, takes_now, itemgetter(*rest)


def _positional_rows(
    sql: str, rows: Sequence[Params], now: float
) -> tuple[str, list[tuple[Any, ...]]]:
    """``sql`` with positional parameters and each row's values in their order: binding by
    position is cheaper than by name (measured:
    docs/benchmarks.md#figures-that-justified-design-choices).
    A row missing a value is a KeyError, as a missing named parameter is an error."""
    text, takes_now, values = _positional(sql)
    if takes_now:
        return text, [(now, *values(row)) for row in rows]
    return text, [values(row) for row in rows]


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
        try:
            row: Row | None = self._conn.execute(sql, params).fetchone()
        except sqlite3.IntegrityError as exc:
            if "schedule_runs.concurrency_key" in str(exc):
                raise ConcurrencyKeyBusy(str(exc)) from exc
            raise translate_error(exc, self._path) from exc
        except sqlite3.Error as exc:
            raise translate_error(exc, self._path) from exc
        return row

    def auditing(self) -> None:
        """SQLite has no data-modifying CTEs: transitions writes a group's facts, events and
        notifications with write_many (executemany, in process) after run_update_many."""
        return None

    async def run_update_many(
        self, items: Sequence[RunUpdate], returning: Sequence[str] = ()
    ) -> list[Row]:
        sql, params = build_run_update_many(items, returning, dialect="sqlite")
        try:
            rows: list[Row] = self._conn.execute(sql, params).fetchall()
        except sqlite3.IntegrityError as exc:
            if "schedule_runs.concurrency_key" in str(exc):
                raise ConcurrencyKeyBusy(str(exc)) from exc
            raise translate_error(exc, self._path) from exc
        except sqlite3.Error as exc:
            raise translate_error(exc, self._path) from exc
        return rows


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
        applied: list[str] = []
        async with self._lock:
            conn = self._connection()
            await self._retry_busy(lambda: conn.execute("BEGIN IMMEDIATE"))
            try:
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} ("
                    "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
                )
                done = {
                    r["version"]
                    for r in conn.execute(f"SELECT version FROM {MIGRATIONS_TABLE}").fetchall()
                }
                for migration in load_migrations("sqlite"):
                    if migration.version in done:
                        continue
                    for statement in _split_statements(migration.sql):
                        conn.execute(statement)
                    conn.execute(
                        f"INSERT INTO {MIGRATIONS_TABLE} (version, name, applied_at) "
                        "VALUES (?, ?, ?)",
                        (migration.version, migration.name, self._clock()),
                    )
                    applied.append(f"{migration.version:04d}_{migration.name}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
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
