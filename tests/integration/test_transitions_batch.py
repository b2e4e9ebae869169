"""Set-based transitions (``apply_transitions``, ``build_run_update_many``) keep every item's own
compare-and-swap, fact and event, on both backends.

The batched path must be indistinguishable, item by item, from ``apply_transitions`` of one
item at a time, one after another: these tests mix applied, lost, replayed and repeated
items in one batch.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import taskward
from taskward.checker import assert_invariants
from taskward.errors import TransitionIdempotencyConflict
from taskward.groupcommit import GroupCommit
from taskward.store.guarded import build_run_update_many
from taskward.store.port import ConcurrencyKeyBusy, StateDB
from taskward.transitions import (
    KeyAlreadyUsed,
    Prepared,
    apply_transitions,
    request_hash,
    transition_at,
)

from .helpers import move, request, submit


def prepared(
    task_id: str, src: str, dst: str, *, guard: dict[str, Any] | None = None, **kw: Any
) -> Prepared:
    req = request(task_id, src, dst, **kw)
    return (req, guard or {}, {}, request_hash(req))


async def _facts(db: StateDB, task_id: str) -> list[tuple[str, str]]:
    return [
        (f["previous_status"], f["status"]) for f in await taskward.list_transitions(db, task_id)
    ]


async def test_a_batch_applies_each_item_with_its_own_fact_and_event(db: StateDB) -> None:
    ids = [await submit(db) for _ in range(6)]
    async with db.transaction(now=1000.0) as tx:
        results = await apply_transitions(
            tx, [prepared(i, "queued", "skipped", summary=f"s-{i}") for i in ids]
        )
    assert [r.current_state for r, _ in results] == ["skipped"] * 6
    assert all(r.applied and not r.replayed for r, _ in results)
    for task_id, (result, updated) in zip(ids, results, strict=True):
        row = await taskward.get_task(db, task_id)
        assert row["status"] == "skipped" and row["status_reason_summary"] == f"s-{task_id}"
        assert updated is not None and updated["id"] == task_id
        facts = await taskward.list_transitions(db, task_id)
        assert [f["id"] for f in facts] == [result.transition_id]
        events = await taskward.list_task_events(db, task_id)
        assert [e["transition_id"] for e in events] == [result.transition_id]
        assert [e["id"] for e in events] == [result.event_id]
    await assert_invariants(db)


async def test_lost_and_replayed_items_write_nothing_while_the_rest_apply(db: StateDB) -> None:
    applied_id, lost_id, replay_id, missing_guard_id = [await submit(db) for _ in range(4)]
    await move(db, lost_id, "queued", "skipped")  # its CAS from queued must lose
    replayed = prepared(replay_id, "queued", "skipped", key="same-key")
    async with db.transaction() as tx:
        [(first, _)] = await apply_transitions(tx, [replayed])
    guard = {"leased_by": "someone-else", "lease_attempts": 0}
    async with db.transaction() as tx:
        results = await apply_transitions(
            tx,
            [
                prepared(applied_id, "queued", "skipped"),
                prepared(lost_id, "queued", "skipped"),
                replayed,  # the same request again: its original result
                prepared(missing_guard_id, "queued", "running", guard=guard),
            ],
        )
    (ok, ok_row), (lost, lost_row), (replay, replay_row), (guarded, guarded_row) = results
    assert ok.applied and ok_row is not None
    assert lost.conflict and not lost.applied and lost.current_state == "skipped"
    assert lost_row is None
    assert replay.replayed and replay.transition_id == first.transition_id and replay_row is None
    assert guarded.conflict and guarded.current_state == "queued" and guarded_row is None
    assert await _facts(db, lost_id) == [("queued", "skipped")]  # only the earlier move
    assert len(await taskward.list_transitions(db, replay_id)) == 1
    assert await _facts(db, missing_guard_id) == []
    await assert_invariants(db)


async def test_items_of_one_run_apply_in_their_given_order(db: StateDB) -> None:
    task_id, other = await submit(db), await submit(db)
    async with db.transaction() as tx:
        results = await apply_transitions(
            tx,
            [
                prepared(task_id, "queued", "running"),
                prepared(other, "queued", "running"),
                prepared(task_id, "running", "retry_wait"),
                prepared(other, "running", "completed"),
                prepared(task_id, "retry_wait", "queued"),
            ],
        )
    assert all(r.applied for r, _ in results)
    assert await _facts(db, task_id) == [
        ("queued", "running"),
        ("running", "retry_wait"),
        ("retry_wait", "queued"),
    ]
    assert await _facts(db, other) == [("queued", "running"), ("running", "completed")]
    assert (await taskward.get_task(db, task_id))["status"] == "queued"


async def test_a_used_key_with_other_content_rolls_the_batch_back(db: StateDB) -> None:
    ids = [await submit(db) for _ in range(3)]
    async with db.transaction() as tx:
        await apply_transitions(tx, [prepared(ids[0], "queued", "waiting_dependency", key="k")])
    await move(db, ids[0], "waiting_dependency", "queued")
    with pytest.raises(KeyAlreadyUsed):
        async with db.transaction() as tx:
            await apply_transitions(
                tx,
                [
                    prepared(ids[1], "queued", "skipped"),
                    prepared(ids[0], "queued", "skipped", key="k"),  # CAS applies, key taken
                    prepared(ids[2], "queued", "skipped"),
                ],
            )
    for task_id in ids[1:]:  # rolled back with the batch, events and notifications included
        assert (await taskward.get_task(db, task_id))["status"] == "queued"
        assert await _facts(db, task_id) == []
        assert await taskward.list_task_events(db, task_id) == []
    # ids[0]: only what its first transitions wrote (one event each), nothing of the batch
    assert len(await taskward.list_task_events(db, ids[0])) == 2


async def test_group_commit_batches_transitions_and_reports_a_conflict_alone(
    db: StateDB,
) -> None:
    ids = [await submit(db) for _ in range(10)]
    async with db.transaction() as tx:
        await apply_transitions(tx, [prepared(ids[0], "queued", "waiting_dependency", key="k")])
    await move(db, ids[0], "waiting_dependency", "queued")
    group = GroupCommit(db)

    def build(task_id: str, key: str | None) -> Any:
        return lambda _now: (request(task_id, "queued", "skipped", key=key), {}, {})

    outcomes = await asyncio.gather(
        *(transition_at(db, build(i, "k" if i == ids[0] else None), group=group) for i in ids),
        return_exceptions=True,
    )
    assert isinstance(outcomes[0], TransitionIdempotencyConflict)
    assert all(getattr(o, "applied", False) for o in outcomes[1:]), outcomes
    assert group.batches < group.units  # they did share transactions
    await assert_invariants(db)


async def test_mixed_shapes_share_one_batch(db: StateDB) -> None:
    queued, running = await submit(db), await submit(db)
    await move(db, running, "queued", "running")
    row = await taskward.get_task(db, running)
    lease = {"leased_by": row["leased_by"], "lease_attempts": row["lease_attempts"]}
    async with db.transaction() as tx:
        results = await apply_transitions(
            tx,
            [
                prepared(queued, "queued", "skipped"),
                prepared(running, "running", "completed", guard=lease),
            ],
        )
    assert [r.current_state for r, _ in results] == ["skipped", "completed"]
    assert all(r.applied for r, _ in results)


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_update_many_refuses_what_cannot_share_a_statement(dialect: str) -> None:
    same = ("a", "queued", {"status": "skipped"}, {})
    with pytest.raises(ValueError, match="appears twice"):
        build_run_update_many([same, same], (), dialect=dialect)
    other_shape = ("b", "queued", {"status": "skipped", "exit_code": 1}, {})
    with pytest.raises(ValueError, match="different shapes"):
        build_run_update_many([same, other_shape], (), dialect=dialect)
    null_guard = ("b", "queued", {"status": "skipped"}, {"leased_by": None})
    value_guard = ("c", "queued", {"status": "skipped"}, {"leased_by": "w"})
    with pytest.raises(ValueError, match="different shapes"):
        build_run_update_many([null_guard, value_guard], (), dialect=dialect)
    with pytest.raises(ValueError, match="allowlist"):
        build_run_update_many([("a", "queued", {"action_args": "{}"}, {})], (), dialect=dialect)
    with pytest.raises(ValueError, match="allowlist"):
        build_run_update_many([("a", "queued", {"status": "x"}, {"id": "a"})], (), dialect=dialect)


async def test_update_many_stores_each_columns_values_whatever_their_python_type(
    db: StateDB,
) -> None:
    """PostgreSQL sends each column as one binary typed array, which holds one type: ints among
    floats, floats for an integer column and NULLs must all arrive as the column's values."""
    a, b, c = await submit(db), await submit(db), await submit(db)
    values: list[dict[str, Any]] = [
        {"retry_at": 100, "exit_code": 3, "error_detail": "é\"'{}\\"},
        {"retry_at": 100.5, "exit_code": 4.0, "error_detail": None},
        {"retry_at": None, "exit_code": None, "error_detail": "plain"},
    ]
    async with db.transaction() as tx:
        rows = await tx.run_update_many(
            [
                (run, "queued", v, {"leased_by": None})
                for run, v in zip((a, b, c), values, strict=True)
            ],
            returning=("retry_at", "exit_code", "error_detail"),
        )
    got = {r["id"]: (r["retry_at"], r["exit_code"], r["error_detail"]) for r in rows}
    assert got == {
        a: (100.0, 3, "é\"'{}\\"),
        b: (100.5, 4, None),
        c: (None, None, "plain"),
    }


async def test_update_many_that_fails_part_way_is_undone_by_the_callers_rollback(
    db: StateDB,
) -> None:
    """Two queued runs of one serialization key moved to running by one call: the second
    breaks the running-key unique index (R7): the call raises ConcurrencyKeyBusy, and once the
    caller's savepoint rolls back neither run moved."""
    first = await submit(db, required_capabilities=["gpu-exclusive"])
    second = await submit(db, required_capabilities=["gpu-exclusive"])
    assert (await taskward.get_task(db, first))["concurrency_key"]
    items = [
        (run, "queued", {"status": "running", "leased_by": "w"}, {"leased_by": None})
        for run in (first, second)
    ]
    async with db.transaction() as tx:
        with pytest.raises(ConcurrencyKeyBusy):
            async with tx.savepoint():
                await tx.run_update_many(items, returning=("status",))
        rows = await tx.fetchone_each("run_get", [{"id": first}, {"id": second}])
    assert [(row or {}).get("status") for row in rows] == ["queued", "queued"]
