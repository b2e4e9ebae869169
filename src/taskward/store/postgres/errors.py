"""PostgreSQL's driver errors as taskward's store errors, for the async store and the
synchronous client alike.

Owns the one classification of a psycopg error: what passes by itself (``StoreUnavailable``,
which callers retry: ``taskward.store.retry``), what a refused connection no waiting fixes
looks like (``PERMANENT_REFUSALS``), and a taken transition key as ``KeyAlreadyUsed``.
Invariant: a driver error leaves the store translated exactly once (``translate``), and
taskward's own errors raised inside it pass through unchanged.

Underscored names are the dialect's own: its sibling modules import them, the rest of
taskward does not.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import PoolClosed

from taskward.errors import StoreError, StoreUnavailable
from taskward.store.port import ConcurrencyKeyBusy, KeyAlreadyUsed

_TRANSITION_KEY_INDEX = "idx_status_transitions_idempotency"

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


def one_line(exc: BaseException) -> str:
    """A driver's (often multi-line) message on one line."""
    return " ".join(str(exc).split())


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
