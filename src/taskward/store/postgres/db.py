"""PostgreSQL dialect: psycopg 3, async, with a connection pool.

For deployments whose workers span machines. The store's clock is the server's (R9), so workers
on hosts with skewed clocks agree on when a lease expires.

The server going away (a restart, a failover, a terminated backend) is ``StoreUnavailable``,
which callers retry (``taskward.store.retry``); this module makes sure the store recovers by
itself once the server is back: a failure sends the pool to check its idle connections (dead
ones are replaced at once instead of failing one caller each), the pool keeps reconnecting for
as long as the server is away, and the LISTEN connection re-establishes itself.

``PostgresDB`` owns the pool, the hot connection, recovery, BEGIN/COMMIT/ROLLBACK and the
migrations; the rest of the dialect sits beside it, imports pointing one way (each module
imports only those before it): ``errors`` (driver errors as store errors), ``connection``
(every connection's settings and adapters), ``arrays`` (set-based parameters as binary
arrays), ``listen`` (LISTEN/NOTIFY), ``tx`` (the transaction, ``_PgTx``), then this module.
``store.open`` imports the store from here, and the names other code imports from here
(``check_conninfo``, ``translate_error``, ``is_permanent_refusal``, ``_PgTx``...) are
re-exported below.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import psycopg
from psycopg_pool import AsyncConnectionPool

from taskward.errors import StoreError, StoreUnavailable
from taskward.store.migrate import MIGRATIONS_TABLE, load_migrations
from taskward.store.port import Params, Row
from taskward.store.postgres.connection import (
    DEFAULT_RECONNECT_TIMEOUT_S,
    PROBE_AFTER_S,
    AsyncConn,
    _configure,
    check_conninfo,
    configure_adapters,
    pool_settings,
    statement,
)
from taskward.store.postgres.errors import (
    PERMANENT_REFUSALS,
    TRANSIENT_SQLSTATE_CLASSES,
    TRANSIENT_SQLSTATES,
    is_permanent_refusal,
    is_transient,
    one_line,
    translate,
    translate_error,
)
from taskward.store.postgres.listen import LISTENER_BACKOFF, Listener, _commit_sql
from taskward.store.postgres.tx import _PgTx
from taskward.store.signals import Signal, Signals

if TYPE_CHECKING:
    from taskward.metrics import TaskMetrics

__all__ = [
    "DEFAULT_RECONNECT_TIMEOUT_S",
    "LISTENER_BACKOFF",
    "MIGRATION_LOCK_KEY",
    "PERMANENT_REFUSALS",
    "PROBE_AFTER_S",
    "TRANSIENT_SQLSTATES",
    "TRANSIENT_SQLSTATE_CLASSES",
    "AsyncConn",
    "PostgresDB",
    "_PgTx",
    "check_conninfo",
    "configure_adapters",
    "is_permanent_refusal",
    "is_transient",
    "one_line",
    "pool_settings",
    "statement",
    "translate",
    "translate_error",
]

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
        self.metrics: TaskMetrics | None = None  # set by its owner (StateDB.metrics)
        self._signals = Signals()
        self._listener = Listener(
            conninfo,
            self._signals,
            connect_timeout_s=self._pool.timeout,
            server_back=self._check_pool_soon,
        )
        self._pool_check: asyncio.Task[None] | None = None

    @property
    def listener_connects(self) -> int:
        """How often the LISTEN connection was established (tests and diagnostics)."""
        return self._listener.connects

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
            # First, so the LISTEN connection stops trying the moment the store is closed.
            await self._listener.close()
            hot, self._hot = self._hot, None
            if hot is not None and not self._hot_busy:
                with contextlib.suppress(Exception):
                    await self._pool.putconn(hot)
            if self._pool_check is not None:
                self._pool_check.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._pool_check
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
        is re-established (with a wake-up, in case a notification was missed) if it drops
        (``listen.Listener``)."""
        if not self._closed:
            self._listener.start()
        return self._signals.get(channel)

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
