"""PostgreSQL dialect: psycopg 3, async, with a connection pool.

For deployments whose workers span machines. The store's clock is the server's (R9), so workers
on hosts with skewed clocks agree on when a lease expires.

The server going away (a restart, a failover, a terminated backend) is ``StoreUnavailable``,
which callers retry (``taskward.store.retry``); this module makes sure the store recovers by
itself once the server is back: a failure sends the pool to check its idle connections (dead
ones are replaced at once instead of failing one caller each), the pool keeps reconnecting for
as long as the server is away, and the LISTEN connection re-establishes itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final

import psycopg
from psycopg import errors as pg_errors
from psycopg.adapt import Buffer, Dumper, Loader
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import Format
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolClosed

from taskward.errors import StoreError, StoreUnavailable, TaskValidationError
from taskward.loops import raise_if_cancelling
from taskward.store.guarded import (
    build_run_update,
    build_run_update_many,
)
from taskward.store.migrate import MIGRATIONS_TABLE, load_migrations
from taskward.store.pgarrays import ARRAY_TYPES, PgArray, pg_array, text_array
from taskward.store.port import ConcurrencyKeyBusy, KeyAlreadyUsed, Params, Row, RunUpdate
from taskward.store.queries import load_queries, many_columns, to_pyformat
from taskward.store.retry import Backoff, Streak
from taskward.store.signals import CHANNELS, Signal, Signals

log = logging.getLogger("taskward.store.postgres")

# pg_advisory_xact_lock key serialising migrations across processes ("taskward" in ASCII).
MIGRATION_LOCK_KEY = 0x7461736B77617264

_NOW_SQL = "SELECT extract(epoch FROM clock_timestamp())::float8 AS now"
# Every transaction taskward opens finds its rows by key (ids, the partial indexes of the
# queue), never by reading a whole table, and says so to the planner: sequential scans are
# priced out for the transaction's length (SET LOCAL; they stay possible where nothing else
# can answer). Without this, a table filled moments ago and not yet analyzed has no
# statistics, the planner guesses that a guard such as ``leased_by IS NULL`` keeps 0.5 % of
# its rows, and it nests the set-based compare-and-swap's arrays under a scan of the whole
# table at the start of a drain, worse the deeper the queue (measured:
# docs/benchmarks.md#figures-that-justified-design-choices).
# JIT is off with it: a scan that must stay (a table with no index for the question) now costs
# 1e10 on paper, which would otherwise compile the statement (as migration 0006 found).
# Both travel with BEGIN: no round trip of their own.
_BEGIN_SQL = "BEGIN; SET LOCAL enable_seqscan = off; SET LOCAL jit = off"
_BEGIN_NOW_SQL = f"{_BEGIN_SQL}; {_NOW_SQL}".encode()
_RUNNING_KEY_INDEX = "idx_schedule_runs_running_concurrency"
_TRANSITION_KEY_INDEX = "idx_status_transitions_idempotency"
_CHANNEL_PREFIX = "taskward_"


def _commit_sql(channels: set[str]) -> bytes:
    """The NOTIFYs and the COMMIT in one round trip (one simple query: no parameters). The
    channels come from ``signals.CHANNELS`` only (``_PgTx.notify`` refuses any other)."""
    notifies = "".join(f"NOTIFY {_CHANNEL_PREFIX}{channel}; " for channel in sorted(channels))
    return f"{notifies}COMMIT".encode()


# The empty documents, each read as a new object (a caller may mutate what a row holds).
_EMPTY_JSON: Final[dict[bytes, Callable[[], Any]]] = {b"{}": dict, b"[]": list, b"null": type(None)}


class _JsonLoader(Loader):
    """json/jsonb text to Python, as psycopg's own loader but without its per-value detour
    (``json.loads`` of bytes detects the encoding first) and with the empty documents most
    rows hold (``trigger_context``, capabilities) answered without parsing. The server sends
    UTF-8, as psycopg's own loader assumes."""

    def load(self, data: Buffer) -> Any:
        raw = bytes(data)
        empty = _EMPTY_JSON.get(raw)
        return empty() if empty is not None else json.loads(raw.decode("utf-8"))


