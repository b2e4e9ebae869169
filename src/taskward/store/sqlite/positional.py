"""SQLite's set-based writes bound by position: a named statement as a positional one, and
each row's values in its parameters' order (``_SQLiteTx.write_many``'s ``executemany``). Pure:
no connection, no I/O.

Binding by position is cheaper than by name (measured:
docs/benchmarks.md#figures-that-justified-design-choices). Invariant: a row binds exactly the
one-row statement's parameters, ``now`` (when the statement takes it) the transaction's time;
a row missing a value is a KeyError, as a missing named parameter is an error.

Underscored names are the dialect's own: its sibling modules import them, the rest of
taskward does not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from operator import itemgetter
from typing import Any

from taskward.store.port import Params
from taskward.store.queries import to_positional


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
