"""R23 retention on both backends, time injected: ``archive_runs`` moves terminal tasks and
keeps their keys' promise (the same key returns the original id, another payload is still a
conflict), ``get_task``/``list_transitions`` still find an archived task, nothing moves in a
dry run, and the invariant checker finds the store sound afterwards; ``prune`` removes dead
workers, finished notifications and old events."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

import taskward
from taskward import Actor, TaskApplication, TaskExecutionResult
from taskward.archive import archive_runs
from taskward.checker import assert_invariants
from taskward.claims import WorkerSpec, claim_runs
from taskward.errors import TaskIdempotencyConflict, TaskNotFound
from taskward.execution import RetryPolicy, settle_lease
from taskward.heartbeat import mark_worker_stopped
from taskward.host import LocalSummaryStore, SessionSummary
from taskward.outbox import OutboxDeliverer
from taskward.reads import count_by_status, list_task_events
from taskward.resubmit import retry_task
from taskward.results import get_task_result
from taskward.retention import prune
from taskward.store.port import StateDB
from tests.integration.helpers import REGISTRY, move
from tests.integration.test_transactional_admission import sync_connection

DAY = 86400.0
T0 = time.time() + 3600.0  # later than the summaries' own (real) clock
EXPIRED = T0 + 7.5 * DAY  # past every notification's 7-day TTL
NOW = T0 + 9 * DAY
OPERATOR = Actor(type="operator", id="retention-test")


def app(key: str, argv: tuple[str, ...] = ("true",), **more: object) -> TaskApplication:
    return TaskApplication(
        action_kind="command",
        args={"argv": list(argv)},
        execution_target="host",
        idempotency_key=key,
        **more,  # type: ignore[arg-type]
    )


async def admit(db: StateDB, key: str, *, now: float = T0, **more: object) -> str:
    return await taskward.submit_task(db, app(key, **more), registry=REGISTRY, now=now)


async def finish(db: StateDB, task_id: str, *, at: float, status: str = "completed") -> None:
    """Claim ``task_id`` (the only due task) and end it as its owner: completed with a summary
    and a result, or failed."""
    await taskward.register_heartbeat(db, worker_id="w-ret", now=at)
    [lease] = await claim_runs(db, WorkerSpec("w-ret", REGISTRY.kinds()), limit=1, now=at)
    assert lease.task_id == task_id
    key = f"{task_id}:{lease.attempt}"
    if status != "completed":
        failed = await settle_lease(
            db,
            lease,
            TaskExecutionResult(status="failed", exit_code=1),
            actor=Actor(type="system", id="w-ret"),
            max_attempts=3,
            policy=RetryPolicy(),
            now=at + 1,
        )
        assert failed.applied
        return
    await LocalSummaryStore(db).write(
        key,
        SessionSummary(
            facts={"task_id": task_id, "attempt": lease.attempt},
            narrative=None,
            manifest_ref=f"taskward:schedule_runs/{task_id}?attempt={lease.attempt}",
        ),
    )
    done = await settle_lease(
        db,
        lease,
        TaskExecutionResult(status="completed", exit_code=0, result='{"answer":42}'),
        actor=Actor(type="system", id="w-ret"),
        max_attempts=3,
        policy=RetryPolicy(),
        now=at + 1,
    )
    assert done.applied


async def scene(db: StateDB) -> dict[str, str]:
    """Tasks of every kind the archive meets; returns their ids by role (keys k-<role>)."""
    ids = {"done": await admit(db, "k-done")}
    await finish(db, ids["done"], at=T0 + 1)
    ids["cancelled"] = await admit(db, "k-cancelled")
    await move(db, ids["cancelled"], "queued", "cancelled", now=T0 + 2)
    # a failed task and its operator retry (R19, chain_parent_id), both ended
    ids["failed"] = await admit(db, "k-failed")
    await finish(db, ids["failed"], at=T0 + 3, status="failed")
    ids["retry"] = await retry_task(
        db, ids["failed"], actor=OPERATOR, idempotency_key="again", registry=REGISTRY, now=T0 + 4
    )
    await move(db, ids["retry"], "queued", "skipped", now=T0 + 5)
    # a dependency and its dependent (R21), both ended
    ids["parent"] = await admit(db, "k-parent")
    ids["child"] = await admit(db, "k-child", depends_on=[ids["parent"]], now=T0 + 6)
    await move(db, ids["parent"], "queued", "cancelled", now=T0 + 7)
    # still live: queued, and ended too recently
    ids["queued"] = await admit(db, "k-queued")
    ids["recent"] = await admit(db, "k-recent")
    await move(db, ids["recent"], "queued", "cancelled", now=NOW - 60)
    return ids


ARCHIVED = ("done", "cancelled", "failed", "retry", "parent", "child")


async def test_archive_moves_old_terminal_tasks_and_keeps_their_keys(db: StateDB) -> None:
    ids = await scene(db)
    child = await taskward.get_task(db, ids["child"])
    assert child["status"] == "skipped"  # its dependency was cancelled (R21)
    history = {role: await taskward.list_transitions(db, ids[role]) for role in ARCHIVED}
    before = {role: await taskward.get_task(db, ids[role]) for role in ARCHIVED}

    # Pending notifications hold their tasks back until the deliverer expires them.
    dry = await archive_runs(db, older_than_s=DAY, dry_run=True, now=NOW)
    assert (dry.ready, dry.held, dry.archived) == (0, 6, 0)
    assert (await archive_runs(db, older_than_s=DAY, now=NOW)).archived == 0
    async with OutboxDeliverer(db) as deliverer:
        assert (await deliverer.run_once(now=EXPIRED))["expired"] >= 5

    # A dry run moves nothing: a retry and a dependency wait for the tasks naming them.
    dry = await archive_runs(db, older_than_s=DAY, dry_run=True, now=NOW)
    assert (dry.ready, dry.held) == (4, 2)
    assert sum((await count_by_status(db)).values()) == 8

    moved: list[int] = []
    report = await archive_runs(
        db, older_than_s=DAY, batch=1, now=NOW, progress=lambda n, total: moved.append(total)
    )
    assert report.archived == 6 and moved == [1, 2, 3, 4, 5, 6]
    assert sum((await count_by_status(db)).values()) == 2  # queued and recent stay

    for role in ARCHIVED:
        task = await taskward.get_task(db, ids[role])
        assert task["archived"] is True and task["archived_at"] == NOW
        assert {k: task[k] for k in before[role]} == before[role]
        assert await taskward.list_transitions(db, ids[role]) == history[role]
        assert await list_task_events(db, ids[role])
    assert "archived" not in await taskward.get_task(db, ids["queued"])
    assert await get_task_result(db, ids["done"]) == {"answer": 42}  # R22's, from the archive
    with pytest.raises(TaskNotFound):
        await taskward.list_transitions(db, "no-such-task")

    # The keys' promise (R23): the original id, or a conflict for another payload.
    for role in ARCHIVED[:3]:
        assert await admit(db, f"k-{role}", now=NOW) == ids[role]
        with pytest.raises(TaskIdempotencyConflict):
            await admit(db, f"k-{role}", argv=("echo", "other"), now=NOW)
    many = await taskward.submit_tasks(
        db, [app("k-done"), app("k-fresh")], registry=REGISTRY, now=NOW
    )
    assert many[0] == ids["done"] and many[1] not in ids.values()
    with pytest.raises(TaskIdempotencyConflict):
        await taskward.submit_tasks(db, [app("k-parent", argv=("echo",))], registry=REGISTRY)
    assert await admit(db, f"k-{uuid.uuid4()}", now=NOW) not in ids.values()

    acknowledged = {before[role]["idempotency_key"]: ids[role] for role in ARCHIVED}
    await assert_invariants(db, acknowledged=acknowledged, now=NOW, outbox_purged=True)


async def test_a_dry_run_and_an_empty_archive_change_nothing(db: StateDB) -> None:
    ids = await scene(db)
    report = await archive_runs(db, older_than_s=30 * DAY, now=NOW)
    assert report.archived == 0 and report.batches == 0
    for task_id in ids.values():
        assert "archived" not in await taskward.get_task(db, task_id)
    await assert_invariants(db, now=NOW)


async def test_prune_removes_dead_workers_finished_notifications_and_old_events(
    db: StateDB,
) -> None:
    ids = await scene(db)
    async with OutboxDeliverer(db) as deliverer:
        await deliverer.run_once(now=EXPIRED)
    await taskward.register_heartbeat(db, worker_id="w-stopped", now=T0)
    await mark_worker_stopped(db, worker_id="w-stopped", now=T0 + 1)
    await taskward.register_heartbeat(db, worker_id="w-live", now=NOW)
    events_before = {t: len(await list_task_events(db, t)) for t in ids.values()}

    dry = await prune(db, older_than_s=DAY, heartbeat_ttl=90, dry_run=True, now=NOW)
    # w-ret claimed at T0 + 1 and never stopped: stale for days
    assert sorted(dry.workers) == ["w-ret", "w-stopped"]
    assert dry.counts["workers"] == 2
    assert dry.counts["notifications"] >= 5
    old_events = sum(events_before.values()) - events_before[ids["recent"]]
    assert dry.counts["events"] == old_events
    assert {t: len(await list_task_events(db, t)) for t in ids.values()} == events_before

    seen: list[tuple[str, int]] = []
    report = await prune(
        db,
        older_than_s=DAY,
        heartbeat_ttl=90,
        batch=2,
        now=NOW,
        progress=lambda table, n: seen.append((table, n)),
    )
    assert report.counts == dry.counts
    assert all(n <= 2 for _, n in seen) and {t for t, _ in seen} == set(report.counts)
    assert [w["worker_id"] for w in await taskward.reads.list_workers(db, heartbeat_ttl=90)] == [
        "w-live"
    ]
    assert await list_task_events(db, ids["done"]) == []
    assert len(await list_task_events(db, ids["recent"])) == events_before[ids["recent"]]
    assert len(await taskward.list_transitions(db, ids["done"])) == 2  # facts stay
    # Prune again: nothing left to go.
    again = await prune(db, older_than_s=DAY, heartbeat_ttl=90, now=NOW)
    assert sum(again.counts.values()) == 0
    await assert_invariants(db, now=NOW, outbox_purged=True, events_pruned=True)


async def test_the_sync_client_and_a_caller_transaction_see_the_tombstone(
    db: StateDB, db_url: str
) -> None:
    from taskward.client import SyncClient

    task_id = await admit(db, "k-sync")
    await move(db, task_id, "queued", "cancelled", now=T0 + 1)
    async with OutboxDeliverer(db) as deliverer:
        await deliverer.run_once(now=EXPIRED)
    assert (await archive_runs(db, older_than_s=DAY, now=NOW)).archived == 1

    def sync_side() -> None:
        with SyncClient(db_url, registry=REGISTRY) as client:
            assert client.submit_task(app("k-sync")) == task_id
            with pytest.raises(TaskIdempotencyConflict):
                client.submit_task(app("k-sync", argv=("echo", "x")))
            assert client.get_task(task_id)["archived"] is True
        with sync_connection(db_url) as conn:  # R24: admission in the caller's transaction
            assert taskward.submit_task_sync(conn, app("k-sync"), registry=REGISTRY) == task_id
            with pytest.raises(TaskIdempotencyConflict):
                taskward.submit_task_sync(conn, app("k-sync", argv=("echo",)), registry=REGISTRY)
            conn.commit()

    await asyncio.to_thread(sync_side)
    assert sum((await count_by_status(db)).values()) == 0


async def test_a_tombstone_written_before_its_move_is_harmless(db: StateDB) -> None:
    """A batch's tombstones commit before its move (archive.py: an admission racing the move
    on PostgreSQL then finds the one or the other); a move that never follows leaves a key
    held twice by the same task, which admission and the checker read as one."""
    task_id = await admit(db, "k-between")
    await move(db, task_id, "queued", "cancelled", now=T0 + 1)
    async with db.transaction(now=NOW) as tx:
        await tx.execute("archive_tombstones", {"ids": f'["{task_id}"]'})
    assert await admit(db, "k-between", now=NOW) == task_id
    with pytest.raises(TaskIdempotencyConflict):
        await admit(db, "k-between", argv=("echo",), now=NOW)
    assert "archived" not in await taskward.get_task(db, task_id)
    await assert_invariants(db, acknowledged={"k-between": task_id}, now=NOW)
