"""Recovery (ADR-0072 D5, R5, R6): expired leases, due retries, overdue deadlines, and rows
stranded at a lowered attempt ceiling.

No transition happens because the clock moved: each is a compare-and-swap a racing terminal
write wins or loses, never both. Transition keys are deterministic per row and attempt, so two
reapers racing converge on one fact (the second sees a replay).

Lowering the stored ceiling (``settings.set_max_attempts``) leaves idle rows whose attempts are
already at or above it; no claim selects them again (R6) and no edge leads from ``queued`` to
``failed`` (R2). The reapers end them along the declared edge ``queued -> skipped`` (or
``waiting_dependency -> skipped``) with reason ``attempt_ceiling``, the ceiling recorded: a row
promoted out of ``retry_wait`` at the ceiling right after its promotion, every other one in a
sweep that runs once per ceiling change (``settings.SWEPT_CEILING`` remembers the last one).
"""

from __future__ import annotations

import json
from typing import Final

from taskward.claims import DEFAULT_HEARTBEAT_TTL_SECONDS
from taskward.execution import RetryPolicy
from taskward.lifecycle import Status
from taskward.models import Actor, StateReason, TransitionRequest
from taskward.settings import get_max_attempts, get_swept_ceiling, set_swept_ceiling
from taskward.store.port import StateDB
from taskward.transitions import transition_task

REAPER: Final = Actor(type="system", id="reaper")
REAP_BATCH: Final = 500
DEFAULT_DEADLINE_GRACE_SECONDS: Final = 30.0


def _request(
    task_id: str, src: str, dst: str, code: str, summary: str, key: str, **metadata: object
) -> TransitionRequest:
    return TransitionRequest(
        entity_id=task_id,
        from_state=src,
        to_state=dst,
        reason=StateReason(code=code, summary=summary, metadata=dict(metadata)),
        actor=REAPER,
        idempotency_key=key,
    )


async def reap_expired_leases(
    db: StateDB,
    *,
    now: float | None = None,
    retry_policy: RetryPolicy | None = None,
    limit: int = REAP_BATCH,
) -> dict[str, int]:
    """Recover running rows whose lease expired (``lease_expires_at < now``), then promote due
    retries, then end rows stranded at a lowered ceiling. Attempts left: ``running ->
    retry_wait`` (owner and expiry cleared, ``retry_at`` set); attempts exhausted: ``running ->
    failed``. Returns counts per outcome."""
    policy = retry_policy or RetryPolicy()
    if now is None:
        now = await db.now()
    max_attempts = await get_max_attempts(db)
    counts = {"expired": 0, "retry_wait": 0, "failed": 0}
    for row in await db.fetchall("run_expired_leases", {"now": now, "limit": limit}):
        counts["expired"] += 1
        attempt = int(row["lease_attempts"])
        guard = {
            "leased_by": row["leased_by"],
            "lease_expires_at": row["lease_expires_at"],
            "lease_attempts": attempt,
        }
        if attempt < max_attempts:
            result = await transition_task(
                db,
                _request(
                    row["id"],
                    "running",
                    "retry_wait",
                    "lease_expired",
                    f"lease of {row['leased_by']} expired on attempt {attempt}",
                    f"reap:{row['id']}:{attempt}",
                ),
                guard=guard,
                patch={
                    "leased_by": None,
                    "lease_expires_at": None,
                    "retry_at": now + policy.delay(attempt),
                },
                now=now,
            )
            if result.applied and not result.replayed:
                counts["retry_wait"] += 1
        else:
            result = await transition_task(
                db,
                _request(
                    row["id"],
                    "running",
                    "failed",
                    "attempts_exhausted",
                    f"lease expired on attempt {attempt} of {max_attempts}",
                    f"reap:{row['id']}:{attempt}",
                    attempt_ceiling=max_attempts,
                ),
                guard=guard,
                patch={"ended_at": now},
                now=now,
            )
            if result.applied and not result.replayed:
                counts["failed"] += 1
    promoted, promotions = await _promote(db, now=now, limit=limit)
    counts.update(promoted)
    counts["skipped"] = 0
    if promotions:
        # Read the ceiling after the promotions committed: a ceiling lowered before this read
        # is applied here, one lowered after it finds these rows queued in its sweep.
        ceiling = await get_max_attempts(db)
        for task_id, attempts in promotions:
            if attempts >= ceiling:
                counts["skipped"] += await _skip_at_ceiling(
                    db, task_id, "queued", attempts, ceiling, now=now
                )
    swept = await end_stranded_at_ceiling(db, now=now, ceiling=max_attempts)
    counts["skipped"] += swept["skipped"]
    return counts


async def promote_due_retries(
    db: StateDB, *, now: float | None = None, limit: int = REAP_BATCH
) -> dict[str, int]:
    """``retry_wait -> queued`` once ``retry_at <= now``; a row with a pending cancellation
    request goes ``retry_wait -> cancelled`` instead, never back to work (ADR-0072 D5)."""
    counts, _ = await _promote(db, now=now, limit=limit)
    return counts


