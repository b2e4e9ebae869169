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
    WorkerSpec,
    claim_rows,
    lease_expiry,
)
from taskward.store.port import StateDB

REGISTRY = build_registry(AdapterConfig(command_allowlist=frozenset({"true", "sleep"})))
TTL_S = 6.0
SLACK_S = 30.0
TIMEOUT_S = 600.0
T0 = 1_000_000.0


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
