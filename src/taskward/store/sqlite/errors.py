"""SQLite's driver errors as taskward's store errors, for the async store and the
synchronous client alike.

Owns the one classification of a ``sqlite3`` error by its primary result code: another
connection holding the lock (``_is_busy``: the async store backs off and retries up to its lock
budget) and the failures that pass by themselves (``TRANSIENT_CODES``) are
``StoreUnavailable``, which callers retry (``taskward.store.retry``); any other is a
``StoreError``. Invariant: a driver error leaves the store translated exactly once, naming the
database file and SQLite's own error name.

Underscored names are the dialect's own: its sibling modules import them, the rest of
taskward does not.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from taskward.errors import StoreError, StoreUnavailable

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
