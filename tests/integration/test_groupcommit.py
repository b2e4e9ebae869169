"""Group commit shares transactions without changing any unit's outcome (both backends)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import taskward
from taskward.groupcommit import POSTGRES_LANES, SLOW_START_BATCH, GroupCommit, default_lanes
from taskward.store.port import StateDB, Tx

from .helpers import Turns, request, submit


async def _status_of(tx: Tx, task_id: str) -> str:
    row = await tx.fetchone("run_status", {"id": task_id})
    assert row is not None
    return str(row["status"])


async def test_units_arriving_together_share_commits(db: StateDB) -> None:
    ids = [await submit(db) for _ in range(20)]
    group = GroupCommit(db)
    results = await asyncio.gather(
        *(
            group.run(lambda tx, i=i: _status_of(tx, i), fallback=lambda: asyncio.sleep(0, "x"))
            for i in ids
        )
    )
    assert results == ["queued"] * 20
    assert group.units == 20 and group.batches < 20


async def test_grouped_transitions_each_keep_their_fact_and_event(db: StateDB) -> None:
    ids = [await submit(db) for _ in range(12)]
    group = GroupCommit(db)
    from taskward.transitions import transition_at

    results = await asyncio.gather(
        *(
            transition_at(
                db, lambda _now, i=i: (request(i, "queued", "skipped"), {}, {}), group=group
            )
            for i in ids
        )
    )
    assert all(r.applied for r in results)
    assert group.batches < 12
    for task_id, result in zip(ids, results, strict=True):
        facts = await taskward.list_transitions(db, task_id)
        assert [f["id"] for f in facts] == [result.transition_id]
        events = await taskward.list_task_events(db, task_id)
        assert [e["id"] for e in events] == [result.event_id]


async def test_a_failing_unit_is_retried_alone_and_the_others_still_apply(db: StateDB) -> None:
    ids = [await submit(db) for _ in range(6)]
    group = GroupCommit(db)
    from taskward.transitions import transition_at

    def build(task_id: str):  # type: ignore[no-untyped-def]
        return lambda _now: (request(task_id, "queued", "skipped"), {}, {})

    calls = [transition_at(db, build(i), group=group) for i in ids]
    calls.append(
        transition_at(
            db, lambda _now: (request("missing", "queued", "skipped"), {}, {}), group=group
        )
    )
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[-1], taskward.TaskNotFound)
    assert all(not isinstance(r, Exception) and r.applied for r in results[:-1])
    for task_id in ids:
        assert len(await taskward.list_transitions(db, task_id)) == 1


async def test_a_replayed_key_in_a_batch_returns_the_original(db: StateDB) -> None:
    task_id = await submit(db)
    other = await submit(db)
    group = GroupCommit(db)
    from taskward.transitions import transition_at

    first = await transition_at(
        db, lambda _now: (request(task_id, "queued", "skipped", key="k"), {}, {}), group=group
    )
    again, applied = await asyncio.gather(
        transition_at(
            db, lambda _now: (request(task_id, "queued", "skipped", key="k"), {}, {}), group=group
        ),
        transition_at(db, lambda _now: (request(other, "queued", "skipped"), {}, {}), group=group),
    )
    assert again.replayed and again.transition_id == first.transition_id
    assert applied.applied
    with pytest.raises(taskward.TransitionIdempotencyConflict):
        await transition_at(
            db, lambda _now: (request(task_id, "queued", "cancelled", key="k"), {}, {}), group=group
        )


async def test_follow_up_units_join_the_next_batch_together(db: StateDB) -> None:
    """Callers answered by one commit and submitting their next unit at once (a host writes a
    summary, then completes) share the next batch, even when other work is already queued,
    instead of trickling into the batch after it."""
    ids = [await submit(db) for _ in range(SLOW_START_BATCH)]
    group = GroupCommit(db, lanes=1)  # one transaction in flight: the others queue behind it
    extra: list[asyncio.Future[str]] = []

    async def first_unit(tx: Tx, task_id: str) -> str:
        if not extra:  # other work arrives while this batch is still committing
            extra.append(
                asyncio.ensure_future(
                    group.run(lambda t: _status_of(t, ids[0]), fallback=lambda: asyncio.sleep(0))
                )
            )
        return await _status_of(tx, task_id)

    async def two_steps(task_id: str) -> tuple[str, str]:
        first = await group.run(
            lambda tx: first_unit(tx, task_id), fallback=lambda: asyncio.sleep(0, "fallback")
        )
        second = await group.run(
            lambda tx: _status_of(tx, task_id), fallback=lambda: asyncio.sleep(0, "fallback")
        )
        return first, second

    results = await asyncio.gather(*(two_steps(i) for i in ids))
    assert results == [("queued", "queued")] * len(ids)
    assert await extra[0] == "queued"
    assert (group.units, group.batches) == (2 * len(ids) + 1, 2)


class Observed:
    """The real store, noting the loop turn at which each transaction is asked for."""

    def __init__(self, db: StateDB, turns: Turns) -> None:
        self._db = db
        self.turns = turns
        self.began: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def transaction(self, **kwargs: Any) -> Any:
        self.began.append(self.turns.count)
        return self._db.transaction(**kwargs)


async def test_a_unit_sent_to_an_idle_group_commit_begins_its_transaction_at_once(
    db: StateDB,
) -> None:
    """A new flusher takes the queue as it finds it: nothing it committed has just answered
    callers who would follow (an idle worker's claim takes this path: issue 7, pickup latency).
    A flusher that has just committed still lets followers in (the test above)."""
    task_id = await submit(db)
    turns = Turns()
    try:
        observed = Observed(db, turns)
        group = GroupCommit(observed)  # type: ignore[arg-type]
        for _ in range(3):
            for _ in range(100):  # idle: the last flusher saw an empty queue and ended
                if not group.flushing:
                    break
                await asyncio.sleep(0)
            sent_at = turns.count
            result = await group.run(
                lambda tx: _status_of(tx, task_id), fallback=lambda: asyncio.sleep(0, "x")
            )
            assert result == "queued"
            assert observed.began[-1] - sent_at <= 1
    finally:
        turns.stop()


async def test_a_burst_after_idle_starts_with_a_small_batch_and_doubles(db: StateDB) -> None:
    """Slow start: units that arrive together after an idle spell go in batches of 2, 4, 8...
    so the first of them are answered after a short transaction instead of all waiting for one
    long one (tasks that finish together then restart spread out, not in lockstep)."""
    task_id = await submit(db)
    group = GroupCommit(db, max_batch=16, lanes=1)
    batch_of: list[int] = []

    async def unit(tx: Tx) -> str:
        batch_of.append(group.batches)  # counted as each batch is taken
        return await _status_of(tx, task_id)

    await asyncio.gather(*(group.run(unit, fallback=lambda: asyncio.sleep(0)) for _ in range(40)))
    sizes = [batch_of.count(n) for n in dict.fromkeys(batch_of)]
    expected, size, left = [], SLOW_START_BATCH, 40
    while left:
        expected.append(min(size, left))
        left -= expected[-1]
        size = min(16, size * 2)
    assert sizes == expected and sizes[0] == SLOW_START_BATCH < 16 and 16 in sizes
    # Idle again (the flusher saw an empty queue and ended): the next burst starts small again.
    # Right after the answers it would not be: callers that submit at once are followers.
    for _ in range(100):
        if not group.flushing:
            break
        await asyncio.sleep(0)
    assert group.flushing == 0
    batch_of.clear()
    await asyncio.gather(*(group.run(unit, fallback=lambda: asyncio.sleep(0)) for _ in range(6)))
    assert batch_of.count(batch_of[0]) == SLOW_START_BATCH


async def test_postgresql_runs_two_batches_at_once_and_sqlite_one(db: StateDB) -> None:
    """On PostgreSQL a second batch starts while the first is still in its transaction (each
    on its own connection): a unit of the first batch waits for a unit of the second, which
    with one lane would never run. SQLite has one writer, so one lane."""
    if db.dialect == "sqlite":
        assert default_lanes(db) == GroupCommit(db).lanes == 1
        return
    assert GroupCommit(db).lanes == POSTGRES_LANES == 2
    first, second = await submit(db), await submit(db)
    group = GroupCommit(db, max_batch=1)  # one unit a batch: two batches
    second_ran = asyncio.Event()

    async def waits_for_the_other(tx: Tx) -> str:
        await asyncio.wait_for(second_ran.wait(), timeout=10)
        return await _status_of(tx, first)

    async def sets(tx: Tx) -> str:
        second_ran.set()
        return await _status_of(tx, second)

    results = await asyncio.gather(
        group.run(waits_for_the_other, fallback=lambda: asyncio.sleep(0, "fallback")),
        group.run(sets, fallback=lambda: asyncio.sleep(0, "fallback")),
    )
    assert results == ["queued", "queued"]
    assert group.batches == 2


async def test_a_unit_whose_caller_was_cancelled_still_commits_with_its_batch(
    db: StateDB,
) -> None:
    """Once queued, a unit is applied with its batch even if its caller stopped waiting; the
    other callers get their answers, and nothing is left unretrieved."""
    ids = [await submit(db) for _ in range(4)]
    group = GroupCommit(db)
    from taskward.transitions import transition_at

    calls = [
        asyncio.ensure_future(
            transition_at(
                db, lambda _now, i=i: (request(i, "queued", "skipped"), {}, {}), group=group
            )
        )
        for i in ids
    ]
    await asyncio.sleep(0)  # every unit is queued; the flusher has not taken them yet
    calls[0].cancel()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    assert all(r.applied for r in results[1:])  # type: ignore[union-attr]
    for task_id in ids:  # the cancelled caller's unit committed too
        assert (await taskward.get_task(db, task_id))["status"] == "skipped"
