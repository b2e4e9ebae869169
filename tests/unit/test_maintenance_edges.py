"""The recovery edges (taskward.transitions.recovery): each constructor's request, guard and
patch, exactly as stored facts and replays expect them."""

from __future__ import annotations

from taskward.lifecycle import EDGES, Status
from taskward.transitions import recovery as edges

LEASE = {"id": "t1", "leased_by": "host:aaaaaaaa", "lease_expires_at": 50.0, "lease_attempts": 2}
RETRY = {"id": "t1", "lease_attempts": 2, "retry_at": 60.0}


def _summary(edge: edges.Edge) -> tuple[str, str, str, str, str, dict[str, object]]:
    request = edge.request
    return (
        request.from_state,
        request.to_state,
        request.reason.code,
        request.reason.summary,
        request.idempotency_key,
        request.reason.metadata,
    )


def test_lease_expired_clears_the_owner_and_sets_the_retry() -> None:
    edge = edges.lease_expired(LEASE, retry_at=70.0)
    assert _summary(edge) == (
        "running",
        "retry_wait",
        "lease_expired",
        "lease of host:aaaaaaaa expired on attempt 2",
        "reap:t1:2",
        {},
    )
    assert edge.guard == {
        "leased_by": "host:aaaaaaaa",
        "lease_expires_at": 50.0,
        "lease_attempts": 2,
    }
    assert edge.patch == {"leased_by": None, "lease_expires_at": None, "retry_at": 70.0}


def test_attempts_exhausted_shares_the_expirys_key_and_records_the_ceiling() -> None:
    edge = edges.attempts_exhausted(LEASE, ceiling=2, now=80.0)
    assert _summary(edge) == (
        "running",
        "failed",
        "attempts_exhausted",
        "lease expired on attempt 2 of 2",
        "reap:t1:2",
        {"attempt_ceiling": 2},
    )
    assert edge.guard == edges.lease_expired(LEASE, retry_at=0.0).guard
    assert edge.patch == {"ended_at": 80.0}


def test_retry_ready_and_retry_cancelled_are_guarded_by_attempt_and_retry_at() -> None:
    ready = edges.retry_ready(RETRY, now=90.0)
    assert _summary(ready) == (
        "retry_wait",
        "queued",
        "retry_ready",
        "retry after attempt 2",
        "ready:t1:2",
        {},
    )
    assert ready.patch == {"queued_at": 90.0, "retry_at": None}
    cancelled = edges.retry_cancelled(RETRY, now=90.0)
    assert _summary(cancelled) == (
        "retry_wait",
        "cancelled",
        "cancelled",
        "cancellation was requested while the task was running",
        "retry-cancel:t1:2",
        {},
    )
    assert cancelled.patch == {"ended_at": 90.0, "retry_at": None}
    assert ready.guard == cancelled.guard == {"lease_attempts": 2, "retry_at": 60.0}


def test_ceiling_skipped_leaves_an_owned_row_alone() -> None:
    edge = edges.ceiling_skipped("t1", "waiting_dependency", 3, 2, now=95.0)
    assert _summary(edge) == (
        "waiting_dependency",
        "skipped",
        "attempt_ceiling",
        "3 attempt(s) at the attempt ceiling of 2: never claimed again",
        "ceiling:t1:3",
        {"attempt_ceiling": 2},
    )
    assert edge.guard == {"lease_attempts": 3, "leased_by": None}
    assert edge.patch == {"ended_at": 95.0}


def test_deadline_exceeded_is_guarded_by_lease_and_deadline() -> None:
    edge = edges.deadline_exceeded({**LEASE, "deadline_at": 40.0}, now=72.5)
    assert _summary(edge) == (
        "running",
        "timed_out",
        "deadline_exceeded",
        "owner host:aaaaaaaa still running 32.5s past its deadline",
        "deadline:t1:2",
        {},
    )
    assert edge.guard == {**edges.lease_expired(LEASE, retry_at=0).guard, "deadline_at": 40.0}
    assert edge.patch == {"ended_at": 72.5}


def test_every_edge_is_declared_and_made_by_the_reaper() -> None:
    built = [
        edges.lease_expired(LEASE, retry_at=1.0),
        edges.attempts_exhausted(LEASE, ceiling=1, now=1.0),
        edges.retry_ready(RETRY, now=1.0),
        edges.retry_cancelled(RETRY, now=1.0),
        edges.ceiling_skipped("t1", "queued", 1, 1, now=1.0),
        edges.deadline_exceeded({**LEASE, "deadline_at": 0.0}, now=1.0),
    ]
    for edge in built:
        src, dst = Status(edge.request.from_state), Status(edge.request.to_state)
        assert dst in EDGES[src], (src, dst)
        assert edge.request.actor == edges.REAPER
        assert type(edge.request.from_state) is type(edge.request.to_state) is str
