"""Build the one dynamic statement: the guarded compare-and-swap update of a run.

Column names come only from the allowlists in ``port``; every value is a bind parameter.
Both dialects use this builder so the CAS semantics cannot drift between them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

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


def update_shape(item: RunUpdate) -> tuple[tuple[str, ...], tuple[tuple[str, bool], ...]]:
    """What must be equal for updates to share one statement: the columns set, and the columns
    guarded with whether each guard is IS NULL."""
    _, _, values, guard = item
    return tuple(values), tuple((column, value is None) for column, value in guard.items())


@lru_cache(maxsize=64)
def _sqlite_values(names: tuple[str, ...], count: int) -> tuple[str, tuple[str, ...]]:
    """``VALUES (:a_0, :b_0), (:a_1, :b_1), ...`` for ``count`` rows, and its parameter names
    row by row (built once per shape and row count)."""
    keys = tuple(f"{name}_{n}" for n in range(count) for name in names)
    width = len(names)
    rows = (
        "(" + ", ".join(f":{key}" for key in keys[n * width : (n + 1) * width]) + ")"
        for n in range(count)
    )
    return "VALUES " + ", ".join(rows), keys


def build_run_update_many(
    items: Sequence[RunUpdate],
    returning: Sequence[str],
    *,
    dialect: str,
) -> tuple[str, dict[str, Any]]:
    """One statement holding one guarded compare-and-swap per item (each row is matched on its
    own id, status and guard values, exactly as ``build_run_update`` would match it alone).

    Every item must have the same ``update_shape`` and a distinct run id (two updates of one
    row cannot share a statement: only one of them would apply). The updated rows come back in
    no particular order; callers match them by ``id``, which is always returned.
    """
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
    compared = [column for column, is_null in guard_shape if not is_null]
    pg = dialect == "postgresql"
    names = ["g_id", "g_status", *(f"g_{c}" for c in compared), *(f"v_{c}" for c in value_columns)]
    columns = ["id", "status", *compared, *value_columns]
    seen: set[str] = set()
    for item in items:
        if update_shape(item) != shape:
            raise ValueError("updates of different shapes cannot share a statement")
        if item[0] in seen:
            raise ValueError(f"run {item[0]!r} appears twice in one batch")
        seen.add(item[0])

    # One tuple per item, in the order of ``names``.
    table = [
        (
            run_id,
            from_state,
            *[guard[column] for column in compared],
            *[values[column] for column in value_columns],
        )
        for run_id, from_state, values, guard in items
    ]
    params: dict[str, Any]
    if pg:
        # One typed array per column: the statement's text depends only on the shape, never on
        # the number of rows, so the driver parses it once and the server can keep it prepared.
        # The arrays go in binary, built by pgarrays (text arrays are quoted with a regular
        # expression per element; psycopg's own binary lists inspect each list first); a
        # binary array holds one type, so each column's values are coerced to its type.
        params = {
            name: pg_array(PG_RUN_COLUMN_TYPES[column], [row[j] for row in table])
            for j, (name, column) in enumerate(zip(names, columns, strict=True))
        }
        arrays = ", ".join(
            f":{name}::{PG_RUN_COLUMN_TYPES[column]}[]"
            for name, column in zip(names, columns, strict=True)
        )
        source = f"SELECT * FROM unnest({arrays}) AS u({', '.join(names)})"
    else:
        source, keys = _sqlite_values(tuple(names), len(table))
        params = dict(zip(keys, (cell for row in table for cell in row), strict=True))
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
    sql = (
        f"WITH v({', '.join(names)}) AS ({source}) "
        f"UPDATE schedule_runs SET {sets} FROM v WHERE {' AND '.join(where)} "
        f"RETURNING {listed}"
    )
    return sql, params
