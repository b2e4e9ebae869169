"""Every connection taskward opens to a SQLite file, the async store's and the synchronous
client's alike: the file created private, the pragmas, the row factory, and a named statement
outside a transaction.

Invariant: both stores open their connections with ``connect_private`` and ``set_pragmas``
and read rows through a ``row_factory`` of their own, so a store file is private from its
first byte, every connection of it runs with the same settings, and a row reads the same
(a dict, its JSON columns decoded) whichever store read it. Outside a transaction ``now`` is
the local clock, SQLite's store clock (R9).

Underscored names are the dialect's own: its sibling modules import them, the rest of
taskward does not.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable
from typing import Any, Final

from taskward.canonical import loads
from taskward.store.port import JSON_COLUMNS, Params, Row
from taskward.store.queries import load_queries

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
