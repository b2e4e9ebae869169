"""The worker's maintenance loop wakes when a lease expires or a retry falls due, not only every
``reap_interval_s`` (issue 27's kill storm: an orphan waited up to two reaper intervals on top
of its lease and backoff). Store time here (the runtime takes no ``now``), bounded by a wait on
the database with a timeout well below the interval."""

from __future__ import annotations

import asyncio
import uuid

import taskward
from taskward.adapters import AdapterConfig, build_registry
from taskward.claims import WorkerSpec, claim_runs
from taskward.execution import RetryPolicy
from taskward.runtime import WorkerConfig, WorkerRuntime
from taskward.store.port import StateDB
from tests.worker_procs import WORKER_TASKS, wait_until

REGISTRY = build_registry(AdapterConfig(imports=(WORKER_TASKS,)))
INTERVAL_S = 60.0  # the reaper's interval: the orphan must be back long before it
BACKOFF = RetryPolicy(base_s=0.3, factor=2.0, cap_s=1.0, jitter=0.0)


async def test_an_orphan_is_reaped_at_its_expiry_and_queued_at_its_retry(db: StateDB) -> None:
    app = taskward.TaskApplication(
        action_kind="noop", args={}, execution_target="host", idempotency_key=f"k-{uuid.uuid4()}"
    )
    task_id = await taskward.submit_task(db, app, registry=REGISTRY)
    # a worker that dies with it: a 0.5 s lease (R5: ttl 0.5, deadline 0.2 + slack 0.3)
    dead = WorkerSpec(
        worker_id="host:deaddead",
        kinds=["noop"],
        lease_ttl=0.5,
        default_timeout_s=0.2,
        lease_slack_s=0.3,
    )
    [lease] = await claim_runs(db, dead, limit=1)
    assert lease.task_id == task_id
    config = WorkerConfig(
        concurrency=1,
        idle_wait_s=0.05,
        reap_interval_s=INTERVAL_S,
        run_scheduler=False,
        deliver_outbox=False,
        retry_policy=BACKOFF,
    )
    runtime = WorkerRuntime(db, REGISTRY, config)
    serving = asyncio.create_task(runtime.run())
    try:
        await wait_until(
            lambda: _completed(db, task_id), timeout=INTERVAL_S / 4, what="the orphan's completion"
        )
    finally:
        runtime.drain("test")
        assert await asyncio.wait_for(serving, 30) == 0
    facts = await taskward.list_transitions(db, task_id)
    assert [(f["status"], f["reason_code"]) for f in facts] == [
        ("running", "claimed"),
        ("retry_wait", "lease_expired"),
        ("queued", "retry_ready"),
        ("running", "claimed"),
        ("completed", "completed"),
    ]
    reaped, ready = facts[1]["created_at"], facts[2]["created_at"]
    assert reaped >= lease.lease_expires_at  # R6: never before the lease expired
    assert ready - reaped >= BACKOFF.base_s  # R18: the backoff is kept, not skipped


async def _completed(db: StateDB, task_id: str) -> bool:
    return (await taskward.get_task(db, task_id))["status"] == "completed"
