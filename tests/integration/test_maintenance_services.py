"""The maintenance services (issue 24 item 3) on both backends: each ``run_once`` moves the row
it must and leaves alone the one it must (a racing terminal write wins its compare-and-swap),
the composite runs them in order, and the counts say what this call wrote.

A race is staged with ``RaceAfter``: the real store, with a real write run between a service's
read of its due rows and its first transition (no mock, no sleep).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest

import taskward
from taskward import maintenance
from taskward.claims import Lease, WorkerSpec, claim_runs
from taskward.execution import RetryPolicy, settle_lease
from taskward.maintenance import (
    REAPER,
    DeadlineReaper,
    LeaseReaper,
    Maintenance,
    RetryPromoter,
    reaper,
)
from taskward.maintenance.ceiling import skip_at_ceiling
from taskward.registry import TaskExecutionResult
from taskward.settings import set_max_attempts
from taskward.store.port import Row, StateDB
from tests.integration.helpers import SYSTEM, submit

T0 = 1_000_000.0
NO_JITTER = RetryPolicy(base_s=10.0, factor=2.0, cap_s=100.0, jitter=0.0)
AT_ONCE = RetryPolicy(base_s=0.0, factor=2.0, cap_s=0.0, jitter=0.0)
WORKER = "host:aaaaaaaa"


def spec(worker_id: str = WORKER) -> WorkerSpec:
    return WorkerSpec(worker_id=worker_id, kinds=["command"])


async def claim(db: StateDB, *, now: float = T0, worker_id: str = WORKER) -> Lease:
    [lease] = await claim_runs(db, spec(worker_id), limit=1, now=now)
    return lease


async def row(db: StateDB, task_id: str) -> Row:
    return await taskward.get_task(db, task_id)


async def facts(db: StateDB, task_id: str) -> list[tuple[str, str, str]]:
    return [
        (f["status"], f["reason_code"], f["idempotency_key"])
        for f in await taskward.list_transitions(db, task_id)
    ]


async def reaper_facts(db: StateDB, task_id: str) -> list[Row]:
    return [f for f in await taskward.list_transitions(db, task_id) if "reaper" in f["actor"]]


async def complete(db: StateDB, lease: Lease, *, now: float) -> None:
    """The owner's terminal write."""
    result = await settle_lease(
        db,
        lease,
        TaskExecutionResult(status="completed", exit_code=0),
        actor=spec().actor,
        max_attempts=3,
        policy=NO_JITTER,
        now=now,
    )
    assert result.applied


async def cancel(db: StateDB, task_id: str, *, now: float) -> None:
    result = await taskward.request_task_cancel(
        db, task_id, actor=SYSTEM, idempotency_key=f"cancel-{task_id}", now=now
    )
    assert result.state == "cancelled"


async def in_retry_wait(
    db: StateDB, *, now: float = T0, max_attempts: int | None = None
) -> tuple[str, float]:
    """A new task failed retryably on its first attempt at ``now``, judged by a ceiling of 5
    whatever its own (``max_attempts``, R18: stored on the row at admission): ``retry_wait``,
    attempt 1. Returns its id and ``retry_at``."""
    task_id = await submit(db, now=now, max_attempts=max_attempts)
    lease = await claim(db, now=now)
    assert lease.task_id == task_id
    failed = TaskExecutionResult(status="failed", retryable=True, error_detail="again")
    result = await settle_lease(
        db, lease, failed, actor=spec().actor, max_attempts=5, policy=NO_JITTER, now=now
    )
    assert result.applied
    waiting = await row(db, task_id)
    assert waiting["status"] == "retry_wait"
    return task_id, waiting["retry_at"]


class RaceAfter:
    """The store, with ``race`` run once right after the first ``fetchall(query)``: between a
    service's read of its rows and its transitions, as a racing writer would land."""

    def __init__(self, db: StateDB, query: str, race: Callable[[], Awaitable[None]]) -> None:
        self._db, self._query, self._race = db, query, race
        self.raced = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    async def fetchall(self, name: str, params: Any = None) -> list[Row]:
        found = await self._db.fetchall(name, params)
        if name == self._query and not self.raced:
            self.raced = True
            await self._race()
        return found

    @property
    def store(self) -> StateDB:
        return cast(StateDB, self)


# -- leases -----------------------------------------------------------------------------------


