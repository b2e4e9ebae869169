"""``open_db(url)`` (and the synchronous client's ``open_sync_db``): pick the dialect from the
URL. The only module that imports a dialect.

URLs:
  ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` (default ``sqlite:///taskward.db``)
      options: ``synchronous=FULL`` (default: an acknowledged admission survives power loss) or
      ``NORMAL`` (faster; the last transactions before a power cut may roll back, never corrupt),
      ``lock_timeout_s`` (default 30: how long a write waits for another process's lock before
      ``StoreUnavailable``), ``migrate=false``.
  ``postgresql://user@host:port/dbname`` (any libpq URI)
      options: ``pool_min``, ``pool_max``, ``open_timeout_s`` (default 10: how long a caller
      waits for a connection before ``StoreUnavailable``), ``reconnect_timeout_s`` (default 5:
      one reconnection attempt of the pool; another follows at once), ``migrate=false``; the
      rest go to libpq, which must accept them (checked before connecting). Opening waits up
      to ``open_timeout_s`` for a server that is away, but a refusal no waiting fixes (no such
      database or role, bad credentials: ``postgres.errors.PERMANENT_REFUSALS``) is a
      ``StoreError`` at once.
The URL comes from the caller, else ``TASKWARD_DATABASE_URL``, else the default.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from collections.abc import AsyncIterator, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from taskward.errors import StoreError, TaskValidationError
from taskward.store.migrate import load_migrations
from taskward.store.port import StateDB, SyncStatements, Tx

T = TypeVar("T", int, float)
R = TypeVar("R")

DEFAULT_URL = "sqlite:///taskward.db"
ENV_VAR = "TASKWARD_DATABASE_URL"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def resolve_url(url: str | None = None) -> str:
    return url or os.environ.get(ENV_VAR) or DEFAULT_URL


def _flag(options: dict[str, str], name: str, default: bool) -> bool:
    value = options.pop(name, None)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise TaskValidationError(name, value, "true, false")


def _number(
    options: dict[str, str],
    name: str,
    default: T,
    parse: Callable[[str], T],
    valid: Callable[[T], bool],
    allowed: str,
) -> T:
    """Pop the option ``name`` as ``parse`` reads it; ``default`` when absent. A value that
    does not parse, or that ``valid`` refuses, is a TaskValidationError naming ``allowed``."""
    value = options.pop(name, None)
    if value is None:
        return default
    try:
        number = parse(value)
    except ValueError:
        raise TaskValidationError(name, value, allowed) from None
    if not valid(number):
        raise TaskValidationError(name, value, allowed)
    return number


def _seconds(options: dict[str, str], name: str, default: float) -> float:
    return _number(
        options, name, default, float, lambda s: 0 < s < math.inf, "a positive number of seconds"
    )


def _count(options: dict[str, str], name: str, default: int, *, least: int) -> int:
    return _number(
        options, name, default, int, lambda n: n >= least, f"a whole number of at least {least}"
    )


# libpq options that carry a secret (conninfo keywords), shown as *** wherever a URL is shown.
_SECRET_OPTIONS: Final = frozenset({"password", "sslpassword"})


def redact(url: str) -> str:
    """``url`` as it may be shown (banners, errors): its password, in the authority or as a
    query option, replaced by ``***``."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    secret_option = any(name in _SECRET_OPTIONS for name, _ in query)
    if not parts.password and not secret_option:
        return url  # rebuilt, a sqlite:/// URL would lose a slash
    if parts.password:
        parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@"))
    if secret_option:
        shown = [(name, "***" if name in _SECRET_OPTIONS else value) for name, value in query]
        parts = parts._replace(query=urlencode(shown, safe="*"))
    return urlunsplit(parts)


# A dialect's settings are its stores' constructor arguments, by name: the async store and the
# synchronous client's are built from the same object (``_construct``).
@dataclass(frozen=True)
class _SQLiteSettings:
    path: str
    url: str
    synchronous: str
    lock_budget_s: float


@dataclass(frozen=True)
class _PostgresSettings:
    conninfo: str
    url: str  # redacted
    pool_min: int
    pool_max: int
    connect_timeout_s: float
    reconnect_timeout_s: float


def _construct(settings: _SQLiteSettings | _PostgresSettings, *, sync: bool) -> Any:
    """The store ``settings`` describe: the async one, or the synchronous client's."""
    kind: Any
    if isinstance(settings, _SQLiteSettings):
        if sync:
            from taskward.store.sqlite.sync import SQLiteSyncDB as kind
        else:
            from taskward.store.sqlite.db import SQLiteDB as kind
    elif sync:
        from taskward.store.postgres.sync import PostgresSyncDB as kind
    else:
        from taskward.store.postgres.db import PostgresDB as kind
    return kind(**asdict(settings))


