"""Overdue deadlines (R5): ``running -> timed_out`` for a task whose owner still heartbeats past
``deadline_at + grace_s``. A dead owner's task is left to lease expiry (``leases``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from taskward.claims import DEFAULT_HEARTBEAT_TTL_SECONDS
from taskward.maintenance.service import REAP_BATCH, write_edge
from taskward.store.port import StateDB
from taskward.transitions import recovery as edges

DEFAULT_DEADLINE_GRACE_SECONDS: Final = 30.0


@dataclass(frozen=True)
class DeadlineReaper:
    """Times out at most ``limit`` overdue runs a pass; an owner is live while its heartbeat is
    younger than ``heartbeat_ttl``."""

    grace_s: float = DEFAULT_DEADLINE_GRACE_SECONDS
    heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL_SECONDS
    limit: int = REAP_BATCH

    async def run_once(self, db: StateDB, *, now: float | None = None) -> dict[str, int]:
        """Each move is guarded by the lease and the deadline the reaper saw: a task that
        finished, or whose deadline moved, is left alone.

        Returns:
            ``{"timed_out": n}``.
        """
        if now is None:
            now = await db.now()
        counts = {"timed_out": 0}
        rows = await db.fetchall(
            "run_deadline_overdue",
            {
                "now": now,
                "grace_s": self.grace_s,
                "heartbeat_ttl": self.heartbeat_ttl,
                "limit": self.limit,
            },
        )
        for row in rows:
            if await write_edge(db, edges.deadline_exceeded(row, now=now), now=now):
                counts["timed_out"] += 1
        return counts
