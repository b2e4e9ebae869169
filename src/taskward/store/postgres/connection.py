"""Every connection taskward opens to PostgreSQL, the async store's and the synchronous
client's alike: the conninfo checked before anything connects, the pool's settings, the
adapters registered on each connection, and a named statement outside a transaction.

Invariant: both stores build their pools from ``pool_settings`` and configure each connection
with ``configure_adapters``, so a row reads the same and a parameter travels the same whichever
store wrote or read it; outside a transaction ``now`` is None and the SQL falls back to the
server clock (R9).

Underscored names are the dialect's own: its sibling modules import them, the rest of
taskward does not.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

import psycopg
import psycopg.abc
from psycopg.adapt import Buffer, Dumper, Loader
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import Format
from psycopg.rows import dict_row

from taskward.errors import TaskValidationError
from taskward.store.pgarrays import ARRAY_TYPES, PgArray
from taskward.store.port import Params
from taskward.store.queries import load_queries

AsyncConn = psycopg.AsyncConnection[dict[str, Any]]

# A pool that has not opened after this long makes one direct connection of its own, whose error
# tells a permanent refusal (raised at once) from a server that is away (waited on).
PROBE_AFTER_S: Final = 0.2

# A reconnection attempt of the pool gives up after this; the pool then starts another at once
# (see PostgresDB._reconnect_failed), so its waits between attempts never grow past ~2 s.
DEFAULT_RECONNECT_TIMEOUT_S: Final = 5.0

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


class _ArrayDumper(Dumper):
    """A ``PgArray`` as it is: already PostgreSQL's binary array (store.pgarrays)."""

    format = Format.BINARY

    def dump(self, obj: PgArray) -> Buffer:
        return obj.data


_ARRAY_DUMPERS = {
    kind: type(f"_{kind.__name__}Dumper", (_ArrayDumper,), {"oid": kind.array_oid})
    for kind in ARRAY_TYPES
}


def configure_adapters(conn: psycopg.abc.AdaptContext) -> None:
    """Every connection, async or synchronous: the JSON loaders and the array dumpers above
    (also a cursor of a connection taskward does not own: R24's ``caller``)."""
    conn.adapters.register_loader("jsonb", _JsonLoader)
    conn.adapters.register_loader("json", _JsonLoader)
    for kind, dumper in _ARRAY_DUMPERS.items():
        conn.adapters.register_dumper(kind, dumper)


async def _configure(conn: AsyncConn) -> None:
    configure_adapters(conn)


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


def statement(name: str, params: Params | None) -> tuple[str, dict[str, Any]]:
    """A named statement outside a transaction and its parameters (``now`` None: the SQL falls
    back to the server clock, R9); the async store's and the synchronous client's."""
    merged = dict(params or {})
    merged.setdefault("now", None)
    return load_queries("postgres")[name], merged
