"""Build the one dynamic statement: the guarded compare-and-swap update of a run.

Column names come only from the allowlists in ``port``; every value is a bind parameter.
Both dialects use this builder so the CAS semantics cannot drift between them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, Literal, overload

from taskward.store.pgarrays import pg_array
from taskward.store.port import (
    JSON_COLUMNS,
    RUN_GUARD_COLUMNS,
    RUN_PATCH_COLUMNS,
    RUN_PROJECTION_COLUMNS,
    RunUpdate,
)

_RETURNABLE = (
    RUN_PATCH_COLUMNS
    | RUN_PROJECTION_COLUMNS
    | {
        "id",
        "concurrency_key",
        "action_kind",
        "schedule_id",
        "execution_target",
        "idempotency_key",
        "created_at",
        "has_dependents",  # R21: a terminal write settles the dependents of a row that has any
    }
)


def build_run_update(
    values: Mapping[str, Any],
    guard: Mapping[str, Any],
    returning: Sequence[str],
    *,
    json_cast: str = "",
) -> tuple[str, dict[str, Any]]:
    """Return ``(sql, params)`` with ``:name`` binds for a guarded update of one run."""
    settable = RUN_PATCH_COLUMNS | RUN_PROJECTION_COLUMNS
    bad = sorted(set(values) - settable) + sorted(set(guard) - RUN_GUARD_COLUMNS)
    bad += sorted(set(returning) - _RETURNABLE - {"*"})
    if bad:
        raise ValueError(f"columns outside the run allowlist: {', '.join(bad)}")
    params: dict[str, Any] = {}
    sets = []
    for column, value in values.items():
        params[f"v_{column}"] = value
        cast = json_cast if column in JSON_COLUMNS else ""
        sets.append(f"{column} = :v_{column}{cast}")
    where = ["id = :g_id", "status = :g_status"]
    for column, value in guard.items():
        if value is None:
            where.append(f"{column} IS NULL")
        else:
            params[f"g_{column}"] = value
            where.append(f"{column} = :g_{column}")
    sql = f"UPDATE schedule_runs SET {', '.join(sets)} WHERE {' AND '.join(where)}"
    sql += f" RETURNING {', '.join(returning) if returning else 'id'}"
    return sql, params


# PostgreSQL types of the columns a guarded update sets or compares: a multi-row VALUES list
# needs them spelled out (a column that is NULL in every row would otherwise be text).
PG_RUN_COLUMN_TYPES = {
    "id": "text",
    "status": "text",
    "updated_at": "float8",
    "status_reason_code": "text",
    "status_reason_summary": "text",
    "status_evidence_refs": "jsonb",
    "queued_at": "float8",
    "leased_by": "text",
    "lease_expires_at": "float8",
    "lease_attempts": "integer",
    "ended_at": "float8",
    "exit_code": "integer",
    "error_detail": "text",
    "retry_at": "float8",
    "cancel_requested_at": "float8",
    "cancel_requested_by": "text",
    "invocation_id": "text",
    "deadline_at": "float8",
}


Shape = tuple[tuple[str, ...], tuple[tuple[str, bool], ...]]
"""``update_shape``: the columns set, and each guarded column with whether it is IS NULL."""


def update_shape(item: RunUpdate) -> Shape:
    """What must be equal for updates to share one statement: the columns set, and the columns
    guarded with whether each guard is IS NULL."""
    _, _, values, guard = item
    return tuple(values), tuple((column, value is None) for column, value in guard.items())


@lru_cache(maxsize=512)
def _sqlite_statement(shape: Shape, returning: tuple[str, ...], count: int) -> str:
    """The SQLite statement of a shape for ``count`` rows: ``VALUES (?, ?, ...), ...`` with
    positional parameters, a row's values in ``_columns(shape)`` order, then the rows in
    order (``_table`` flattened). Positional: with one named parameter per cell, binding a
    batch's completion (a dict of hundreds of names, each looked up by SQLite's name) cost as
    much as the update itself (measured:
    docs/benchmarks.md#figures-that-justified-design-choices)."""
    names, _ = _columns(shape)
    row = "(" + ", ".join("?" for _ in names) + ")"
    source = "VALUES " + ", ".join(row for _ in range(count))
    update = _update_clause(shape, returning, pg=False)
    return f"WITH v({', '.join(names)}) AS ({source}) {update}"


def _checked_shape(items: Sequence[RunUpdate], returning: Sequence[str]) -> Shape:
    """The one shape of ``items``, checked: columns inside the allowlists, every item of that
    shape, no run twice (two updates of one row cannot share a statement: only one of them
    would apply)."""
    if not items:
        raise ValueError("no updates")
    shape = update_shape(items[0])
    value_columns, guard_shape = shape
    settable = RUN_PATCH_COLUMNS | RUN_PROJECTION_COLUMNS
    bad = sorted(set(value_columns) - settable)
    bad += sorted({c for c, _ in guard_shape} - RUN_GUARD_COLUMNS)
    bad += sorted(set(returning) - _RETURNABLE - {"*"})
    if bad:
        raise ValueError(f"columns outside the run allowlist: {', '.join(bad)}")
    seen: set[str] = set()
    for item in items:
        if update_shape(item) != shape:
            raise ValueError("updates of different shapes cannot share a statement")
        if item[0] in seen:
            raise ValueError(f"run {item[0]!r} appears twice in one batch")
        seen.add(item[0])
    return shape


def _compared(shape: Shape) -> list[str]:
    return [column for column, is_null in shape[1] if not is_null]


@lru_cache(maxsize=64)
def _columns(shape: Shape) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The statement's per-row values: their names in ``v`` and the run columns they are of."""
    compared = _compared(shape)
    names = ("g_id", "g_status", *(f"g_{c}" for c in compared), *(f"v_{c}" for c in shape[0]))
    return names, ("id", "status", *compared, *shape[0])


def _table(items: Sequence[RunUpdate], shape: Shape) -> list[tuple[Any, ...]]:
    """One tuple per item, in the order of ``_columns(shape)``."""
    compared = _compared(shape)
    return [
        (run_id, from_state, *[guard[c] for c in compared], *[values[c] for c in shape[0]])
        for run_id, from_state, values, guard in items
    ]


def _update_clause(shape: Shape, returning: tuple[str, ...], *, pg: bool) -> str:
    """``UPDATE ... FROM v WHERE <id, status, each guard> RETURNING ...``."""
    value_columns, guard_shape = shape
    sets = ", ".join(f"{column} = v.v_{column}" for column in value_columns)
    where = ["schedule_runs.id = v.g_id", "schedule_runs.status = v.g_status"]
    for column, is_null in guard_shape:
        where.append(
            f"schedule_runs.{column} IS NULL"
            if is_null
            else f"schedule_runs.{column} = v.g_{column}"
        )
    if "*" in returning:
        # PostgreSQL's bare * would add v's columns; SQLite returns only the target's anyway.
        listed = "schedule_runs.*" if pg else "*"
    else:
        listed = ", ".join(f"schedule_runs.{c}" for c in dict.fromkeys(("id", *returning)))
    return f"UPDATE schedule_runs SET {sets} FROM v WHERE {' AND '.join(where)} RETURNING {listed}"


@lru_cache(maxsize=64)
def _pg_statement(shape: Shape, returning: tuple[str, ...]) -> str:
    """The PostgreSQL statement of a shape, built once: one typed array per column, so its text
    never depends on the number of rows (the driver parses it once, the server keeps it
    prepared). Parameters are named by position (c0, c1, ...; ``v(...)`` names the columns),
    short enough to keep the statement under psycopg's 4,096-byte parse cache."""
    names, columns = _columns(shape)
    types = [PG_RUN_COLUMN_TYPES[column] for column in columns]
    arrays = ", ".join(f":c{j}::{pg_type}[]" for j, pg_type in enumerate(types))
    head = f"WITH v({', '.join(names)}) AS (SELECT * FROM unnest({arrays}))"
    return f"{head} {_update_clause(shape, returning, pg=True)}"


def _pg_params(shape: Shape, table: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
    """Each column of ``table`` as the binary array of its type (``store.pgarrays``: cheaper
    than psycopg's generic list dumper; a binary array holds one type, so
    each column's values are coerced to it)."""
    _, columns = _columns(shape)
    return {
        f"c{j}": pg_array(PG_RUN_COLUMN_TYPES[column], [row[j] for row in table])
        for j, column in enumerate(columns)
    }


@overload
def build_run_update_many(
    items: Sequence[RunUpdate], returning: Sequence[str], *, dialect: Literal["postgresql"]
) -> tuple[str, dict[str, Any]]: ...


@overload
def build_run_update_many(
    items: Sequence[RunUpdate], returning: Sequence[str], *, dialect: Literal["sqlite"]
) -> tuple[str, list[Any]]: ...


def build_run_update_many(
    items: Sequence[RunUpdate],
    returning: Sequence[str],
    *,
    dialect: Literal["postgresql", "sqlite"],
) -> tuple[str, dict[str, Any] | list[Any]]:
    """One statement holding one guarded compare-and-swap per item (each row is matched on its
    own id, status and guard values, exactly as ``build_run_update`` would match it alone):
    PostgreSQL's takes one typed array per column (named), SQLite's a ``VALUES`` list
    (positional, ``_sqlite_statement``).

    Every item must have the same ``update_shape`` and a distinct run id. The updated rows come
    back in no particular order; callers match them by ``id``, which is always returned.
    """
    shape = _checked_shape(items, returning)
    table = _table(items, shape)
    if dialect == "postgresql":
        return _pg_statement(shape, tuple(returning)), _pg_params(shape, table)
    sql = _sqlite_statement(shape, tuple(returning), len(table))
    return sql, [cell for row in table for cell in row]
