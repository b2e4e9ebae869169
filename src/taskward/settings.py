"""Queue configuration stored in the database, shared by every worker (R6)."""

from __future__ import annotations

from typing import Final

from taskward.errors import TaskValidationError
from taskward.store.port import StateDB

DEFAULT_MAX_ATTEMPTS: Final = 3


async def get_max_attempts(db: StateDB) -> int:
    """The attempt ceiling read by claims, reapers and LocalTaskSource alike (R6)."""
    row = await db.fetchone("setting_get", {"name": "max_attempts"})
    return int(row["value"]) if row else DEFAULT_MAX_ATTEMPTS


async def set_max_attempts(db: StateDB, value: int, *, now: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TaskValidationError("max_attempts", value, "an integer >= 1")
    async with db.transaction(now=now) as tx:
        await tx.execute("setting_put", {"name": "max_attempts", "value": str(value)})
