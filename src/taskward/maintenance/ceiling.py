"""An idle row at its attempt ceiling (R2, R6, R18) ends along ``queued -> skipped`` (or
``waiting_dependency -> skipped``) with reason ``attempt_ceiling``: no claim selects it again and
no edge leads from ``queued`` to ``failed``. Since R18 a row carries its own ceiling, so lowering
the queue's setting strands nothing; the one way left to such a row is a promotion out of
``retry_wait`` of a row whose attempts already reached its ceiling (``retries`` skips it at once).
"""

from __future__ import annotations

from taskward.maintenance.service import write_edge
from taskward.store.port import StateDB
from taskward.transitions import recovery as edges


async def skip_at_ceiling(
    db: StateDB, task_id: str, status: str, attempts: int, ceiling: int, *, now: float
) -> int:
    """``queued|waiting_dependency -> skipped`` for a row at or above the ceiling; 1 if this
    call wrote the fact. A row that moved on (a cancel, another reaper) is left alone."""
    edge = edges.ceiling_skipped(task_id, status, attempts, ceiling, now=now)
    return 1 if await write_edge(db, edge, now=now) else 0
