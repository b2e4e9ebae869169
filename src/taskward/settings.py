"""Queue configuration stored in the database, shared by every worker (R6).

R18: the attempt ceiling stored here is the default an admission stores on its row (when
neither the application nor its kind names one); claims, reapers and LocalTaskSource read the
row's ``max_attempts``. Changing it later changes only what later admissions store, so it
never strands a queued row at a ceiling the row cannot leave.
"""

from __future__ import annotations

from typing import Final

from taskward.errors import TaskValidationError
from taskward.store.port import StateDB

DEFAULT_MAX_ATTEMPTS: Final = 3


async def get_max_attempts(db: StateDB) -> int:
    """The queue's attempt ceiling: what an admission stores on a row that names none (R6,
    R18)."""
    row = await db.fetchone("setting_get", {"name": "max_attempts"})
    return int(row["value"]) if row else DEFAULT_MAX_ATTEMPTS


async def set_max_attempts(db: StateDB, value: int, *, now: float | None = None) -> None:
    """Store the queue's attempt ceiling for later admissions (R18: rows keep their own)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TaskValidationError("max_attempts", value, "an integer >= 1")
    async with db.transaction(now=now) as tx:
        await tx.execute("setting_put", {"name": "max_attempts", "value": str(value)})
