"""A worker's state (issue 28): live, stale (a heartbeat older than the TTL without a clean
stop: it probably crashed) or stopped (it said so), every lease it holds, and pruning dead
workers -- never one holding a live lease. On both backends, time injected."""

from __future__ import annotations

import time

import taskward
from taskward.claims import WorkerSpec, claim_runs
from taskward.heartbeat import mark_worker_stopped, prune_workers
from taskward.reads import list_workers
from taskward.store.port import StateDB
from tests.integration.helpers import REGISTRY, submit

TTL = 30.0
T0 = time.time() + 3600.0


async def states(db: StateDB, now: float) -> dict[str, dict[str, object]]:
    rows = await list_workers(db, heartbeat_ttl=TTL, now=now)
    return {w["worker_id"]: w for w in rows}


async def test_live_stale_and_stopped(db: StateDB) -> None:
    for worker_id in ("w-live", "w-crashed", "w-stopped", "w-burst"):
        await taskward.register_heartbeat(db, worker_id=worker_id, now=T0)
    await taskward.register_heartbeat(db, worker_id="w-live", now=T0 + 100)
    await mark_worker_stopped(db, worker_id="w-stopped", now=T0 + 5)
    await mark_worker_stopped(db, worker_id="w-burst", now=T0 + 99)
    found = await states(db, T0 + 100)
    assert {w: found[w]["state"] for w in found} == {
        "w-live": "live",
        "w-crashed": "stale",
        "w-stopped": "stopped",
        # stopped a second ago: not "live" for a heartbeat TTL after it exited
        "w-burst": "stopped",
    }
    assert [w for w in found if found[w]["is_live"]] == ["w-live"]
    assert found["w-stopped"]["stopped_at"] == T0 + 5
    # A heartbeat of the same id again means it runs again.
    await taskward.register_heartbeat(db, worker_id="w-stopped", now=T0 + 100)
    assert (await states(db, T0 + 100))["w-stopped"]["state"] == "live"


async def test_every_lease_a_worker_holds_is_listed(db: StateDB) -> None:
    tasks = [await submit(db, now=T0) for _ in range(4)]
    other = await submit(db, now=T0)
    await taskward.register_heartbeat(db, worker_id="w-four", now=T0 + 1)
    await taskward.register_heartbeat(db, worker_id="w-one", now=T0 + 1)
    await taskward.register_heartbeat(db, worker_id="w-none", now=T0 + 1)
    four = await claim_runs(db, WorkerSpec("w-four", REGISTRY.kinds()), limit=4, now=T0 + 2)
    one = await claim_runs(db, WorkerSpec("w-one", REGISTRY.kinds()), limit=4, now=T0 + 2)
    assert len(four) == 4 and len(one) == 1
    found = await states(db, T0 + 3)
    assert sorted(found["w-four"]["lease_task_ids"]) == sorted(x.task_id for x in four)  # type: ignore[arg-type]
    assert found["w-one"]["lease_task_ids"] == [one[0].task_id]
    assert found["w-none"]["lease_task_ids"] == []
    assert set([*tasks, other]) == {x.task_id for x in four + one}


async def test_prune_removes_stopped_and_long_stale_workers_only(db: StateDB) -> None:
    at = T0 + 200
    await taskward.register_heartbeat(db, worker_id="w-live", now=at)
    await taskward.register_heartbeat(db, worker_id="w-stopped", now=T0 - 50)
    await mark_worker_stopped(db, worker_id="w-stopped", now=T0 - 40)
    await taskward.register_heartbeat(db, worker_id="w-stale-long", now=T0 - 500)
    await taskward.register_heartbeat(db, worker_id="w-stale-short", now=at - 50)
    # A stale worker that still holds a live lease (its task runs; the lease covers it).
    await submit(db, now=T0)
    await taskward.register_heartbeat(db, worker_id="w-holding", now=T0)
    [lease] = await claim_runs(db, WorkerSpec("w-holding", REGISTRY.kinds()), limit=1, now=T0)
    assert lease.lease_expires_at > at
    dry = await prune_workers(db, older_than_s=100, heartbeat_ttl=TTL, dry_run=True, now=at)
    assert sorted(w.worker_id for w in dry) == ["w-stale-long", "w-stopped"]
    assert len(await states(db, at)) == 5  # a dry run deletes nothing
    gone = await prune_workers(db, older_than_s=100, heartbeat_ttl=TTL, now=at)
    assert sorted(w.worker_id for w in gone) == ["w-stale-long", "w-stopped"]
    assert sorted(await states(db, at)) == ["w-holding", "w-live", "w-stale-short"]
    # Once its lease has expired, the holder is dead too.
    later = lease.lease_expires_at + 1
    await taskward.register_heartbeat(db, worker_id="w-live", now=later)
    gone = await prune_workers(db, older_than_s=100, heartbeat_ttl=TTL, now=later)
    assert sorted(w.worker_id for w in gone) == ["w-holding", "w-stale-short"]


async def test_a_burst_worker_that_exits_shows_stopped(db: StateDB) -> None:
    from taskward.runtime import WorkerConfig, WorkerRuntime

    task_id = await submit(db)
    config = WorkerConfig(
        worker_id="w-burst-run",
        exit_when_idle=True,
        idle_wait_s=0.05,
        deliver_outbox=False,
        run_scheduler=False,
    )
    assert await WorkerRuntime(db, REGISTRY, config).run() == 0
    assert (await taskward.get_task(db, task_id))["status"] == "completed"
    [worker] = await list_workers(db, heartbeat_ttl=TTL)
    assert worker["worker_id"] == "w-burst-run"
    assert worker["state"] == "stopped" and worker["lease_task_ids"] == []
