"""LocalTaskSource's one-step finish (``host.ports.FinishesInOneStep``): a task's summary, its
completion and the next lease for its slot in one transaction (ADR-0037 D3, D4; R4), on both
backends. The host tests of ``test_host.py`` also run every host case through this path."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

import taskward
from taskward import groupcommit
from taskward.groupcommit import GroupCommit
from taskward.host import (
    LocalSummaryStore,
    ResidentEngineHost,
    SessionSummary,
    SummaryNotWritten,
    Task,
    TaskAck,
    TaskSession,
)
from taskward.host.engine_host import manifest_ref_for
from taskward.maintenance.reaper import reap_expired_leases
from taskward.store.port import StateDB
from taskward.testing import wait_until

from .test_host import claim, result_for, source, statuses, submit

ACCEPTED = TaskAck(applied=True)


def summary_for(task: Task, narrative: str | None = None) -> SessionSummary:
    facts = {"task_id": task.id, "attempt": task.attempt}
    return SessionSummary(facts=facts, narrative=narrative, manifest_ref=manifest_ref_for(task))


def one() -> int:
    return 1


def none() -> int:
    return 0


async def finish_together(
    src: Any, tasks: list[Task], *, claim_next: Any
) -> list[tuple[TaskAck, list[Task]]]:
    """Every task's one-step finish submitted in the same loop turn (one group commit batch,
    or a few), each with its own summary; the acknowledgements and leases in task order."""
    return list(
        await asyncio.gather(
            *(
                src.complete_with_summary(
                    t.id, t.lease_id, result_for(t), summary_for(t), claim_next=claim_next
                )
                for t in tasks
            )
        )
    )


async def fact_times(db: StateDB, task_id: str) -> dict[str, float]:
    return {f["status"]: f["created_at"] for f in await taskward.list_transitions(db, task_id)}


async def test_summary_completion_and_next_claim_commit_in_one_transaction(db: StateDB) -> None:
    first_id, second_id = await submit(db), await submit(db)
    src = source(db, one_step=True)
    first = await claim(src)
    assert first.id == first_id
    ack, leased = await src.complete_with_summary(
        first.id, first.lease_id, result_for(first), summary_for(first), claim_next=one
    )
    assert ack == ACCEPTED
    assert [t.id for t in leased] == [second_id] and leased[0].attempt == 1
    # One transaction: the completion and the claim of the next task carry its one time (R9).
    done, claimed = await fact_times(db, first_id), await fact_times(db, second_id)
    assert done["completed"] == claimed["running"]
    stored = await LocalSummaryStore(db).get(f"{first_id}:1")
    assert stored is not None and stored["state"] == "complete"
    assert await statuses(db, first_id) == ["running", "completed"]
    # The next task is this source's lease like any other: it acknowledges through it.
    assert (await src.complete(leased[0].id, leased[0].lease_id, result_for(leased[0]))).applied


async def test_no_next_lease_when_the_host_asks_for_none(db: StateDB) -> None:
    first_id, second_id = await submit(db), await submit(db)
    src = source(db, one_step=True)
    first = await claim(src)
    ack, leased = await src.complete_with_summary(
        first.id, first.lease_id, result_for(first), summary_for(first), claim_next=none
    )
    assert ack == ACCEPTED and leased == []
    assert (await taskward.get_task(db, second_id))["status"] == "queued"
    assert await statuses(db, first_id) == ["running", "completed"]


async def test_a_conflicting_summary_completes_nothing(db: StateDB) -> None:
    await submit(db)
    queued = await submit(db)
    src = source(db, one_step=True)
    task = await claim(src)
    assert src.summary_store is not None
    await src.summary_store.write(f"{task.id}:1", summary_for(task, "another"))
    with pytest.raises(SummaryNotWritten):
        await src.complete_with_summary(
            task.id, task.lease_id, result_for(task), summary_for(task), claim_next=one
        )
    assert (await taskward.get_task(db, task.id))["status"] == "running"
    assert (await taskward.get_task(db, queued))["status"] == "queued"  # nothing leased


async def test_an_exact_replay_returns_the_same_ack_without_a_second_fact(db: StateDB) -> None:
    await submit(db)
    src = source(db, one_step=True)
    task = await claim(src)
    first = await src.complete_with_summary(
        task.id, task.lease_id, result_for(task), summary_for(task), claim_next=none
    )
    again = await src.complete_with_summary(
        task.id, task.lease_id, result_for(task), summary_for(task), claim_next=none
    )
    assert first == again == (ACCEPTED, [])
    assert await statuses(db, task.id) == ["running", "completed"]


async def test_a_lost_lease_is_stale_and_the_freed_slot_still_refills(db: StateDB) -> None:
    task_id, next_id = await submit(db), await submit(db)
    src = source(db, one_step=True)
    task = await claim(src)
    assert task.id == task_id
    # The lease lapses and a reaper takes the run back (injected time, R6).
    await reap_expired_leases(db, now=task.lease_expires_at.timestamp() + 1)
    ack, leased = await src.complete_with_summary(
        task.id, task.lease_id, result_for(task), summary_for(task), claim_next=one
    )
    assert ack == TaskAck(applied=False, rejection="stale_lease")  # R4: judged by the row
    assert [t.id for t in leased] == [next_id]
    assert await statuses(db, task_id) == ["running", "retry_wait"]


async def test_finishes_arriving_together_share_commits_and_keep_their_own_facts(
    db: StateDB,
) -> None:
    ids = [await submit(db) for _ in range(12)]
    src = source(db, one_step=True)
    tasks = await src.claim_many(12)
    assert sorted(t.id for t in tasks) == sorted(ids)
    group = src.summary_store.group if src.summary_store else GroupCommit(db)
    before = group.batches
    results = await finish_together(src, tasks, claim_next=none)
    assert all(ack == ACCEPTED and leased == [] for ack, leased in results)
    assert group.batches - before < len(tasks)
    for task in tasks:
        assert await statuses(db, task.id) == ["running", "completed"]
        assert len(await taskward.list_task_events(db, task.id)) == 2
        stored = await LocalSummaryStore(db).get(f"{task.id}:1")
        assert stored is not None and stored["state"] == "complete"


@pytest.mark.parametrize("earlier", ["complete", "pending"])
async def test_a_batch_meeting_a_summary_already_there_falls_back_to_two_steps(
    db: StateDB, earlier: str
) -> None:
    """The batch inserts its summaries plainly; a session that already has a row fails that
    insert and every finish of the batch takes the two-step path: a complete row with the same
    content (a retry after a lost reply) is a replay, a pending one (an earlier failure path
    marked it) is completed (D4: never left pending under a completed task)."""
    ids = [await submit(db) for _ in range(6)]
    src = source(db, one_step=True)
    tasks = await src.claim_many(6)
    assert src.summary_store is not None and sorted(t.id for t in tasks) == sorted(ids)
    key = f"{tasks[2].id}:1"
    if earlier == "complete":
        await src.summary_store.write(key, summary_for(tasks[2]))
    else:
        await src.summary_store.mark_pending(key, "an earlier attempt at finishing")
    results = await finish_together(src, tasks, claim_next=none)
    assert [ack for ack, _ in results] == [ACCEPTED] * 6
    for task in tasks:
        assert await statuses(db, task.id) == ["running", "completed"]
        row = await db.fetchone("summary_get", {"session_key": f"{task.id}:1"})
        assert row is not None and row["state"] == "complete"


def gated_host(
    src: Any, db: StateDB, gates: dict[str, asyncio.Event], *, slots: int
) -> tuple[ResidentEngineHost, list[str]]:
    started: list[str] = []

    async def run_task(task: Task, session: Any) -> dict[str, Any]:
        started.append(task.id)
        await gates[task.id].wait()
        return {}

    h = ResidentEngineHost(
        source=src,
        summaries=src.summary_store,
        max_concurrent_tasks=slots,
        session_factory=TaskSession,
        run_task=run_task,
        idle_wait_s=0.02,
    )
    return h, started


async def test_the_host_runs_the_next_task_in_the_slot_its_finish_freed(db: StateDB) -> None:
    ids = [await submit(db) for _ in range(3)]
    gates = {task_id: asyncio.Event() for task_id in ids}
    h, started = gated_host(source(db, one_step=True), db, gates, slots=1)
    assert h.finishes_in_one_step
    serve = asyncio.ensure_future(h.serve())
    try:
        for index, task_id in enumerate(ids):

            async def running(n: int = index + 1) -> bool:
                return len(started) == n

            await wait_until(running, f"task {index + 1} to start", serving=serve)
            assert started[-1] == task_id and h.active_count == 1
            assert (await taskward.reads.count_by_status(db))["running"] == 1  # D3
            gates[task_id].set()
        for task_id in ids:

            async def completed(task_id: str = task_id) -> bool:
                return bool((await taskward.get_task(db, task_id))["status"] == "completed")

            await wait_until(completed, "completion", serving=serve)
    finally:
        h.stop_claiming("test finished")
        await asyncio.wait_for(serve, 10)
    # Each next task was leased by the finish of the one before it, in its transaction.
    for before, after in itertools.pairwise(ids):
        assert (await fact_times(db, before))["completed"] == (await fact_times(db, after))[
            "running"
        ]
    assert h.stats.claimed == 3 and h.stats.completed == 3


async def test_a_host_whose_summary_store_is_another_finishes_in_two_steps(
    db: StateDB,
) -> None:
    src = source(db, one_step=True)
    h = ResidentEngineHost(
        source=src,
        summaries=LocalSummaryStore(db),  # not the store the source writes into
        max_concurrent_tasks=1,
        session_factory=TaskSession,
        run_task=lambda task, session: asyncio.sleep(0, {}),
    )
    assert not h.finishes_in_one_step


async def shut_down_while_acknowledging(
    h: ResidentEngineHost, entered: asyncio.Event, release: asyncio.Event
) -> None:
    """Serve ``h``, cancel it (a shutdown) once an acknowledgement has ``entered``, then
    ``release`` the acknowledgement; serving ends cancelled after it."""
    serve = asyncio.ensure_future(h.serve())
    await asyncio.wait_for(entered.wait(), 10)
    serve.cancel()
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(serve, 15)


@pytest.mark.parametrize("committed", [False, True], ids=["before-commit", "after-commit"])
async def test_a_host_stopped_while_finishing_leaves_no_lease_behind(
    db: StateDB, committed: bool
) -> None:
    first_id, second_id = await submit(db), await submit(db)
    src = source(db, one_step=True)
    entered, release = asyncio.Event(), asyncio.Event()
    real = src.complete_with_summary

    async def slow_finish(*args: Any, **kwargs: Any) -> tuple[TaskAck, list[Task]]:
        # The host is cancelled while its finish is on its way: before the step ran, or after
        # it committed (leasing the next task) but before its answer came back.
        if committed:
            answer = await real(*args, **kwargs)
            entered.set()
            await release.wait()
            return answer
        entered.set()
        await release.wait()
        return await real(*args, **kwargs)

    src.complete_with_summary = slow_finish  # type: ignore[method-assign]
    gates = {first_id: asyncio.Event(), second_id: asyncio.Event()}
    gates[first_id].set()
    h, started = gated_host(src, db, gates, slots=1)
    await shut_down_while_acknowledging(h, entered, release)
    assert started == [first_id]
    assert await statuses(db, first_id) == ["running", "completed"]
    row = await taskward.get_task(db, second_id)
    if committed:
        # Leased for the freed slot but never run: handed back at once (R10), not left leased
        # until the lease expires.
        assert (row["status"], row["status_reason_code"]) == ("retry_wait", "host_shutdown")
        assert row["leased_by"] is None
    else:
        # A host that stopped claiming leases nothing more (D3): no attempt spent.
        assert (row["status"], row["lease_attempts"]) == ("queued", 0)


async def test_a_host_stopped_while_completing_in_two_steps_lets_the_completion_finish(
    db: StateDB,
) -> None:
    """The two-step path's acknowledgement is uninterrupted too (``_settling``): a shutdown
    that arrives while ``complete`` is on its way waits for it, and the host counts it."""
    task_id = await submit(db)
    src = source(db, one_step=False)
    entered, release = asyncio.Event(), asyncio.Event()
    real = src.complete

    async def slow_complete(*args: Any, **kwargs: Any) -> TaskAck:
        entered.set()
        await release.wait()
        return await real(*args, **kwargs)

    src.complete = slow_complete  # type: ignore[method-assign]
    gate = asyncio.Event()
    gate.set()
    h, started = gated_host(src, db, {task_id: gate}, slots=1)
    h.summaries = LocalSummaryStore(db)
    assert not h.finishes_in_one_step
    await shut_down_while_acknowledging(h, entered, release)
    assert started == [task_id]
    assert await statuses(db, task_id) == ["running", "completed"]
    assert h.stats.completed == 1  # the job itself heard the acknowledgement


async def test_finishes_refill_every_freed_slot_past_rows_another_claimer_holds(
    db: StateDB, backend: str, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """21 finishes in one batch want 21 leases: claim passes of 20 and 1 (CLAIM_CAP). On
    PostgreSQL they travel with the summaries and completions in one round trip; here the
    oldest queued rows are locked by another transaction, so both passes come back short with
    a full page, and the paged pass that follows in the same transaction takes rows past them:
    every slot is refilled, no row twice, none of the held ones."""
    first = [await submit(db) for _ in range(21)]
    held = [await submit(db) for _ in range(30)]
    rest = [await submit(db) for _ in range(30)]
    src = source(db, one_step=True)
    tasks = await src.claim_many(20) + await src.claim_many(1)
    assert sorted(t.id for t in tasks) == sorted(first)
    holder: Any = None
    if backend == "postgres":
        import psycopg

        holder = psycopg.connect(db_url)
        holder.execute("SELECT id FROM schedule_runs WHERE id = ANY(%s) FOR UPDATE", (held,))
    try:
        # Submitted in one loop turn, the 21 finishes form one batch (no slow start here).
        monkeypatch.setattr(groupcommit, "SLOW_START_BATCH", 64)
        group = src.summary_store.group if src.summary_store else GroupCommit(db)
        before = group.batches
        results = await finish_together(src, tasks, claim_next=one)
    finally:
        if holder is not None:
            holder.rollback()
            holder.close()
    assert group.batches - before <= 2  # one on PostgreSQL: passes of 20 and 1 together
    leased = [t.id for _, batch in results for t in batch]
    assert [ack for ack, _ in results] == [ACCEPTED] * 21
    assert all(len(batch) == 1 for _, batch in results)
    assert len(set(leased)) == 21
    expected = set(rest) if backend == "postgres" else set(held)
    assert set(leased) <= expected
    for task_id in leased:
        assert (await taskward.get_task(db, task_id))["status"] == "running"
    for task in tasks:
        assert await statuses(db, task.id) == ["running", "completed"]
