"""One maintenance pass: the services in their order, as one call for the runtime, and the
function surface they replace (``reap_expired_leases``, ``promote_due_retries``,
``end_stranded_at_ceiling``, ``reap_deadlines``), each a thin call into its service."""

from __future__ import annotations

from dataclasses import dataclass, field

from taskward.claims import DEFAULT_HEARTBEAT_TTL_SECONDS
from taskward.execution import RetryPolicy
from taskward.maintenance.ceiling import CeilingSweeper
from taskward.maintenance.deadlines import DEFAULT_DEADLINE_GRACE_SECONDS, DeadlineReaper
from taskward.maintenance.leases import LeaseReaper
from taskward.maintenance.retries import RetryPromoter
from taskward.maintenance.service import REAP_BATCH
from taskward.settings import get_max_attempts
from taskward.store.port import StateDB


@dataclass(frozen=True)
class Maintenance:
    """Every maintenance service of one process. ``recover_once`` runs leases, retries and the
    ceiling sweep in that order; ``run_once`` runs it, then the deadlines."""

    leases: LeaseReaper = field(default_factory=LeaseReaper)
    retries: RetryPromoter = field(default_factory=RetryPromoter)
    ceiling: CeilingSweeper = field(default_factory=CeilingSweeper)
    deadlines: DeadlineReaper = field(default_factory=DeadlineReaper)

    async def recover_once(self, db: StateDB, *, now: float | None = None) -> dict[str, int]:
        """Expired leases, then due retries, then rows stranded at a lowered ceiling, all at one
        ``now``. The ceiling is read once for the leases and the sweep; the retries read it
        again after their promotions committed, so a row promoted at a ceiling lowered before
        that read is skipped in this pass.

        Returns:
            the counts of the three: ``expired``, ``retry_wait``, ``failed``, ``queued``,
            ``cancelled`` and ``skipped`` (promoted rows skipped plus rows swept).
        """
        if now is None:
            now = await db.now()
        ceiling = await get_max_attempts(db)
        counts = await self.leases.run_once(db, now=now, ceiling=ceiling)
        counts.update(await self.retries.run_once(db, now=now))
        swept = await self.ceiling.run_once(db, now=now, ceiling=ceiling)
        counts["skipped"] += swept["skipped"]
        return counts

    async def run_once(self, db: StateDB, *, now: float | None = None) -> dict[str, int]:
        """``recover_once``, then the deadlines (each at the store's time when ``now`` is None).

        Returns:
            ``recover_once``'s counts and ``timed_out``.
        """
        counts = await self.recover_once(db, now=now)
        counts.update(await self.deadlines.run_once(db, now=now))
        return counts


async def reap_expired_leases(
    db: StateDB,
    *,
    now: float | None = None,
    retry_policy: RetryPolicy | None = None,
    limit: int = REAP_BATCH,
) -> dict[str, int]:
    """Recover running rows whose lease expired (``lease_expires_at < now``), then promote due
    retries, then end rows stranded at a lowered ceiling (``Maintenance.recover_once``).
    Attempts left: ``running -> retry_wait`` (owner and expiry cleared, ``retry_at`` set);
    attempts exhausted: ``running -> failed``. Returns counts per outcome."""
    services = Maintenance(
        leases=LeaseReaper(retry_policy=retry_policy or RetryPolicy(), limit=limit),
        retries=RetryPromoter(limit=limit),
    )
    return await services.recover_once(db, now=now)


async def promote_due_retries(
    db: StateDB, *, now: float | None = None, limit: int = REAP_BATCH
) -> dict[str, int]:
    """``retry_wait -> queued`` once ``retry_at <= now``; a row with a pending cancellation
    request goes ``retry_wait -> cancelled`` instead, never back to work (ADR-0072 D5). Reads
    no ceiling: the skip of a row promoted at the ceiling is ``RetryPromoter.run_once``'s."""
    return (await RetryPromoter(limit=limit).promote(db, now=now)).counts


async def end_stranded_at_ceiling(
    db: StateDB, *, now: float | None = None, ceiling: int | None = None
) -> dict[str, int]:
    """End the idle rows a lowered ceiling stranded: ``queued`` and ``waiting_dependency`` rows
    whose attempts are at or above the stored ceiling go to ``skipped`` (``attempt_ceiling``),
    once per ceiling change (``CeilingSweeper.run_once``). ``ceiling``: the stored ceiling,
    when the caller just read it. Returns ``{"skipped": n}``."""
    return await CeilingSweeper().run_once(db, now=now, ceiling=ceiling)


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
