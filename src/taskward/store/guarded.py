"""Build the one dynamic statement: the guarded compare-and-swap update of a run.

Column names come only from the allowlists in ``port``; every value is a bind parameter.
Both dialects use this builder so the CAS semantics cannot drift between them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from taskward.store.port import (
    JSON_COLUMNS,
    RUN_GUARD_COLUMNS,
    RUN_PATCH_COLUMNS,
    RUN_PROJECTION_COLUMNS,
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
