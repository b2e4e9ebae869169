"""Queue configuration stored in the database, shared by every worker (R6)."""

from __future__ import annotations

from typing import Final

from taskward.errors import TaskValidationError
from taskward.store.port import StateDB

DEFAULT_MAX_ATTEMPTS: Final = 3
# The ceiling the reapers last ended stranded rows for (taskward.maintenance.reaper): they sweep
# again whenever the stored ceiling differs from it, i.e. once after every change.
SWEPT_CEILING: Final = "max_attempts_swept"


async def get_max_attempts(db: StateDB) -> int:
    """The attempt ceiling read by claims, reapers and LocalTaskSource alike (R6)."""
    row = await db.fetchone("setting_get", {"name": "max_attempts"})
    return int(row["value"]) if row else DEFAULT_MAX_ATTEMPTS


async def set_max_attempts(db: StateDB, value: int, *, now: float | None = None) -> None:
    """Store the attempt ceiling. Lowering it leaves idle rows at or above it, which no claim
    selects again: the reapers end them (``reaper.end_stranded_at_ceiling``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TaskValidationError("max_attempts", value, "an integer >= 1")
    async with db.transaction(now=now) as tx:
        await tx.execute("setting_put", {"name": "max_attempts", "value": str(value)})


async def get_swept_ceiling(db: StateDB) -> int | None:
    """The ceiling stranded rows were last ended for (None: never swept)."""
    row = await db.fetchone("setting_get", {"name": SWEPT_CEILING})
    return int(row["value"]) if row else None


async def set_swept_ceiling(db: StateDB, value: int, *, now: float | None = None) -> None:
    async with db.transaction(now=now) as tx:
        await tx.execute("setting_put", {"name": SWEPT_CEILING, "value": str(value)})