def _settings(url: str) -> tuple[_SQLiteSettings | _PostgresSettings, bool]:
    """What ``url`` asks for, and whether to migrate on open; every option checked here, before
    anything connects (the async store and the synchronous client read URLs alike)."""
    parts = urlsplit(url)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    settings: _SQLiteSettings | _PostgresSettings
    if parts.scheme == "sqlite":
        from taskward.store.sqlite.db import SYNCHRONOUS_MODES

        path = url.split("?", 1)[0][len("sqlite://") :]
        path = path[1:] if path.startswith("/") else path
        if not path:
            raise TaskValidationError("url", url, "sqlite:///relative.db or sqlite:////abs.db")
        migrate = _flag(options, "migrate", True)
        synchronous = options.pop("synchronous", "FULL")
        if synchronous.upper() not in SYNCHRONOUS_MODES:
            raise TaskValidationError("synchronous", synchronous, ", ".join(SYNCHRONOUS_MODES))
        lock_timeout_s = _seconds(options, "lock_timeout_s", 30.0)
        if options:
            raise TaskValidationError(
                "url",
                url,
                "sqlite options synchronous, lock_timeout_s, migrate",
                message=f"unknown sqlite URL options: {', '.join(options)}",
            )
        settings = _SQLiteSettings(path, url, synchronous.upper(), lock_timeout_s)
    elif parts.scheme in {"postgresql", "postgres"}:
        from taskward.store.postgres.db import check_conninfo

        migrate = _flag(options, "migrate", True)
        pool_min = _count(options, "pool_min", 1, least=0)
        pool_max = _count(options, "pool_max", 10, least=max(1, pool_min))
        open_timeout_s = _seconds(options, "open_timeout_s", 10.0)
        reconnect_timeout_s = _seconds(options, "reconnect_timeout_s", 5.0)
        conninfo = urlunsplit(parts._replace(scheme="postgresql", query=urlencode(options)))
        # What libpq itself rejects (an unknown query parameter such as ``schema``) fails here,
        # at once: the pool would take it for an unreachable server and retry until its timeout.
        check_conninfo(conninfo, redact(url), password=parts.password)
        settings = _PostgresSettings(
            conninfo, redact(url), pool_min, pool_max, open_timeout_s, reconnect_timeout_s
        )
    else:
        raise TaskValidationError("url", redact(url), "sqlite:///path.db, postgresql://...")
    return settings, migrate


def check_url(url: str) -> None:
    """Raise TaskValidationError for a URL ``open_db`` would refuse; nothing connects."""
    _settings(url)


async def _open(url: str | None) -> StateDB:
    settings, migrate = _settings(resolve_url(url))
    db = _construct(settings, sync=False)
    await db.connect()
    try:
        if migrate:
            await db.migrate()
    except BaseException:
        await db.close()
        raise
    store: StateDB = db
    return store


def open_sync_db(url: str | None = None) -> SyncStatements:
    """The synchronous client's store at ``url`` (``taskward.client.SyncClient``), its schema
    current: migrated first where the URL allows (through the async store, on a thread of its
    own, so a caller inside a running event loop can open one too); with ``migrate=false`` a
    store behind this version of taskward is a StoreError naming ``taskward migrate``."""
    url = resolve_url(url)
    settings, migrate = _settings(url)
    db = _construct(settings, sync=True)
    dialect = "sqlite" if isinstance(settings, _SQLiteSettings) else "postgres"
    try:
        latest = len(load_migrations(dialect))  # gap-free: the count is the newest version
        version = db.schema_version()
        if version < latest:
            if not migrate:
                raise StoreError(
                    f"the store at {settings.url} is at schema version {version}, this taskward"
                    f" needs {latest}: run `taskward migrate` (or drop migrate=false)"
                )
            with ThreadPoolExecutor(1, thread_name_prefix="taskward-migrate") as pool:
                pool.submit(asyncio.run, _migrate(url)).result()
    except BaseException:
        db.close()
        raise
    sync_db: SyncStatements = db
    return sync_db


async def _migrate(url: str) -> None:
    db = await _open(url)
    await db.close()


class _Opening:
    """Awaitable (``db = await open_db(url)``) and async context manager (closes on exit)."""

    def __init__(self, url: str | None) -> None:
        self._url = url
        self._db: StateDB | None = None

    def __await__(self) -> Generator[Any, None, StateDB]:
        return _open(self._url).__await__()

    async def __aenter__(self) -> StateDB:
        self._db = await _open(self._url)
        return self._db

    async def __aexit__(self, *exc: object) -> None:
        if self._db is not None:
            await self._db.close()