def _columns(name: str, rows: Sequence[Params], now: float | None) -> dict[str, Any]:
    """A set-based write's parameters: each of its columns as the list of that column's values
    in ``rows`` (which hold exactly the one-row statement's parameters), typed for its array."""
    params: dict[str, Any] = {
        column: pg_array(pg_type, [row[column] for row in rows])
        for column, pg_type in many_columns(name)
    }
    params["now"] = now
    return params


class _ArrayDumper(Dumper):
    """A ``PgArray`` as it is: already PostgreSQL's binary array (store.pgarrays)."""

    format = Format.BINARY

    def dump(self, obj: PgArray) -> Buffer:
        return obj.data


_ARRAY_DUMPERS = {
    kind: type(f"_{kind.__name__}Dumper", (_ArrayDumper,), {"oid": kind.array_oid})
    for kind in ARRAY_TYPES
}


def configure_adapters(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Every connection, async or synchronous: the JSON loaders and the array dumpers above."""
    conn.adapters.register_loader("jsonb", _JsonLoader)
    conn.adapters.register_loader("json", _JsonLoader)
    for kind, dumper in _ARRAY_DUMPERS.items():
        conn.adapters.register_dumper(kind, dumper)


async def _configure(conn: AsyncConn) -> None:
    configure_adapters(conn)


# What passes by itself: retried by callers as StoreUnavailable (taskward.store.retry).
# 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now, 57P05
# idle_session_timeout, 40001 serialization_failure, 40P01 deadlock_detected, 55P03
# lock_not_available, 57014 query_canceled (statement_timeout), 58030 io_error.
TRANSIENT_SQLSTATES: Final = frozenset(
    {"57P01", "57P02", "57P03", "57P05", "40001", "40P01", "55P03", "57014", "58030"}
)
# 08 connection_exception, 53 insufficient_resources (too many connections, disk full, OOM).
TRANSIENT_SQLSTATE_CLASSES: Final = frozenset({"08", "53"})

# A server that answered but refused this connection for a reason no waiting fixes: the URL
# names a database or a role that does not exist, a wrong password, a pg_hba.conf rule, no
# CONNECT privilege, a database closed to connections, a TLS requirement the server cannot
# meet. libpq reports a refused connection without its SQLSTATE (psycopg's ``sqlstate`` is
# None), so they are recognised by the server's words (its default, English lc_messages).
# Anything else (refused, reset, timed out, too many clients, a server starting up, a message
# in another language) counts as away and is waited on, as before.
PERMANENT_REFUSALS: Final = tuple(
    re.compile(pattern)
    for pattern in (
        r'FATAL:\s+database ".*" does not exist',  # 3D000 invalid_catalog_name
        r'FATAL:\s+role ".*" does not exist',  # 28000 invalid_authorization_specification
        r"FATAL:\s+\w+ authentication failed for user",  # 28P01 invalid_password (also ident)
        r"FATAL:\s+no pg_hba\.conf entry",  # 28000
        r"FATAL:\s+pg_hba\.conf rejects connection",  # 28000
        r"FATAL:\s+permission denied for database",  # 42501 insufficient_privilege
        r'FATAL:\s+database ".*" is not currently accepting connections',  # 55000
        r"fe_sendauth: no password supplied",  # the server wants a password the URL lacks
        r"server does not support SSL, but SSL was required",  # sslmode=require
    )
)
# A pool that has not opened after this long makes one direct connection of its own, whose error
# tells a permanent refusal (raised at once) from a server that is away (waited on).
PROBE_AFTER_S: Final = 0.2

LISTENER_BACKOFF: Final = Backoff(base_s=0.05, cap_s=2.0)
# A reconnection attempt of the pool gives up after this; the pool then starts another at once
# (see PostgresDB._reconnect_failed), so its waits between attempts never grow past ~2 s.
DEFAULT_RECONNECT_TIMEOUT_S: Final = 5.0

AsyncConn = psycopg.AsyncConnection[dict[str, Any]]


def is_transient(exc: psycopg.Error) -> bool:
    """Whether ``exc`` passes by itself (the server or the connection was briefly away)."""
    if isinstance(exc, PoolClosed):  # this store was closed: nothing to wait for
        return False
    state = exc.sqlstate
    if state is None:  # no answer from a server: refused, reset, lost, pool exhausted
        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    return state in TRANSIENT_SQLSTATES or state[:2] in TRANSIENT_SQLSTATE_CLASSES


def is_permanent_refusal(cause: str) -> bool:
    """Whether ``cause`` (a failed connection's message, ``one_line``) is a refusal no waiting
    fixes (``PERMANENT_REFUSALS``)."""
    return any(pattern.search(cause) for pattern in PERMANENT_REFUSALS)


def translate_error(exc: psycopg.Error) -> StoreError:
    """The store error of a driver error: ``StoreUnavailable`` when it passes by itself."""
    text = " ".join(str(exc).split())
    if exc.sqlstate:
        text = f"{text} [SQLSTATE {exc.sqlstate} {type(exc).__name__}]"
    if is_transient(exc):
        return StoreUnavailable(f"PostgreSQL unavailable, retry later: {text}")
    if isinstance(exc, PoolClosed):
        return StoreError("this store was closed; open a new one")
    return StoreError(f"PostgreSQL error: {text}")


def check_conninfo(conninfo: str, shown_url: str, *, password: str | None = None) -> None:
    """Raise ``TaskValidationError`` for a connection string libpq refuses to parse (unknown
    parameter, malformed URI), with libpq's own words; reaching the server is not tried.

    libpq quotes the token it could not read, which may be the password (a stray ``%`` in
    it): ``password``, as the URL spells it, never appears in the message."""
    try:
        conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        words = str(exc).strip()
        if password:
            words = words.replace(password, "***")
        raise TaskValidationError(
            "url",
            shown_url,
            "a libpq URI (https://www.postgresql.org/docs/current/libpq-connect.html) with "
            "taskward's options pool_min, pool_max, open_timeout_s, reconnect_timeout_s, migrate",
            message=f"invalid PostgreSQL URL {shown_url}: {words}",
        ) from None  # the driver's exception quotes the token too


def pool_settings(
    pool_min: int, pool_max: int, connect_timeout_s: float, reconnect_timeout_s: float
) -> dict[str, Any]:
    """What every taskward pool is, async or synchronous (the synchronous client's too): sized
    by the URL, opened explicitly, its connections autocommit with rows as dicts."""
    return {
        "min_size": pool_min,
        "max_size": pool_max,
        "open": False,
        "timeout": connect_timeout_s,
        "reconnect_timeout": reconnect_timeout_s,
        "kwargs": {"autocommit": True, "row_factory": dict_row},
    }


def one_line(exc: BaseException) -> str:
    """A driver's (often multi-line) message on one line."""
    return " ".join(str(exc).split())


def statement(name: str, params: Params | None) -> tuple[str, dict[str, Any]]:
    """A named statement outside a transaction and its parameters (``now`` None: the SQL falls
    back to the server clock, R9); the async store's and the synchronous client's."""
    merged = dict(params or {})
    merged.setdefault("now", None)
    return load_queries("postgres")[name], merged


@contextmanager
def translate() -> Iterator[None]:
    """Translate driver errors once, at the store boundary."""
    try:
        yield
    except (ConcurrencyKeyBusy, KeyAlreadyUsed, StoreError):
        raise
    except psycopg.Error as exc:
        raise translate_error(exc) from exc
    except OSError as exc:  # a socket error the driver did not wrap
        raise StoreUnavailable(f"PostgreSQL unavailable, retry later: {exc}") from exc


# run_finish_batch's per-row parameters and their array types.
_FINISH_ARRAYS: Final = (
    ("ids", "text"),
    ("attempts", "integer"),
    ("expiries", "float8"),
    ("exit_codes", "integer"),
    ("evidence", "text"),
    ("fact_ids", "text"),
    ("event_ids", "text"),
    ("outbox_ids", "text"),
)


def _finish_arrays(params: Mapping[str, Any]) -> dict[str, Any]:
    """``run_finish_batch``'s parameters, its per-row columns as binary arrays."""
    arrays = {name: pg_array(pg_type, params[name]) for name, pg_type in _FINISH_ARRAYS}
    return {**params, **arrays}


def _claim_arrays(params: Mapping[str, Any]) -> dict[str, Any]:
    """``run_claim_batch``'s parameters, its new rows' ids as binary text arrays."""
    return {**params, **{name: text_array(params[name]) for name in ("fact_ids", "event_ids")}}


@contextmanager
def _transition_key_taken() -> Iterator[None]:
    """A taken transition key, refused by the unique index, as ``KeyAlreadyUsed`` (inside
    ``translate``, which passes taskward's own errors through)."""
    try:
        yield
    except pg_errors.UniqueViolation as exc:
        if exc.diag.constraint_name == _TRANSITION_KEY_INDEX:
            raise KeyAlreadyUsed(str(exc)) from exc
        raise


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


class PostgresDB:
    """A StateDB over a PostgreSQL database."""

    dialect = "postgresql"
    supports_listen_notify = True
    concurrent_writers = True

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
        self.url = url
        self.conninfo = conninfo
        self._pool: AsyncConnectionPool[AsyncConn] = AsyncConnectionPool(
            conninfo,
            **pool_settings(pool_min, pool_max, connect_timeout_s, reconnect_timeout_s),
            reconnect_failed=self._reconnect_failed,
            configure=_configure,
        )
        self._closed = False
        # The hot connection: one pool connection kept checked out for whoever needs a
        # connection while it is free. Calls that follow one another (single admissions, a
        # worker's group commits, which never overlap) then skip the pool's checkout and return
        # (measured: docs/benchmarks.md#figures-that-justified-design-choices).
        # Concurrent callers use the pool.
        self._hot: AsyncConn | None = None
        self._hot_busy = False
        self._signals = Signals()
        self._listener: asyncio.Task[None] | None = None
        self._pool_check: asyncio.Task[None] | None = None
        # How often the LISTEN connection was established (tests and diagnostics).
        self.listener_connects = 0

    async def connect(self) -> None:
        """Open the pool, waiting up to ``open_timeout_s`` for a server that is away
        (``StoreUnavailable``, naming the cause); a permanent refusal (``PERMANENT_REFUSALS``:
        no such database or role, bad credentials...) is a ``StoreError`` at once. On any
        failure the pool is closed: it does not go on reconnecting in the background."""
        if self._closed:
            raise StoreError("this store was closed; open a new one")
        opening = asyncio.ensure_future(self._open_pool())
        try:
            done, _ = await asyncio.wait({opening}, timeout=PROBE_AFTER_S)
            if not done:
                # Slow to open: a permanent refusal fails now, not after open_timeout_s.
                self._raise_if_permanent(await self._connect_error())
            try:
                await opening
            except StoreUnavailable as exc:
                # The pool says only that it timed out; one connection of our own says why (the
                # server refused or is away, a bad sslmode, a wrong password...).
                cause = await self._connect_error()
                if cause is None:
                    raise
                self._raise_if_permanent(cause)
                raise StoreUnavailable(f"{exc}; connecting: {cause}") from exc
        except BaseException:
            if not opening.done():
                opening.cancel()
                with contextlib.suppress(BaseException):
                    await opening
            await self.close()
            raise

    async def _open_pool(self) -> None:
        with translate():
            await self._pool.open(wait=True, timeout=self._pool.timeout)

    def _raise_if_permanent(self, cause: str | None) -> None:
        if cause is not None and is_permanent_refusal(cause):
            raise StoreError(
                f"PostgreSQL refused the connection to {self.url}, and waiting will not help: "
                f"{cause} (check the database name, user and password of the URL)"
            )

    async def _connect_error(self) -> str | None:
        """The error one direct connection attempt ends in (None: it succeeded), waiting at
        most ``open_timeout_s`` or 2 s, whichever is shorter, on top of the pool's wait."""
        wait_s = min(self._pool.timeout, 2.0)
        try:
            async with asyncio.timeout(wait_s):
                conn = await psycopg.AsyncConnection.connect(self.conninfo)
        except TimeoutError:
            return f"no connection within {wait_s:g} s"
        except (psycopg.Error, OSError) as exc:
            return one_line(exc)
        await conn.close()
        return None

    async def close(self) -> None:
        """Close the pool; safe to call twice."""
        if not self._closed:
            self._closed = True
            hot, self._hot = self._hot, None
            if hot is not None and not self._hot_busy:
                with contextlib.suppress(Exception):
                    await self._pool.putconn(hot)
            for task in (self._listener, self._pool_check):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await self._pool.close()

    async def __aenter__(self) -> PostgresDB:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConn]:
        if not self._hot_busy and not self._closed:
            # One event loop: testing and setting the flag cannot interleave with another
            # caller. The hot connection goes back to the pool (which checks, resets or
            # discards it) after any error, cancellation or a transaction left open.
            self._hot_busy = True
            try:
                async with self._hot_connection() as conn:
                    yield conn
            finally:
                self._hot_busy = False
            return
        try:
            with translate():
                async with self._pool.connection() as conn:
                    yield conn
        except StoreUnavailable:
            self._check_pool_soon()
            raise

    @asynccontextmanager
    async def _hot_connection(self) -> AsyncIterator[AsyncConn]:
        try:
            if self._hot is None:
                with translate():
                    self._hot = await self._pool.getconn()
            conn = self._hot
        except StoreUnavailable:
            self._check_pool_soon()
            raise
        clean = False
        try:
            yield conn
            clean = conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
        except StoreUnavailable:
            self._check_pool_soon()
            raise
        finally:
            if not clean or self._closed:
                self._hot = None
                with contextlib.suppress(Exception):
                    await self._pool.putconn(conn)

    # -- recovery --------------------------------------------------------------------------

    def _check_pool_soon(self) -> None:
        """After a failure, test the pool's idle connections in the background: after a server
        restart every one of them is dead, and each would otherwise fail a caller in turn."""
        if self._closed or (self._pool_check is not None and not self._pool_check.done()):
            return
        with contextlib.suppress(RuntimeError):  # no running loop: nothing to schedule on
            self._pool_check = asyncio.get_running_loop().create_task(self._check_pool())

    async def _check_pool(self) -> None:
        with contextlib.suppress(Exception):
            await self._pool.check()

    async def _reconnect_failed(self, pool: AsyncConnectionPool[AsyncConn]) -> None:
        """A reconnection attempt gave up (``reconnect_timeout_s``): start another at once.
        The pool would otherwise wait for the next caller to grow again, and a caller already
        waiting for a connection would wait out its whole timeout."""
        if not self._closed:
            log.warning("PostgreSQL still unreachable; the pool keeps reconnecting")
            self._check_pool_soon()

    # -- wake-ups: LISTEN/NOTIFY ------------------------------------------------------------

    def wake(self, channel: str) -> None:
        self._signals.bump(channel)

    def signal(self, channel: str) -> Signal:
        """Commits anywhere wake this process through LISTEN on a dedicated connection, which
        is re-established (with a wake-up, in case a notification was missed) if it drops."""
        if self._listener is None and not self._closed:
            self._listener = asyncio.get_running_loop().create_task(self._listen())
        return self._signals.get(channel)

    def _listener_params(self) -> dict[str, Any]:
        """The LISTEN connection: named, so operators can see it, and with TCP keepalives, so a
        silently dropped connection is noticed (libpq ignores them on Unix sockets)."""
        params = conninfo_to_dict(self.conninfo)
        app = str(params.get("application_name") or "taskward")
        extra: dict[str, Any] = {"application_name": f"{app}-listener"[:63]}
        for name, value in (
            ("keepalives", 1),
            ("keepalives_idle", 10),
            ("keepalives_interval", 5),
            ("keepalives_count", 3),
            ("connect_timeout", max(2, int(self._pool.timeout))),
        ):
            if name not in params:
                extra[name] = value
        return extra

    async def _listen(self) -> None:
        streak = Streak(LISTENER_BACKOFF, what="PostgreSQL LISTEN connection", logger=log)
        while not self._closed:
            raise_if_cancelling()
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.conninfo, autocommit=True, **self._listener_params()
                )
                async with conn:
                    for channel in CHANNELS:
                        await conn.execute(f"LISTEN {_CHANNEL_PREFIX}{channel}")
                    self.listener_connects += 1
                    if streak.failures:
                        self._check_pool_soon()  # the server is back: refresh the pool now
                    streak.succeeded()
                    self._signals.bump()  # anything committed while we were not listening
                    async for note in conn.notifies():
                        name = note.channel.removeprefix(_CHANNEL_PREFIX)
                        if name in CHANNELS:
                            self._signals.bump(name)
                raise psycopg.OperationalError("the LISTEN connection ended")
            except (psycopg.Error, OSError) as exc:
                if self._closed:
                    return
                await asyncio.sleep(streak.failed(exc))

    async def now(self) -> float:
        async with self.connection() as conn:
            with translate():
                row = await (await conn.execute(_NOW_SQL)).fetchone()
        assert row is not None
        return float(row["now"])

    @asynccontextmanager
    async def transaction(self, *, now: float | None = None) -> AsyncIterator[_PgTx]:
        """BEGIN and the server clock travel in one round trip; NOTIFYs go out at COMMIT."""
        async with self.connection() as conn:
            with translate():
                if now is None:
                    cur = await conn.execute(_BEGIN_NOW_SQL)
                    while cur.nextset():  # BEGIN, the two SET LOCALs, then the clock
                        pass
                    row = await cur.fetchone()
                    assert row is not None
                    now = float(row["now"])
                else:
                    await conn.execute(_BEGIN_SQL.encode())
            tx = _PgTx(conn, now)
            try:
                yield tx
                with translate():
                    await conn.execute(_commit_sql(tx.channels))
            except BaseException:
                with contextlib.suppress(Exception):
                    await conn.execute(b"ROLLBACK")
                raise
        if tx.channels:
            self._signals.bump(*tx.channels)

    async def fetchone(self, name: str, params: Params | None = None) -> Row | None:
        rows = await self.fetchall(name, params)
        return rows[0] if rows else None

    async def fetchall(self, name: str, params: Params | None = None) -> list[Row]:
        sql, merged = statement(name, params)
        async with self.connection() as conn:
            with translate():
                cur = await conn.execute(sql, merged)
                return await cur.fetchall()

    async def execute(self, name: str, params: Params | None = None) -> int:
        sql, merged = statement(name, params)
        async with self.connection() as conn:
            with translate():
                return (await conn.execute(sql, merged)).rowcount

    async def migrate(self) -> list[str]:
        applied: list[str] = []
        async with self.connection() as conn:
            with translate():
                async with conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
                    await conn.execute(
                        f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (version INTEGER PRIMARY"
                        " KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
                    )
                    cur = await conn.execute(f"SELECT version FROM {MIGRATIONS_TABLE}")
                    done = {r["version"] for r in await cur.fetchall()}
                    for migration in load_migrations("postgres"):
                        if migration.version in done:
                            continue
                        await conn.execute(migration.sql.encode("utf-8"))
                        await conn.execute(
                            f"INSERT INTO {MIGRATIONS_TABLE} (version, name, applied_at) "
                            "VALUES (%s, %s, extract(epoch FROM clock_timestamp()))",
                            (migration.version, migration.name),
                        )
                        applied.append(f"{migration.version:04d}_{migration.name}")
        return applied
