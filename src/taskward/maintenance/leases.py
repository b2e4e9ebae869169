"""Expired leases (ADR-0072 D5, R6): ``running -> retry_wait`` while the row's attempts remain
(R18), else ``running -> failed``. Nothing moves because the clock moved: each move is a
compare-and-swap on the lease the reaper saw, which a racing renewal or terminal write wins."""

from __future__ import annotations

from dataclasses import dataclass, field

from taskward.execution import RetryPolicy
from taskward.maintenance.service import REAP_BATCH, write_edge
from taskward.store.port import StateDB
from taskward.transitions import recovery as edges


@dataclass(frozen=True)
class LeaseReaper:
    """Recovers ``running`` rows whose lease expired (``lease_expires_at < now``), at most
    ``limit`` a pass; a requeued row's retry is due ``retry_policy.delay(attempt)`` later."""

    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)
    limit: int = REAP_BATCH

    async def run_once(self, db: StateDB, *, now: float | None = None) -> dict[str, int]:
        """Attempts below the row's own ceiling (R18): ``running -> retry_wait`` (owner and
        expiry cleared, ``retry_at`` set); at or above it: ``running -> failed``
        (``attempts_exhausted``).

        Returns:
            ``{"expired": rows found, "retry_wait": n, "failed": n}``.
        """
        if now is None:
            now = await db.now()
        counts = {"expired": 0, "retry_wait": 0, "failed": 0}
        for row in await db.fetchall("run_expired_leases", {"now": now, "limit": self.limit}):
            counts["expired"] += 1
            attempt = int(row["lease_attempts"])
            ceiling = int(row["max_attempts"])
            if attempt < ceiling:
                edge = edges.lease_expired(row, retry_at=now + self.retry_policy.delay(attempt))
                outcome = "retry_wait"
            else:
                edge = edges.attempts_exhausted(row, ceiling=ceiling, now=now)
                outcome = "failed"
            if await write_edge(db, edge, now=now):
                counts[outcome] += 1
        return counts
