"""Rows stranded at a lowered attempt ceiling (R2, R6).

Lowering the stored ceiling (``settings.set_max_attempts``) leaves idle rows whose attempts are
already at or above it; no claim selects them again (R6) and no edge leads from ``queued`` to
``failed`` (R2). They end along the declared edge ``queued -> skipped`` (or
``waiting_dependency -> skipped``) with reason ``attempt_ceiling``: a row promoted out of
``retry_wait`` at the ceiling right after its promotion (``retries``), every other one in the
sweep here, which runs once per ceiling change (``settings.SWEPT_CEILING`` remembers the last).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from taskward.lifecycle import Status
from taskward.maintenance.service import write_edge
from taskward.settings import get_max_attempts, get_swept_ceiling, set_swept_ceiling
from taskward.store.port import StateDB
from taskward.transitions import recovery as edges

_IDLE = sorted({Status.QUEUED.value, Status.WAITING_DEPENDENCY.value})


async def skip_at_ceiling(
    db: StateDB, task_id: str, status: str, attempts: int, ceiling: int, *, now: float
) -> int:
    """``queued|waiting_dependency -> skipped`` for a row at or above the ceiling; 1 if this
    call wrote the fact. A row that moved on (a cancel, another reaper) is left alone."""
    edge = edges.ceiling_skipped(task_id, status, attempts, ceiling, now=now)
    return 1 if await write_edge(db, edge, now=now) else 0


@dataclass(frozen=True)
class CeilingSweeper:
    """Ends the idle rows a lowered ceiling stranded, once per ceiling change."""

    async def run_once(
        self, db: StateDB, *, now: float | None = None, ceiling: int | None = None
    ) -> dict[str, int]:
        """``queued`` and ``waiting_dependency`` rows whose attempts are at or above the stored
        ceiling go to ``skipped`` (``attempt_ceiling``).

        A full scan of the runs, so not on every pass: nothing happens while
        ``settings.SWEPT_CEILING`` equals the stored ceiling, and the ceiling is recorded once
        every stranded row is ended. ``retry_wait`` rows are ended when promoted (``retries``).
        ``ceiling``: the stored ceiling, when the caller just read it.

        Returns:
            ``{"skipped": n}``.
        """
        if ceiling is None:
            ceiling = await get_max_attempts(db)
        if await get_swept_ceiling(db) == ceiling:
            return {"skipped": 0}
        if now is None:
            now = await db.now()
        skipped = 0
        # The checker's query: rows above the ceiling and idle rows at it (R6).
        for row in await db.fetchall(
            "check_attempts", {"max_attempts": ceiling, "idle": json.dumps(_IDLE)}
        ):
            if row["status"] in _IDLE:
                skipped += await skip_at_ceiling(
                    db, row["task_id"], row["status"], int(row["lease_attempts"]), ceiling, now=now
                )
        await set_swept_ceiling(db, ceiling, now=now)
        return {"skipped": skipped}
