"""The recovery edges (ADR-0072 D5, R5, R6), one named constructor each: the request, its
compare-and-swap guard and its patch, as ``transition_task(db, request, guard=, patch=)`` takes
them. Builds values only, no I/O; the maintenance services decide which edge a row takes.

Each key is deterministic per row and attempt (``reap:``, ``ready:``, ``retry-cancel:``,
``ceiling:``, ``deadline:``), so two reapers racing over one row write one fact (the second
sees a replay); stored facts and replays depend on these keys, summaries and metadata staying
as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from taskward.lifecycle import Status
from taskward.models import Actor, StateReason, TransitionRequest

REAPER: Final = Actor(type="system", id="reaper")

_RUNNING: Final = Status.RUNNING.value
_RETRY_WAIT: Final = Status.RETRY_WAIT.value


class Edge(NamedTuple):
    """One move a maintenance service asks of ``transition_task``."""

    request: TransitionRequest
    guard: dict[str, Any]
    patch: dict[str, Any]


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


def _lease_guard(row: Mapping[str, Any]) -> dict[str, Any]:
    """The lease a reaper saw: a row renewed, finished or reclaimed since is left alone."""
    return {
        "leased_by": row["leased_by"],
        "lease_expires_at": row["lease_expires_at"],
        "lease_attempts": int(row["lease_attempts"]),
    }


def lease_expired(row: Mapping[str, Any], *, retry_at: float) -> Edge:
    """``running -> retry_wait`` (``lease_expired``): owner and expiry cleared, the retry due at
    ``retry_at``. ``row``: ``id``, ``leased_by``, ``lease_expires_at``, ``lease_attempts``."""
    attempt = int(row["lease_attempts"])
    return Edge(
        _request(
            row["id"],
            _RUNNING,
            _RETRY_WAIT,
            "lease_expired",
            f"lease of {row['leased_by']} expired on attempt {attempt}",
            f"reap:{row['id']}:{attempt}",
        ),
        _lease_guard(row),
        {"leased_by": None, "lease_expires_at": None, "retry_at": retry_at},
    )


def attempts_exhausted(row: Mapping[str, Any], *, ceiling: int, now: float) -> Edge:
    """``running -> failed`` (``attempts_exhausted``) for an expired lease on an attempt at or
    above ``ceiling``, which the fact's metadata records. Same key as ``lease_expired``: one
    expiry is one fact, whichever edge it took."""
    attempt = int(row["lease_attempts"])
    return Edge(
        _request(
            row["id"],
            _RUNNING,
            Status.FAILED.value,
            "attempts_exhausted",
            f"lease expired on attempt {attempt} of {ceiling}",
            f"reap:{row['id']}:{attempt}",
            attempt_ceiling=ceiling,
        ),
        _lease_guard(row),
        {"ended_at": now},
    )


def _retry_guard(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"lease_attempts": int(row["lease_attempts"]), "retry_at": row["retry_at"]}


def retry_ready(row: Mapping[str, Any], *, now: float) -> Edge:
    """``retry_wait -> queued`` (``retry_ready``), ``queued_at = now``. ``row``: ``id``,
    ``lease_attempts``, ``retry_at``."""
    attempt = int(row["lease_attempts"])
    return Edge(
        _request(
            row["id"],
            _RETRY_WAIT,
            Status.QUEUED.value,
            "retry_ready",
            f"retry after attempt {attempt}",
            f"ready:{row['id']}:{attempt}",
        ),
        _retry_guard(row),
        {"queued_at": now, "retry_at": None},
    )


def retry_cancelled(row: Mapping[str, Any], *, now: float) -> Edge:
    """``retry_wait -> cancelled`` (``cancelled``) for a row with a pending cancellation
    request: it never goes back to work (ADR-0072 D5). ``row`` as for ``retry_ready``."""
    attempt = int(row["lease_attempts"])
    return Edge(
        _request(
            row["id"],
            _RETRY_WAIT,
            Status.CANCELLED.value,
            "cancelled",
            "cancellation was requested while the task was running",
            f"retry-cancel:{row['id']}:{attempt}",
        ),
        _retry_guard(row),
        {"ended_at": now, "retry_at": None},
    )


def ceiling_skipped(task_id: str, status: str, attempts: int, ceiling: int, *, now: float) -> Edge:
    """``queued|waiting_dependency -> skipped`` (``attempt_ceiling``, the ceiling in the
    metadata) for an idle row at or above the ceiling (R2, R6). Guarded by attempts and no
    owner: a row that moved on (a cancel, another reaper) is left alone."""
    return Edge(
        _request(
            task_id,
            status,
            Status.SKIPPED.value,
            "attempt_ceiling",
            f"{attempts} attempt(s) at the attempt ceiling of {ceiling}: never claimed again",
            f"ceiling:{task_id}:{attempts}",
            attempt_ceiling=ceiling,
        ),
        {"lease_attempts": attempts, "leased_by": None},
        {"ended_at": now},
    )


def deadline_exceeded(row: Mapping[str, Any], *, now: float) -> Edge:
    """``running -> timed_out`` (``deadline_exceeded``), guarded by the lease and the deadline
    the reaper saw (R5). ``row``: the lease columns and ``deadline_at``."""
    attempt = int(row["lease_attempts"])
    return Edge(
        _request(
            row["id"],
            _RUNNING,
            Status.TIMED_OUT.value,
            "deadline_exceeded",
            f"owner {row['leased_by']} still running {now - row['deadline_at']:.1f}s "
            "past its deadline",
            f"deadline:{row['id']}:{attempt}",
        ),
        {**_lease_guard(row), "deadline_at": row["deadline_at"]},
        {"ended_at": now},
    )