def open_db(url: str | None = None) -> _Opening:
    """Open (and by default migrate) the store at ``url``."""
    return _Opening(url)


# -- R24: the caller's own transaction ---------------------------------------------------------

CALLER_CONNECTIONS: Final = (
    "a psycopg Connection or AsyncConnection, a sqlite3.Connection on the store's file, a "
    "SQLAlchemy 2 Connection, Session, AsyncConnection or AsyncSession over one of them (or "
    "over aiosqlite), or Django's connection"
)


def _from_sqlalchemy(conn: object) -> bool:
    return type(conn).__module__.startswith("sqlalchemy.")


def is_async_connection(conn: object) -> bool:
    """Whether ``conn`` must be awaited (``await taskward.submit_task(conn, ...)``)."""
    if _from_sqlalchemy(conn):
        return hasattr(conn, "get_raw_connection") or hasattr(conn, "sync_session")
    return type(conn).__name__ == "AsyncConnection" and type(conn).__module__.startswith("psycopg")


def is_caller_connection(conn: object) -> bool:
    """Whether ``conn`` is a caller's connection (R24) rather than a taskward store. Decided
    by type, without importing a driver the caller does not use."""
    import sqlite3

    if isinstance(conn, sqlite3.Connection) or _from_sqlalchemy(conn) or _from_django(conn):
        return True
    return type(conn).__module__.startswith("psycopg") and type(conn).__name__ in (
        "Connection",
        "AsyncConnection",
    )


def _from_django(conn: object) -> bool:
    """Django's ``connection`` (a ``ConnectionProxy``) or one of ``connections[alias]``."""
    return type(conn).__module__.startswith("django.") and hasattr(conn, "ensure_connection")


async def _driver_connection(conn: Any) -> Any:
    """The driver's own connection under a SQLAlchemy object (its current transaction's: a
    Session's is begun by asking for it) or a Django ``connection`` (inside
    ``transaction.atomic()``), else ``conn``. Suspends only for async objects."""
    if _from_django(conn):
        conn.ensure_connection()
        return conn.connection
    if not _from_sqlalchemy(conn):
        return conn
    if hasattr(conn, "sync_session"):  # AsyncSession
        conn = await conn.connection()
    if hasattr(conn, "get_raw_connection"):  # AsyncConnection
        return (await conn.get_raw_connection()).driver_connection
    if hasattr(conn, "get_bind") and callable(getattr(conn, "connection", None)):  # Session
        conn = conn.connection()
    return conn.connection.driver_connection  # Connection


async def in_driver_thread(conn: Any, work: Callable[[Any], R]) -> R | None:
    """``work(raw)`` run in the thread that owns ``conn``'s driver connection, when its driver
    confines it to a thread of its own (``aiosqlite``, under SQLAlchemy's async SQLite: its
    ``sqlite3.Connection`` is used only in its worker thread, through its ``_execute``); None
    for every other connection, which the caller's own thread may use."""
    raw = await _driver_connection(conn)
    run_in_thread = getattr(raw, "_execute", None)
    inner = getattr(raw, "_conn", None)
    if not type(raw).__module__.startswith("aiosqlite") or run_in_thread is None:
        return None
    import sqlite3

    if not isinstance(inner, sqlite3.Connection):  # pragma: no cover - another aiosqlite
        raise TaskValidationError("connection", type(conn).__name__, CALLER_CONNECTIONS)
    result: R = await run_in_thread(work, inner)
    return result


@contextlib.asynccontextmanager
async def caller_transaction(conn: Any) -> AsyncIterator[Tx]:
    """R24: a ``Tx`` inside the caller's open transaction on ``conn`` (``CALLER_CONNECTIONS``),
    which it never commits or rolls back: its writes are in a savepoint (a failure undoes just
    them) and its wake-ups commit with the caller's transaction (PostgreSQL ``NOTIFY``).

    Raises:
        TaskValidationError: ``conn`` is none of those, or not in a transaction that can commit.
    """
    import sqlite3

    raw = await _driver_connection(conn)
    found: contextlib.AbstractAsyncContextManager[Any]
    if isinstance(raw, sqlite3.Connection):
        from taskward.store.sqlite.caller import caller_transaction as sqlite_caller

        found = sqlite_caller(raw)
    elif is_caller_connection(raw):
        from taskward.store.postgres.caller import caller_transaction as postgres_caller

        found = postgres_caller(raw)
    else:
        raise TaskValidationError("connection", type(conn).__name__, CALLER_CONNECTIONS)
    async with found as tx:
        yield tx