async def test_lease_reaper_requeues_an_expired_lease_and_leaves_a_live_one(db: StateDB) -> None:
    expired = await submit(db, now=T0)
    lease = await claim(db, now=T0)
    live = await submit(db, now=T0)
    fresh = await claim(db, now=lease.lease_expires_at - 1, worker_id="host:bbbbbbbb")
    now = lease.lease_expires_at + 0.5
    assert fresh.lease_expires_at > now
    counts = await LeaseReaper(retry_policy=NO_JITTER).run_once(db, now=now)
    assert counts == {"expired": 1, "retry_wait": 1, "failed": 0}
    moved = await row(db, expired)
    assert moved["status"] == "retry_wait" and moved["leased_by"] is None
    assert moved["lease_expires_at"] is None and moved["retry_at"] == pytest.approx(now + 10.0)
    [fact] = await reaper_facts(db, expired)
    assert (fact["reason_code"], fact["idempotency_key"]) == ("lease_expired", f"reap:{expired}:1")
    assert fact["reason_summary"] == f"lease of {WORKER} expired on attempt 1"
    assert fact["actor"] == REAPER.label()
    assert (await row(db, live))["status"] == "running"
    # a second pass, or a second reaper, finds nothing more to write
    assert (await LeaseReaper().run_once(db, now=now))["retry_wait"] == 0


async def test_lease_reaper_fails_an_expired_lease_at_the_ceiling(db: StateDB) -> None:
    await set_max_attempts(db, 1)
    task_id = await submit(db, now=T0)
    lease = await claim(db, now=T0)
    counts = await LeaseReaper().run_once(db, now=lease.lease_expires_at + 1)
    assert counts == {"expired": 1, "retry_wait": 0, "failed": 1}
    assert (await row(db, task_id))["ended_at"] == lease.lease_expires_at + 1
    [fact] = await reaper_facts(db, task_id)
    assert fact["reason_code"] == "attempts_exhausted"
    assert fact["idempotency_key"] == f"reap:{task_id}:1"
    assert fact["metadata"] == {"attempt_ceiling": 1}


async def test_an_owner_finishing_after_the_lease_reaper_read_wins(db: StateDB) -> None:
    task_id = await submit(db, now=T0)
    lease = await claim(db, now=T0)
    now = lease.lease_expires_at + 1
    racing = RaceAfter(db, "run_expired_leases", lambda: complete(db, lease, now=now))
    counts = await LeaseReaper(retry_policy=NO_JITTER).run_once(racing.store, now=now)
    assert racing.raced
    assert counts == {"expired": 1, "retry_wait": 0, "failed": 0}
    assert (await row(db, task_id))["status"] == "completed"
    assert await reaper_facts(db, task_id) == []


# -- retries ----------------------------------------------------------------------------------


async def test_retry_promoter_queues_a_due_retry_and_leaves_one_not_due(db: StateDB) -> None:
    due, now = await in_retry_wait(db)
    later, later_at = await in_retry_wait(db, now=T0 + 5)
    assert later_at > now
    counts = await RetryPromoter().run_once(db, now=now)
    assert counts == {"queued": 1, "cancelled": 0, "skipped": 0}
    promoted = await row(db, due)
    assert promoted["status"] == "queued" and promoted["queued_at"] == now
    assert promoted["retry_at"] is None
    assert (await facts(db, due))[-1] == ("queued", "retry_ready", f"ready:{due}:1")
    assert (await row(db, later))["status"] == "retry_wait"


async def test_retry_promoter_cancels_a_retry_holding_a_cancellation_request(db: StateDB) -> None:
    task_id = await submit(db, now=T0)
    lease = await claim(db, now=T0)
    requested = await taskward.request_task_cancel(
        db, task_id, actor=SYSTEM, idempotency_key="c", now=T0 + 1
    )
    assert requested.state == "cancellation_requested"
    await LeaseReaper(retry_policy=NO_JITTER).run_once(db, now=lease.lease_expires_at + 1)
    # not due yet: the request alone sends it to cancelled, never back to work
    counts = await RetryPromoter().run_once(db, now=lease.lease_expires_at + 2)
    assert counts == {"queued": 0, "cancelled": 1, "skipped": 0}
    assert (await facts(db, task_id))[-1] == (
        "cancelled",
        "cancelled",
        f"retry-cancel:{task_id}:1",
    )


async def test_a_cancel_after_the_retry_promoter_read_wins(db: StateDB) -> None:
    task_id, now = await in_retry_wait(db)
    racing = RaceAfter(db, "run_due_retries", lambda: cancel(db, task_id, now=now))
    counts = await RetryPromoter().run_once(racing.store, now=now)
    assert racing.raced
    assert counts == {"queued": 0, "cancelled": 0, "skipped": 0}
    assert (await row(db, task_id))["status"] == "cancelled"
    assert [s for s, _, _ in await facts(db, task_id)] == ["running", "retry_wait", "cancelled"]
    assert await reaper_facts(db, task_id) == []


