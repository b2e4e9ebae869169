"""Recovery (ADR-0072 D5, R5, R6): expired leases, due retries, overdue deadlines.

No transition happens because the clock moved: each is a compare-and-swap a racing terminal
write wins or loses, never both. Transition keys are deterministic per row and attempt, so two
reapers racing converge on one fact (the second sees a replay).
"""

from __future__ import annotations

from typing import Final

from taskward.claims import DEFAULT_HEARTBEAT_TTL_SECONDS
from taskward.execution import RetryPolicy
from taskward.models import Actor, StateReason, TransitionRequest
from taskward.settings import get_max_attempts
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
    retries. Attempts left: ``running -> retry_wait`` (owner and expiry cleared, ``retry_at``
    set); attempts exhausted: ``running -> failed``. Returns counts per outcome."""
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
    counts.update(await promote_due_retries(db, now=now, limit=limit))
    return counts


async def promote_due_retries(
    db: StateDB, *, now: float | None = None, limit: int = REAP_BATCH
) -> dict[str, int]:
    """``retry_wait -> queued`` once ``retry_at <= now``; a row with a pending cancellation
    request goes ``retry_wait -> cancelled`` instead, never back to work (ADR-0072 D5)."""
    if now is None:
        now = await db.now()
    counts = {"queued": 0, "cancelled": 0}
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
    return counts


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
