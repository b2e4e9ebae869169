"""Lease renewal (DESIGN.md R25, ADR-0037 protocol version two), on both backends: a renewing
worker's claim grants ``lease_ttl`` alone, a renewal moves the expiry by compare-and-swap on the
lease id and never past the deadline + slack, the owner's completion after renewals applies, and
a run whose renewal lost is cancelled and its result kept only as a ``stale_result`` event.

Time is injected (``now=``) wherever a lease must lapse or a renewal must land at a given time;
waits poll a condition, never a fixed sleep.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

import taskward
from taskward.adapters import AdapterConfig, build_registry
from taskward.claims import (
    MIN_RENEWABLE_LEASE_TTL_SECONDS,
    Claimed,
    WorkerSpec,
    claim_rows,
    lease_expiry,
)
from taskward.claims.renewal import renew_lease
from taskward.execution import RetryPolicy, settle_lease
from taskward.maintenance.reaper import promote_due_retries, reap_expired_leases
from taskward.maintenance.service import write_edge
from taskward.models import Actor
from taskward.store.port import StateDB
from taskward.transitions import recovery

REGISTRY = build_registry(AdapterConfig(command_allowlist=frozenset({"true", "sleep"})))
TTL_S = 6.0
SLACK_S = 30.0
TIMEOUT_S = 600.0
T0 = 1_000_000.0
IMMEDIATE = RetryPolicy(base_s=0.0, jitter=0.0)


async def submit(db: StateDB, args: dict[str, Any] | None = None, *, now: float = T0) -> str:
    app = taskward.TaskApplication(
        action_kind="command",
        args=args if args is not None else {"argv": ["true"], "timeout_s": TIMEOUT_S},
        execution_target="host",
        idempotency_key=f"renew-{uuid.uuid4()}",
    )
    return await taskward.submit_task(db, app, registry=REGISTRY, now=now)


def spec(
    worker_id: str = "host:aaaaaaaa",
    *,
    renews: bool = True,
    lease_ttl: float = TTL_S,
    capabilities: tuple[str, ...] = (),
) -> WorkerSpec:
    return WorkerSpec(
        worker_id=worker_id,
        kinds=REGISTRY.kinds(),
        capabilities=capabilities,
        lease_ttl=lease_ttl,
        lease_slack_s=SLACK_S,
        renews=renews,
    )


# -- the claim (R5, R25) ------------------------------------------------------------------------


def test_a_renewing_worker_refuses_a_lease_too_short_to_renew() -> None:
    with pytest.raises(ValueError, match="too short to renew"):
        spec(lease_ttl=MIN_RENEWABLE_LEASE_TTL_SECONDS - 0.5)
    assert spec(lease_ttl=MIN_RENEWABLE_LEASE_TTL_SECONDS).renews
    assert not spec(renews=False, lease_ttl=0.5).renews  # version one's rule: any ttl


def test_lease_expiry_covers_the_deadline_unless_the_worker_renews() -> None:
    deadline = T0 + TIMEOUT_S
    assert lease_expiry(spec(renews=False), deadline, now=T0) == deadline + SLACK_S
    assert lease_expiry(spec(), deadline, now=T0) == T0 + TTL_S
    # a renewing lease never reaches past the deadline + slack, not even at its claim
    assert lease_expiry(spec(lease_ttl=3600.0), deadline, now=T0) == deadline + SLACK_S


# Paged: a worker with an affinity token always pages (claims.passes.pass_call), so both the
# one-statement claim (PostgreSQL's run_claim_batch) and the paged pass are exercised.
@pytest.mark.parametrize("capabilities", [(), ("warmed-cache",)], ids=["first_page", "paged"])
async def test_a_renewing_workers_claim_grants_the_ttl_and_not_the_deadline(
    db: StateDB, capabilities: tuple[str, ...]
) -> None:
    for _ in range(3):
        await submit(db)
    now = T0 + 10
    workers = {
        "renewing": spec(capabilities=capabilities),
        "covering": spec("host:bbbbbbbb", renews=False, capabilities=capabilities),
        "long_ttl": spec("host:cccccccc", lease_ttl=3600.0, capabilities=capabilities),
    }
    expected = {
        "renewing": now + TTL_S,  # R25: the ttl alone
        "covering": now + TIMEOUT_S + SLACK_S,  # R5: the lease covers the deadline
        "long_ttl": now + TIMEOUT_S + SLACK_S,  # R25: never past the deadline + slack
    }
    for name, worker in workers.items():
        [claimed] = await claim_rows(db, worker, limit=1, now=now)
        row = await taskward.get_task(db, claimed.lease.task_id)
        assert row["leased_by"] == worker.worker_id
        assert row["deadline_at"] == pytest.approx(now + TIMEOUT_S)
        assert row["lease_expires_at"] == pytest.approx(expected[name]), name
        assert claimed.lease.lease_expires_at == pytest.approx(row["lease_expires_at"])


async def test_a_renewing_claim_keeps_a_short_lease_at_the_stores_own_time(db: StateDB) -> None:
    """No ``now`` injected: the claim's time is the store's (R9), the lease ``lease_ttl``."""
    task_id = await submit(db, now=time.time())
    before = time.time()
    [claimed] = await claim_rows(db, spec(), limit=1)
    row = await taskward.get_task(db, task_id)
    assert row["lease_expires_at"] - row["deadline_at"] == pytest.approx(TTL_S - TIMEOUT_S)
    assert before - 5 < row["lease_expires_at"] - TTL_S < time.time() + 5
    assert claimed.lease.lease_expires_at == pytest.approx(row["lease_expires_at"])


# -- the renewal's write (run_renew_lease) -------------------------------------------------------


async def claim_one(db: StateDB, worker: WorkerSpec, *, now: float) -> Claimed:
    [claimed] = await claim_rows(db, worker, limit=1, now=now)
    return claimed


async def renew(
    db: StateDB, claimed: Claimed, *, now: float, worker: WorkerSpec | None = None
) -> float | None:
    worker = worker or spec()
    lease = claimed.lease
    return await renew_lease(
        db,
        lease.task_id,
        lease.leased_by,
        lease.attempt,
        lease_ttl=worker.lease_ttl,
        lease_slack_s=worker.lease_slack_s,
        now=now,
    )


async def audit(db: StateDB, task_id: str) -> tuple[int, int]:
    """How many facts and events the task has."""
    facts = await taskward.list_transitions(db, task_id)
    events = await db.fetchall("event_list", {"task_id": task_id})
    return len(facts), len(events)


async def test_a_renewal_extends_the_expiry_by_compare_and_swap_and_changes_no_status(
    db: StateDB,
) -> None:
    task_id = await submit(db)
    claimed = await claim_one(db, spec(), now=T0)
    before = await taskward.get_task(db, task_id)
    audited = await audit(db, task_id)
    assert await renew(db, claimed, now=T0 + 2) == pytest.approx(T0 + 2 + TTL_S)
    assert await renew(db, claimed, now=T0 + 4) == pytest.approx(T0 + 4 + TTL_S)
    after = await taskward.get_task(db, task_id)
    assert after["lease_expires_at"] == pytest.approx(T0 + 4 + TTL_S)
    # nothing else moved: not a transition (no fact, no event), the same owner and attempt
    assert {k: v for k, v in after.items() if k != "lease_expires_at"} == {
        k: v for k, v in before.items() if k != "lease_expires_at"
    }
    assert await audit(db, task_id) == audited


async def test_a_renewal_after_nominal_expiry_applies_until_the_row_changes(db: StateDB) -> None:
    """R4: ownership is the row's, not the clock's; and a reaper that saw the old expiry loses
    to the renewal that landed first (it guards the expiry it saw)."""
    task_id = await submit(db)
    claimed = await claim_one(db, spec(), now=T0)
    late = T0 + TTL_S + 5
    [seen] = await db.fetchall("run_expired_leases", {"now": late, "limit": 10})
    assert seen["id"] == task_id
    assert await renew(db, claimed, now=late) == pytest.approx(late + TTL_S)
    edge = recovery.lease_expired(seen, retry_at=late)
    assert not await write_edge(db, edge, now=late)
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["leased_by"]) == ("running", claimed.lease.leased_by)


async def test_a_renewal_under_a_reaped_and_reclaimed_lease_is_refused_and_changes_nothing(
    db: StateDB,
) -> None:
    task_id = await submit(db)
    old = await claim_one(db, spec("host:aaaaaaaa"), now=T0)
    lapsed = T0 + TTL_S + 1
    await reap_expired_leases(db, now=lapsed, retry_policy=IMMEDIATE)
    assert await renew(db, old, now=lapsed) is None  # reaped: retry_wait, no owner
    await promote_due_retries(db, now=lapsed)
    new = await claim_one(db, spec("host:bbbbbbbb"), now=lapsed + 1)
    assert (new.lease.task_id, new.lease.attempt) == (task_id, old.lease.attempt + 1)
    before = await taskward.get_task(db, task_id)
    audited = await audit(db, task_id)
    assert await renew(db, old, now=lapsed + 2) is None
    assert await taskward.get_task(db, task_id) == before
    assert await audit(db, task_id) == audited
    # the current holder's renewal applies
    assert await renew(db, new, now=lapsed + 2) == pytest.approx(lapsed + 2 + TTL_S)


async def test_a_renewal_never_reaches_past_the_deadline_plus_slack(db: StateDB) -> None:
    task_id = await submit(db, {"argv": ["true"], "timeout_s": 10.0})
    claimed = await claim_one(db, spec(), now=T0)
    horizon = T0 + 10.0 + SLACK_S
    assert claimed.lease.lease_expires_at == pytest.approx(T0 + TTL_S)
    assert await renew(db, claimed, now=horizon - 2) == pytest.approx(horizon)
    # past the horizon the lease stays where it is: never moved beyond it, never shortened
    assert await renew(db, claimed, now=horizon + 5) == pytest.approx(horizon)
    row = await taskward.get_task(db, task_id)
    assert row["lease_expires_at"] == pytest.approx(horizon)


async def test_a_renewal_never_shortens_a_lease_that_covers_its_deadline(db: StateDB) -> None:
    """A version-one lease (it covers the deadline) renewed with a short ttl keeps its expiry."""
    await submit(db)
    claimed = await claim_one(db, spec(renews=False), now=T0)
    covering = T0 + TIMEOUT_S + SLACK_S
    assert claimed.lease.lease_expires_at == pytest.approx(covering)
    assert await renew(db, claimed, now=T0 + 1) == pytest.approx(covering)


async def test_a_renewal_of_an_unknown_or_finished_task_is_refused(db: StateDB) -> None:
    task_id = await submit(db)
    claimed = await claim_one(db, spec(), now=T0)
    assert (
        await renew_lease(
            db, f"no-such-{uuid.uuid4()}", "host:aaaaaaaa", 1, lease_ttl=TTL_S, lease_slack_s=0.0
        )
        is None
    )
    outcome = taskward.TaskExecutionResult(status="completed", exit_code=0)
    done = await settle_lease(
        db,
        claimed.lease,
        outcome,
        actor=Actor(type="system", id=claimed.lease.leased_by),
        max_attempts=3,
        policy=IMMEDIATE,
        now=T0 + 1,
    )
    assert done.applied
    assert await renew(db, claimed, now=T0 + 2) is None
    assert (await taskward.get_task(db, task_id))["status"] == "completed"