async def test_retry_promoter_skips_a_row_it_queued_at_its_own_ceiling(db: StateDB) -> None:
    task_id, now = await in_retry_wait(db, max_attempts=1)
    below, _ = await in_retry_wait(db)  # its own ceiling is the queue's 3, however lowered
    await set_max_attempts(db, 1)
    counts = await RetryPromoter().run_once(db, now=now)
    assert counts == {"queued": 2, "cancelled": 0, "skipped": 1}
    assert (await facts(db, task_id))[-2:] == [
        ("queued", "retry_ready", f"ready:{task_id}:1"),
        ("skipped", "attempt_ceiling", f"ceiling:{task_id}:1"),
    ]
    assert (await row(db, task_id))["ended_at"] == now
    assert (await row(db, below))["status"] == "queued"


async def test_promotion_alone_skips_nothing(db: StateDB) -> None:
    task_id, due = await in_retry_wait(db, max_attempts=1)
    promoted = await RetryPromoter().promote(db, now=due)
    assert promoted.counts == {"queued": 1, "cancelled": 0}
    assert promoted.queued == [(task_id, 1, 1)]  # id, attempts, the row's own ceiling
    assert (await row(db, task_id))["status"] == "queued"


# -- ceiling ----------------------------------------------------------------------------------


async def test_a_lowered_queue_ceiling_ends_no_row(db: StateDB) -> None:
    """R18: each row keeps the ceiling of its admission, so lowering the queue's strands
    nothing and no maintenance pass ends a row for it; only later admissions take it."""
    requeued, due = await in_retry_wait(db)
    waiting, _ = await in_retry_wait(db, now=T0 + 1000)
    assert (await RetryPromoter().promote(db, now=due)).queued == [(requeued, 1, 3)]
    fresh = await submit(db, now=T0 + 2000)
    await set_max_attempts(db, 1)
    counts = await Maintenance().recover_once(db, now=T0 + 5000)
    assert (counts["queued"], counts["skipped"]) == (1, 0)  # the waiting retry, promoted
    for task_id in (requeued, waiting, fresh):
        kept = await row(db, task_id)
        assert (kept["status"], kept["max_attempts"]) == ("queued", 3)
    later = await submit(db, now=T0 + 6000)
    assert (await row(db, later))["max_attempts"] == 1


async def test_a_cancel_before_the_ceiling_skip_wins(db: StateDB) -> None:
    """The skip of a row promoted at its ceiling is a compare-and-swap: a cancel landing
    between the promotion and the skip wins, and the skip writes nothing."""
    task_id, due = await in_retry_wait(db, max_attempts=1)
    assert (await RetryPromoter().promote(db, now=due)).queued == [(task_id, 1, 1)]
    await cancel(db, task_id, now=due + 1)
    assert await skip_at_ceiling(db, task_id, "queued", 1, 1, now=due + 2) == 0
    assert (await row(db, task_id))["status"] == "cancelled"
    assert [s for s, _, _ in await facts(db, task_id)] == [
        "running",
        "retry_wait",
        "queued",
        "cancelled",
    ]


# -- deadlines --------------------------------------------------------------------------------


async def _running_past_deadline(db: StateDB, worker_id: str) -> tuple[str, Lease]:
    task_id = await submit(db, now=T0, args={"argv": ["true"], "timeout_s": 60})
    await taskward.register_heartbeat(db, worker_id=worker_id, now=T0)
    lease = await claim(db, now=T0 + 1, worker_id=worker_id)
    return task_id, lease


async def test_deadline_reaper_times_out_a_live_owner_past_its_grace(db: StateDB) -> None:
    task_id, lease = await _running_past_deadline(db, WORKER)
    dead, _ = await _running_past_deadline(db, "host:dead0000")
    now = lease.deadline_at + 5
    await taskward.register_heartbeat(db, worker_id=WORKER, now=now - 1)
    reaper_5s = DeadlineReaper(grace_s=5, heartbeat_ttl=30)
    assert await reaper_5s.run_once(db, now=now - 0.01) == {"timed_out": 0}
    assert await reaper_5s.run_once(db, now=now) == {"timed_out": 1}
    timed_out = await row(db, task_id)
    assert timed_out["status"] == "timed_out" and timed_out["ended_at"] == now
    [fact] = await reaper_facts(db, task_id)
    assert (fact["reason_code"], fact["idempotency_key"]) == (
        "deadline_exceeded",
        f"deadline:{task_id}:1",
    )
    assert fact["reason_summary"] == f"owner {WORKER} still running 5.0s past its deadline"
    # its owner's heartbeat is older than heartbeat_ttl: left to lease expiry
    assert (await row(db, dead))["status"] == "running"


