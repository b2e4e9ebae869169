"""request_task_cancel / cancel_task (ADR-0072 D5) on both backends."""

from __future__ import annotations

import pytest

import taskward
from taskward import Actor, request_task_cancel
from taskward.errors import TaskNotFound, TaskValidationError
from taskward.store.port import StateDB

from .helpers import move, submit

OPERATOR = Actor(type="operator", id="alice")


@pytest.mark.parametrize(
    "path", [["queued"], ["queued", "waiting_dependency"], ["queued", "running", "retry_wait"]]
)
async def test_unowned_tasks_are_cancelled_at_once(db: StateDB, path: list[str]) -> None:
    task_id = await submit(db)
    await move(db, task_id, *path)
    result = await request_task_cancel(db, task_id, actor=OPERATOR, idempotency_key="c1", now=50.0)
    assert (result.state, result.current_status) == ("cancelled", "cancelled")
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "cancelled" and row["ended_at"] == 50.0 and row["retry_at"] is None
    fact = (await taskward.list_transitions(db, task_id))[-1]
    assert (fact["previous_status"], fact["status"], fact["actor"]) == (
        path[-1],
        "cancelled",
        "operator:alice",
    )


async def test_running_task_gets_a_recorded_request_and_an_event(db: StateDB) -> None:
    task_id = await submit(db)
    await move(db, task_id, "queued", "running")
    result = await request_task_cancel(
        db, task_id, actor=OPERATOR, idempotency_key="c1", reason="user asked", now=60.0
    )
    assert (result.state, result.current_status) == ("cancellation_requested", "running")
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "running"
    assert (row["cancel_requested_at"], row["cancel_requested_by"]) == (60.0, "operator:alice")
    events = await taskward.list_task_events(db, task_id)
    assert events[-1]["kind"] == "cancel_requested"
    assert events[-1]["payload"]["reason"] == "user asked"
    # a second request with another key keeps the first request time
    again = await request_task_cancel(db, task_id, actor=OPERATOR, idempotency_key="c2", now=70.0)
    assert again.state == "cancellation_requested"
    assert (await taskward.get_task(db, task_id))["cancel_requested_at"] == 60.0


async def test_same_key_returns_the_original_answer(db: StateDB) -> None:
    task_id = await submit(db)
    first = await request_task_cancel(db, task_id, actor=OPERATOR, idempotency_key="c1")
    again = await request_task_cancel(db, task_id, actor=OPERATOR, idempotency_key="c1")
    assert first == again
    assert len(await taskward.list_transitions(db, task_id)) == 1
    # a new key sees the current (terminal) state
    later = await request_task_cancel(db, task_id, actor=OPERATOR, idempotency_key="c2")
    assert later.state == "already_terminal"


async def test_running_request_replays_by_key(db: StateDB) -> None:
    task_id = await submit(db)
    await move(db, task_id, "queued", "running")
    first = await request_task_cancel(db, task_id, actor=OPERATOR, idempotency_key="c1")
    again = await request_task_cancel(db, task_id, actor=OPERATOR, idempotency_key="c1")
    assert first == again
    kinds = [e["kind"] for e in await taskward.list_task_events(db, task_id)]
    assert kinds.count("cancel_requested") == 1


@pytest.mark.parametrize("later", ["completed", "cancelled"])
async def test_replayed_request_returns_the_original_result_after_the_task_moved(
    db: StateDB, later: str
) -> None:
    # ADR-0072 D5: the same key returns the original cancel result exactly: the status the task
    # had when the request was recorded, not the one it has now.
    task_id = await submit(db)
    await move(db, task_id, "queued", "running")
    first = await request_task_cancel(db, task_id, actor=OPERATOR, idempotency_key="c1")
    assert (first.state, first.current_status) == ("cancellation_requested", "running")
    await move(db, task_id, "running", later)
    again = await request_task_cancel(db, task_id, actor=OPERATOR, idempotency_key="c1")
    assert again == first
    # a new key answers from the task's state now
    fresh = await request_task_cancel(db, task_id, actor=OPERATOR, idempotency_key="c2")
    assert (fresh.state, fresh.current_status) == ("already_terminal", later)


@pytest.mark.parametrize("terminal", ["completed", "failed", "timed_out", "cancelled"])
async def test_terminal_tasks_answer_already_terminal_without_writing(
    db: StateDB, terminal: str
) -> None:
    task_id = await submit(db)
    await move(db, task_id, "queued", "running", terminal)
    facts = await taskward.list_transitions(db, task_id)
    result = await request_task_cancel(db, task_id, actor=OPERATOR, idempotency_key="c")
    assert (result.state, result.current_status) == ("already_terminal", terminal)
    assert await taskward.list_transitions(db, task_id) == facts


async def test_missing_task_and_empty_key_are_errors(db: StateDB) -> None:
    with pytest.raises(TaskNotFound):
        await request_task_cancel(db, "nope", actor=OPERATOR, idempotency_key="c")
    task_id = await submit(db)
    with pytest.raises(TaskValidationError):
        await request_task_cancel(db, task_id, actor=OPERATOR, idempotency_key=" ")


async def test_cancel_task_keeps_the_adr_0071_boolean_form(db: StateDB) -> None:
    task_id = await submit(db)
    assert await taskward.cancel_task(db, task_id, actor=OPERATOR) is True
    assert await taskward.cancel_task(db, task_id, actor=OPERATOR) is False
