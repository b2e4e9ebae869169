"""Limits under contention (DESIGN.md R20): real worker processes never run more of a key at
once than its limit, on both backends (PostgreSQL: claimers in several processes each count the
key under its lock; SQLite: under the write lock). The concurrency is read back from the facts.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

import taskward
from taskward.adapters import AdapterConfig, build_registry
from taskward.claims import WorkerSpec, claim_rows
from taskward.limits import set_limit
from taskward.store.port import StateDB
from tests.worker_procs import wait_until, worker_argv, workers

MODULE = "tests.integration.worker_tasks"
REGISTRY = build_registry(AdapterConfig(imports=(MODULE,)))


async def max_running_at_once(db: StateDB, ids: list[str]) -> int:
    """The most tasks of ``ids`` running at any instant, swept over their facts' times (an end
    at the same time as a start counts first: the one-step finish ends one before claiming)."""
    moments: list[tuple[float, int]] = []
    for task_id in ids:
        facts = await taskward.list_transitions(db, task_id)
        start = None
        for fact in facts:
            if fact["status"] == "running":
                start = fact["created_at"]
            elif fact["previous_status"] == "running" and start is not None:
                moments += [(start, 1), (fact["created_at"], -1)]
                start = None
    running = peak = 0
    for _, change in sorted(moments, key=lambda m: (m[0], m[1])):
        running += change
        peak = max(peak, running)
    return peak


@pytest.mark.slow
async def test_four_worker_processes_never_run_more_than_the_limit(
    db: StateDB, db_url: str
) -> None:
    total = 240
    await set_limit(db, "tenant:hot", max_running=3)
    apps = [
        taskward.TaskApplication(
            action_kind="nap",
            args={"seconds": 0.05},
            execution_target="host",
            idempotency_key=f"k-{uuid.uuid4()}",
            limit_key="tenant:hot",
        )
        for _ in range(total)
    ]
    ids = await taskward.submit_tasks(db, apps, registry=REGISTRY)
    argv = worker_argv(db_url, "--concurrency", "4", "--burst")
    with workers([argv for _ in range(4)]) as procs:
        await wait_until(lambda: _all_completed(db, total), timeout=240, what="completions")
        for proc in procs:
            assert proc.wait(timeout=60) == 0
    peak = await max_running_at_once(db, ids)
    print(f"peak running of tenant:hot with limit 3: {peak}")
    assert peak == 3  # never above the limit, and the limit was reached (real contention)
    leased_by = {(await taskward.get_task(db, t))["leased_by"] for t in ids}
    print(f"tenant:hot tasks ran on {len(leased_by)} of 4 worker processes")
    if db.dialect == "postgres":
        # Claimers in several processes took the key's slots (on SQLite a worker whose task
        # ends refills its slot in the same write transaction, and one process may keep them).
        assert len(leased_by) >= 2, leased_by


async def _all_completed(db: StateDB, total: int) -> bool:
    return (await taskward.reads.count_by_status(db))["completed"] == total


async def test_concurrent_claim_passes_never_take_more_than_the_limit(db: StateDB) -> None:
    """Eight claim passes at once (PostgreSQL: eight transactions on the pool) over 40 rows of a
    key limited to 3: exactly 3 are claimed, whichever passes win."""
    await set_limit(db, "kind:noop", max_running=3)
    apps = [
        taskward.TaskApplication(
            action_kind="noop",
            args={},
            execution_target="host",
            idempotency_key=f"k-{uuid.uuid4()}",
        )
        for _ in range(40)
    ]
    await taskward.submit_tasks(db, apps, registry=REGISTRY)
    specs = [WorkerSpec(worker_id=f"host:c{n:07d}", kinds=("noop",)) for n in range(8)]
    for _ in range(3):  # rounds: nothing ends, so later rounds claim nothing
        claims = await asyncio.gather(*(claim_rows(db, spec, limit=5) for spec in specs))
        assert sum(len(c) for c in claims) <= 3
    counts = await taskward.reads.count_by_status(db)
    assert counts["running"] == 3, counts