async def test_an_owner_finishing_after_the_deadline_reaper_read_wins(db: StateDB) -> None:
    task_id, lease = await _running_past_deadline(db, WORKER)
    now = lease.deadline_at + 30
    await taskward.register_heartbeat(db, worker_id=WORKER, now=now)
    racing = RaceAfter(db, "run_deadline_overdue", lambda: complete(db, lease, now=now))
    assert await DeadlineReaper().run_once(racing.store, now=now) == {"timed_out": 0}
    assert racing.raced
    assert (await row(db, task_id))["status"] == "completed"
    assert await reaper_facts(db, task_id) == []


# -- the composite ----------------------------------------------------------------------------


async def test_a_lease_reaped_without_backoff_is_promoted_in_the_same_pass(db: StateDB) -> None:
    task_id = await submit(db, now=T0)
    lease = await claim(db, now=T0)
    services = Maintenance(leases=LeaseReaper(retry_policy=AT_ONCE))
    counts = await services.recover_once(db, now=lease.lease_expires_at + 1)
    assert counts == {
        "expired": 1,
        "retry_wait": 1,
        "failed": 0,
        "queued": 1,
        "cancelled": 0,
        "skipped": 0,
    }
    assert [s for s, _, _ in await facts(db, task_id)] == ["running", "retry_wait", "queued"]


async def test_a_row_promoted_at_its_own_ceiling_is_skipped_in_the_same_pass(
    db: StateDB,
) -> None:
    at_ceiling, now = await in_retry_wait(db, max_attempts=1)
    below, _ = await in_retry_wait(db)
    await set_max_attempts(db, 1)  # R18: reaches neither stored row
    counts = await Maintenance().recover_once(db, now=now)
    assert counts == {
        "expired": 0,
        "retry_wait": 0,
        "failed": 0,
        "queued": 2,
        "cancelled": 0,
        "skipped": 1,
    }
    assert (await facts(db, at_ceiling))[-1] == (
        "skipped",
        "attempt_ceiling",
        f"ceiling:{at_ceiling}:1",
    )
    assert (await row(db, below))["status"] == "queued"


async def test_run_once_adds_the_deadlines_to_the_recovery(db: StateDB) -> None:
    overdue, lease = await _running_past_deadline(db, WORKER)
    now = lease.deadline_at + 30
    await taskward.register_heartbeat(db, worker_id=WORKER, now=now)
    counts = await Maintenance().run_once(db, now=now)
    assert counts == {
        "expired": 0,
        "retry_wait": 0,
        "failed": 0,
        "queued": 0,
        "cancelled": 0,
        "skipped": 0,
        "timed_out": 1,
        "dependencies_met": 0,
        "dependency_failed": 0,
    }
    assert (await row(db, overdue))["status"] == "timed_out"


async def test_the_reaper_functions_are_the_services(db: StateDB) -> None:
    task_id, due = await in_retry_wait(db, max_attempts=1)
    counts = await reaper.reap_expired_leases(db, now=due)
    assert (counts["queued"], counts["skipped"]) == (1, 1)
    assert (await row(db, task_id))["status"] == "skipped"
    for name in reaper.__all__:
        assert getattr(reaper, name) is getattr(maintenance, name)
    assert taskward.reap_expired_leases is maintenance.reap_expired_leases


# -- when the next pass has work (issue 27) ---------------------------------------------------


async def test_next_due_is_the_earliest_lease_expiry_or_retry(db: StateDB) -> None:
    services = Maintenance(leases=LeaseReaper(retry_policy=NO_JITTER))
    assert await services.next_due(db, now=T0) is None  # nothing running, nothing waiting
    _, retry_at = await in_retry_wait(db, now=T0)
    assert await services.next_due(db, now=T0) == pytest.approx(retry_at - T0)
    await submit(db, now=T0)
    lease = await claim(db, now=T0 + 1)
    assert retry_at < lease.lease_expires_at
    assert await services.next_due(db, now=T0 + 1) == pytest.approx(retry_at - T0 - 1)
    # past due: negative, until a pass moves the row
    assert await services.next_due(db, now=retry_at + 1) == pytest.approx(-1.0)
    await services.recover_once(db, now=retry_at + 1)  # the retry is queued
    due = lease.lease_expires_at - retry_at - 1
    assert await services.next_due(db, now=retry_at + 1) == pytest.approx(due)
    # the lease expires: reaped, its retry due after the backoff (NO_JITTER: 10 s)
    late = lease.lease_expires_at + 1
    await services.recover_once(db, now=late)
    assert await services.next_due(db, now=late) == pytest.approx(10.0)
