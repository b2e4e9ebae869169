"""Build the one dynamic statement: the guarded compare-and-swap update of a run.

Column names come only from the allowlists in ``port``; every value is a bind parameter.
Both dialects use this builder so the CAS semantics cannot drift between them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, Final, Literal, overload

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
def _pg_statement(shape: Shape, returning: tuple[str, ...], audited: bool) -> str:
    """The PostgreSQL statement of a shape, built once: one typed array per column, so its text
    never depends on the number of rows (the driver parses it once, the server keeps it
    prepared). Parameters are named by position (c0, c1, ...; ``v(...)`` names the columns),
    short enough to keep even the audited statement under psycopg's 4,096-byte parse cache."""
    names, columns = _columns(shape)
    types = [PG_RUN_COLUMN_TYPES[column] for column in columns]
    if audited:
        names = (*names, *(f"a_{field}" for field in AUDIT_FIELDS))
        types += ["text"] * len(AUDIT_FIELDS)
    arrays = ", ".join(f":c{j}::{pg_type}[]" for j, pg_type in enumerate(types))
    head = f"WITH v({', '.join(names)}) AS (SELECT * FROM unnest({arrays}))"
    update = _update_clause(shape, returning, pg=True)
    if audited:
        return f"{head}, u AS ({update}){_PG_AUDIT_TAIL}"
    return f"{head} {update}"


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
        return _pg_statement(shape, tuple(returning), False), _pg_params(shape, table)
    sql = _sqlite_statement(shape, tuple(returning), len(table))
    return sql, [cell for row in table for cell in row]


# -- the audited form (PostgreSQL) --------------------------------------------------------------

AUDIT_FIELDS: Final = (
    "fact_id",
    "event_id",
    "outbox_id",
    "entity_type",
    "source",
    "actor",
    "metadata",
    "idempotency_key",
    "request_hash",
    "lease_id",
)
"""What ``build_run_update_many_audited`` needs of each transition beyond its compare-and-swap:
the new rows' ids (``outbox_id`` None: no notification), the fact's own fields, and the lease id
when the guard names it (None: the updated row's ``leased_by/lease_attempts``)."""

_AUDITED_VALUES: Final = (
    "status",
    "updated_at",
    "status_reason_code",
    "status_reason_summary",
    "status_evidence_refs",
)

# For every row the compare-and-swap (``u``) changed, joined once to its arrays (``w``): its
# fact, its event and, where the transition is terminal, its notification, each exactly the row
# ``transitions._writes`` builds for the one-row path (a test compares them column by column).
# The fact's previous and new status and its reason are the compare-and-swap's own columns (the
# projection it writes is the request's); the event's payload and the notification's body are
# built here as jsonb, the type they are stored as, so key order cannot differ. The
# notification's defaults are ``outbox_enqueue``'s (max_attempts 10, ttl 7 days; the
# comparison test checks). A taken transition key inserts no fact and ``fact_written`` says so;
# the caller then rolls the transaction back. queries.sql's run_finish_batch writes the same
# fact, event and notification for a group that shares one outcome, from one value where this
# takes a column (tests/integration/test_worker.py compares the rows both write).
_PG_AUDIT_TAIL_TEXT: Final = """, w AS (
  SELECT * FROM u JOIN v ON v.g_id = u.id
), fact AS (
  INSERT INTO status_transitions (
    id, entity_type, entity_id, previous_status, status, reason_code, reason_summary,
    evidence_refs, source, actor, created_at, metadata, idempotency_key, request_hash,
    event_id, lease_id
  )
  SELECT a_fact_id, a_entity_type, id, g_status, v_status, v_status_reason_code,
         v_status_reason_summary, v_status_evidence_refs, a_source, a_actor, :now::float8,
         a_metadata::jsonb, a_idempotency_key, a_request_hash, a_event_id,
         COALESCE(a_lease_id, leased_by || '/' || COALESCE(lease_attempts, 0)::text)
  FROM w
  ON CONFLICT (entity_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
  RETURNING entity_id
), event AS (
  INSERT INTO task_events (id, task_id, kind, transition_id, status, payload, created_at)
  SELECT a_event_id, id, 'transition', a_fact_id, v_status,
         jsonb_build_object('from', g_status, 'to', v_status,
                            'reason_code', v_status_reason_code, 'actor', a_actor),
         :now::float8
  FROM w
), notification AS (
  INSERT INTO dispatch_outbox (
    id, kind, dedup_key, schedule_run_id, transition_id, body, status, attempts, max_attempts,
    next_attempt_at, created_at, updated_at, expires_at
  )
  SELECT a_outbox_id, 'task_terminal', 'task-terminal:' || a_fact_id, id, a_fact_id,
         jsonb_build_object('status', v_status,
                            'reason', jsonb_build_object('code', v_status_reason_code,
                                                         'summary', v_status_reason_summary),
                            'evidence_refs', v_status_evidence_refs),
         'pending', 0, 10, n.now, n.now, n.now, n.now + 604800.0
  FROM w, (SELECT :now::float8 AS now) n
  WHERE a_outbox_id IS NOT NULL
  ON CONFLICT (dedup_key) DO NOTHING
)
SELECT u.*, EXISTS (SELECT 1 FROM fact WHERE fact.entity_id = u.id) AS fact_written FROM u"""
# Whitespace collapsed (no literal above holds any): psycopg caches the parse of a statement of
# at most 4,096 bytes only, and parsed the laid-out text again on every execution.
_PG_AUDIT_TAIL: Final = " ".join(_PG_AUDIT_TAIL_TEXT.split())


def build_run_update_many_audited(
    items: Sequence[RunUpdate],
    audits: Sequence[Mapping[str, Any]],
    returning: Sequence[str],
    *,
    now: float,
) -> tuple[str, dict[str, Any]]:
    """``build_run_update_many`` (PostgreSQL) whose statement also writes, for every row it
    changes, the row's fact, event and notification (``_PG_AUDIT_TAIL``); ``audits[i]`` holds
    ``AUDIT_FIELDS`` for ``items[i]``. ``returning`` must name ``leased_by`` and
    ``lease_attempts`` (or ``*``): a fact without a guard-given lease id takes the row's."""
    if len(audits) != len(items):
        raise ValueError("one audit per update")
    if "*" not in returning and not {"leased_by", "lease_attempts"} <= set(returning):
        raise ValueError("an audited update returns leased_by and lease_attempts")
    shape = _checked_shape(items, returning)
    missing = sorted(set(_AUDITED_VALUES) - set(shape[0]))
    if missing:
        raise ValueError(f"an audited update sets the projection; missing: {', '.join(missing)}")
    params = _pg_params(shape, _table(items, shape))
    first = len(params)
    for k, field in enumerate(AUDIT_FIELDS):
        params[f"c{first + k}"] = pg_array("text", [audit[field] for audit in audits])
    params["now"] = now
    return _pg_statement(shape, tuple(returning), True), params
