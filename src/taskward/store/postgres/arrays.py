"""The set-based statements' parameters as PostgreSQL binary arrays (``store.pgarrays``):
``write_many``'s ``_many`` statements, ``run_finish_batch`` and ``run_claim_batch``. Pure: no
connection, no I/O.

Invariant: each per-row parameter goes as one binary array of the element type its
statement's SQL casts it to: a ``_many`` statement's columns and types are read from its own
``:name::type[]`` casts (``queries.many_columns``); ``run_finish_batch``'s are
``_FINISH_ARRAYS``, which must match the casts of its ``unnest(...)`` in queries.sql; and
``run_claim_batch``'s new rows' ids are text arrays.

Underscored names are the dialect's own: its sibling modules import them, the rest of
taskward does not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from taskward.store.pgarrays import pg_array, text_array
from taskward.store.port import Params
from taskward.store.queries import many_columns


def _columns(name: str, rows: Sequence[Params], now: float | None) -> dict[str, Any]:
    """A set-based write's parameters: each of its columns as the list of that column's values
    in ``rows`` (which hold exactly the one-row statement's parameters), typed for its array."""
    params: dict[str, Any] = {
        column: pg_array(pg_type, [row[column] for row in rows])
        for column, pg_type in many_columns(name)
    }
    params["now"] = now
    return params


# run_finish_batch's per-row parameters and their array types.
_FINISH_ARRAYS: Final = (
    ("ids", "text"),
    ("attempts", "integer"),
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