async def _promote(
    db: StateDB, *, now: float | None, limit: int
) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """``promote_due_retries``, also returning (task id, attempts) of every row it queued."""
    if now is None:
        now = await db.now()
    counts = {"queued": 0, "cancelled": 0}
    promotions: list[tuple[str, int]] = []
    for row in await db.fetchall("run_due_retries", {"now": now, "limit": limit}):
        attempt = int(row["lease_attempts"])
        if row["cancel_requested_at"] is not None:
            request = _request(
                row["id"],
                "retry_wait",
                "cancelled",
                "cancelled",
                "cancellation was requested while the task was running",
                f"retry-cancel:{row['id']}:{attempt}",
            )
            patch: dict[str, object] = {"ended_at": now, "retry_at": None}
            outcome = "cancelled"
        else:
            request = _request(
                row["id"],
                "retry_wait",
                "queued",
                "retry_ready",
                f"retry after attempt {attempt}",
                f"ready:{row['id']}:{attempt}",
            )
            patch = {"queued_at": now, "retry_at": None}
            outcome = "queued"
        result = await transition_task(
            db,
            request,
            guard={"lease_attempts": attempt, "retry_at": row["retry_at"]},
            patch=patch,
            now=now,
        )
        if result.applied and not result.replayed:
            counts[outcome] += 1
            if outcome == "queued":
                promotions.append((row["id"], attempt))
    return counts, promotions


async def _skip_at_ceiling(
    db: StateDB, task_id: str, status: str, attempts: int, ceiling: int, *, now: float
) -> int:
    """``queued|waiting_dependency -> skipped`` for a row at or above the ceiling (R2, R6);
    1 if this call wrote the fact. Guarded by attempts and no owner: a row that moved on (a
    cancel, another reaper) is left alone."""
    result = await transition_task(
        db,
        _request(
            task_id,
            status,
            "skipped",
            "attempt_ceiling",
            f"{attempts} attempt(s) at the attempt ceiling of {ceiling}: never claimed again",
            f"ceiling:{task_id}:{attempts}",
            attempt_ceiling=ceiling,
        ),
        guard={"lease_attempts": attempts, "leased_by": None},
        patch={"ended_at": now},
        now=now,
    )
    return 1 if result.applied and not result.replayed else 0


async def end_stranded_at_ceiling(
    db: StateDB, *, now: float | None = None, ceiling: int | None = None
) -> dict[str, int]:
    """End the idle rows a lowered ceiling stranded: ``queued`` and ``waiting_dependency`` rows
    whose attempts are at or above the stored ceiling go to ``skipped`` (``attempt_ceiling``).

    Runs once per ceiling change (a full scan of the runs, so not on every pass): it does
    nothing while ``settings.SWEPT_CEILING`` equals the stored ceiling, and records the ceiling
    once every stranded row is ended. ``retry_wait`` rows are ended when promoted (see
    ``reap_expired_leases``). ``ceiling``: the stored ceiling, when the caller just read it.
    Returns ``{"skipped": n}``.
    """
    if ceiling is None:
        ceiling = await get_max_attempts(db)
    if await get_swept_ceiling(db) == ceiling:
        return {"skipped": 0}
    if now is None:
        now = await db.now()
    idle = sorted({Status.QUEUED.value, Status.WAITING_DEPENDENCY.value})
    skipped = 0
    # The checker's query: rows above the ceiling and idle rows at it (R6).
    for row in await db.fetchall(
        "check_attempts", {"max_attempts": ceiling, "idle": json.dumps(idle)}
    ):
        if row["status"] in idle:
            skipped += await _skip_at_ceiling(
                db, row["task_id"], row["status"], int(row["lease_attempts"]), ceiling, now=now
            )
    await set_swept_ceiling(db, ceiling, now=now)
    return {"skipped": skipped}


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
    if now is None:
        now = await db.now()
    counts = {"timed_out": 0}
    rows = await db.fetchall(
        "run_deadline_overdue",
        {"now": now, "grace_s": grace_s, "heartbeat_ttl": heartbeat_ttl, "limit": limit},
    )
    for row in rows:
        attempt = int(row["lease_attempts"])
        result = await transition_task(
            db,
            _request(
                row["id"],
                "running",
                "timed_out",
                "deadline_exceeded",
                f"owner {row['leased_by']} still running {now - row['deadline_at']:.1f}s "
                "past its deadline",
                f"deadline:{row['id']}:{attempt}",
            ),
            guard={
                "leased_by": row["leased_by"],
                "lease_expires_at": row["lease_expires_at"],
                "lease_attempts": attempt,
                "deadline_at": row["deadline_at"],
            },
            patch={"ended_at": now},
            now=now,
        )
        if result.applied and not result.replayed:
            counts["timed_out"] += 1
    return counts
