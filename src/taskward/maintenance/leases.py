"""Expired leases (ADR-0072 D5, R6): ``running -> retry_wait`` while the row's attempts remain
(R18), else ``running -> failed``. Nothing moves because the clock moved: each move is a
compare-and-swap on the lease the reaper saw, which a racing renewal or terminal write wins.

The retry of an expired lease is due after the backoff of the row's kind (R18) when this
process's registry knows the kind and the kind sets one: a lease lost by a crash is a retry of
that kind like any other, and the lookup is a dict read on a column the expiry query already
returns. A kind this process does not serve (a reaper reaps every worker's rows) or one without
a backoff of its own gets the reaper's ``retry_policy``, the worker's default.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from taskward.execution import RetryPolicy
from taskward.maintenance.service import REAP_BATCH, write_edge
from taskward.registry import TaskAdapterRegistry
from taskward.store.port import StateDB
from taskward.transitions import recovery as edges


@dataclass(frozen=True)
class LeaseReaper:
    """Recovers ``running`` rows whose lease expired (``lease_expires_at < now``), at most
    ``limit`` a pass; a requeued row's retry is due ``delay(attempt)`` later, of its kind's
    backoff in ``registry`` when it has one (R18), else of ``retry_policy``."""

    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)
    limit: int = REAP_BATCH
    registry: TaskAdapterRegistry | None = None

    def policy_for(self, action_kind: str) -> RetryPolicy:
        """The backoff of an expired lease of ``action_kind``: the kind's own, else the default."""
        backoff = self.registry.backoff_for(action_kind) if self.registry is not None else None
        return backoff if backoff is not None else self.retry_policy

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
                delay = self.policy_for(row["action_kind"]).delay(attempt)
                edge = edges.lease_expired(row, retry_at=now + delay)
                outcome = "retry_wait"
            else:
                edge = edges.attempts_exhausted(row, ceiling=ceiling, now=now)
                outcome = "failed"
            if await write_edge(db, edge, now=now):
                counts[outcome] += 1
                if db.metrics is not None:  # committed: the one place expiries are counted
                    db.metrics.lease_expired(row["action_kind"], outcome)
        return counts
