"""One maintenance pass: the services in their order, as one call for the runtime, and the
function surface they replace (``reap_expired_leases``, ``promote_due_retries``,
``reap_deadlines``), each a thin call into its service."""

from __future__ import annotations

from dataclasses import dataclass, field

from taskward.claims import DEFAULT_HEARTBEAT_TTL_SECONDS
from taskward.execution import RetryPolicy
from taskward.maintenance.deadlines import DEFAULT_DEADLINE_GRACE_SECONDS, DeadlineReaper
from taskward.maintenance.dependencies import DependencyPromoter
from taskward.maintenance.leases import LeaseReaper
from taskward.maintenance.retries import RetryPromoter
from taskward.maintenance.service import REAP_BATCH
from taskward.registry import TaskAdapterRegistry
from taskward.store.port import StateDB


@dataclass(frozen=True)
class Maintenance:
    """Every maintenance service of one process. ``recover_once`` runs leases, then retries;
    ``run_once`` runs it, then the deadlines, then dependency readiness (R21)."""

    leases: LeaseReaper = field(default_factory=LeaseReaper)
    retries: RetryPromoter = field(default_factory=RetryPromoter)
    deadlines: DeadlineReaper = field(default_factory=DeadlineReaper)
    dependencies: DependencyPromoter = field(default_factory=DependencyPromoter)

    async def recover_once(self, db: StateDB, *, now: float | None = None) -> dict[str, int]:
        """Expired leases, then due retries, both at one ``now``; each row is judged by its own
        attempt ceiling (R18).

        Returns:
            the counts of both: ``expired``, ``retry_wait``, ``failed``, ``queued``,
            ``cancelled`` and ``skipped`` (promoted rows already at their ceiling).
        """
        if now is None:
            now = await db.now()
        counts = await self.leases.run_once(db, now=now)
        counts.update(await self.retries.run_once(db, now=now))
        return counts

    async def next_due(self, db: StateDB, *, now: float | None = None) -> float | None:
        """Seconds from ``now`` (the store's time when None) until ``recover_once`` next has
        work: the earliest lease expiry of a running row or retry of a ``retry_wait`` row,
        whichever comes first (<= 0: due already; None: neither exists). Lease expiry (R6) is
        strict, ``lease_expires_at < now``: a caller waking at exactly this time may be early by
        a hair and wakes a little later."""
        row = await db.fetchone("maintenance_next_due", {} if now is None else {"now": now})
        if row is None:
            return None
        due = [float(row[c]) for c in ("lease_due_in", "retry_due_in") if row[c] is not None]
        return min(due) if due else None

    async def run_once(self, db: StateDB, *, now: float | None = None) -> dict[str, int]:
        """``recover_once``, then the deadlines, then dependency readiness (each at the store's
        time when ``now`` is None).

        Returns:
            ``recover_once``'s counts, ``timed_out``, ``dependencies_met`` and
            ``dependency_failed``.
        """
        counts = await self.recover_once(db, now=now)
        counts.update(await self.deadlines.run_once(db, now=now))
        counts.update(await self.dependencies.run_once(db, now=now))
        return counts


async def reap_expired_leases(
    db: StateDB,
    *,
    now: float | None = None,
    retry_policy: RetryPolicy | None = None,
    limit: int = REAP_BATCH,
    registry: TaskAdapterRegistry | None = None,
) -> dict[str, int]:
    """Recover running rows whose lease expired (``lease_expires_at < now``), then promote due
    retries (``Maintenance.recover_once``).
    Attempts left: ``running -> retry_wait`` (owner and expiry cleared, ``retry_at`` set after
    the backoff of the row's kind in ``registry``, else ``retry_policy``, R18); attempts
    exhausted: ``running -> failed``. Returns counts per outcome."""
    services = Maintenance(
        leases=LeaseReaper(
            retry_policy=retry_policy or RetryPolicy(), limit=limit, registry=registry
        ),
        retries=RetryPromoter(limit=limit),
    )
    return await services.recover_once(db, now=now)


async def promote_due_retries(
    db: StateDB, *, now: float | None = None, limit: int = REAP_BATCH
) -> dict[str, int]:
    """``retry_wait -> queued`` once ``retry_at <= now``; a row with a pending cancellation
    request goes ``retry_wait -> cancelled`` instead, never back to work (ADR-0072 D5). Reads
    no row: the skip of a row promoted at its ceiling is ``RetryPromoter.run_once``'s."""
    return (await RetryPromoter(limit=limit).promote(db, now=now)).counts


async def reap_deadlines(
    db: StateDB,
    *,
    now: float | None = None,
    grace_s: float = DEFAULT_DEADLINE_GRACE_SECONDS,
    heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL_SECONDS,
    limit: int = REAP_BATCH,
) -> dict[str, int]:
    """``running -> timed_out`` for owners still heartbeating past ``deadline_at + grace_s``,
    guarded by lease and deadline (R5). A dead owner's task is left to lease expiry."""
    reaper = DeadlineReaper(grace_s=grace_s, heartbeat_ttl=heartbeat_ttl, limit=limit)
    return await reaper.run_once(db, now=now)
