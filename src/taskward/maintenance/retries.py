"""Due retries (ADR-0072 D5): ``retry_wait -> queued`` once ``retry_at <= now``, or
``retry_wait -> cancelled`` for a row with a pending cancellation request (never back to work),
and the skip of a row promoted at the attempt ceiling (``ceiling``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from taskward.lifecycle import Status
from taskward.maintenance.ceiling import skip_at_ceiling
from taskward.maintenance.service import REAP_BATCH, write_edge
from taskward.store.port import StateDB
from taskward.transitions import recovery as edges


class Promoted(NamedTuple):
    """What one promotion wrote: counts, and (task id, attempts, the row's ceiling) of every row
    it queued."""

    counts: dict[str, int]
    queued: list[tuple[str, int, int]]


@dataclass(frozen=True)
class RetryPromoter:
    """Promotes at most ``limit`` due ``retry_wait`` rows a pass, oldest ``retry_at`` first."""

    limit: int = REAP_BATCH

    async def run_once(self, db: StateDB, *, now: float | None = None) -> dict[str, int]:
        """Promote the due retries, then skip those queued at or above their own ceiling (R18).

        Returns:
            ``{"queued": n, "cancelled": n, "skipped": n}``; a promoted row then skipped counts
            in both ``queued`` and ``skipped``.
        """
        if now is None:
            now = await db.now()
        promoted = await self.promote(db, now=now)
        skipped = 0
        for task_id, attempts, ceiling in promoted.queued:
            if attempts >= ceiling:
                skipped += await skip_at_ceiling(
                    db, task_id, Status.QUEUED.value, attempts, ceiling, now=now
                )
        return {**promoted.counts, "skipped": skipped}

    async def promote(self, db: StateDB, *, now: float | None = None) -> Promoted:
        """The promotion alone (``promote_due_retries``): no row is skipped."""
        if now is None:
            now = await db.now()
        counts = {"queued": 0, "cancelled": 0}
        queued: list[tuple[str, int, int]] = []
        for row in await db.fetchall("run_due_retries", {"now": now, "limit": self.limit}):
            if row["cancel_requested_at"] is not None:
                edge, outcome = edges.retry_cancelled(row, now=now), "cancelled"
            else:
                edge, outcome = edges.retry_ready(row, now=now), "queued"
            if await write_edge(db, edge, now=now):
                counts[outcome] += 1
                if outcome == "queued":
                    queued.append((row["id"], int(row["lease_attempts"]), int(row["max_attempts"])))
        return Promoted(counts, queued)
