"""get_task / list_tasks / list_transitions on both backends."""

from __future__ import annotations

import pytest

import taskward
from taskward.errors import TaskNotFound, TaskValidationError
from taskward.store.port import StateDB

from .helpers import move, submit


async def test_get_task_of_a_missing_id_raises(db: StateDB) -> None:
    with pytest.raises(TaskNotFound):
        await taskward.get_task(db, "missing")
    with pytest.raises(TaskNotFound):
        await taskward.list_transitions(db, "missing")


async def test_list_is_newest_first_filtered_and_paged(db: StateDB) -> None:
    ids = [await submit(db, now=100.0 + i) for i in range(7)]
    await move(db, ids[0], "queued", "cancelled")
    page, cursor = await taskward.list_tasks(db, limit=3)
    assert [r["id"] for r in page] == ids[::-1][:3]
    seen = [r["id"] for r in page]
    while cursor:
        page, cursor = await taskward.list_tasks(db, limit=3, cursor=cursor)
        seen += [r["id"] for r in page]
    assert seen == ids[::-1]
    cancelled, _ = await taskward.list_tasks(db, status="cancelled")
    assert [r["id"] for r in cancelled] == [ids[0]]


async def test_list_ties_on_created_at_page_without_loss(db: StateDB) -> None:
    ids = {await submit(db, now=5.0) for _ in range(5)}
    seen: list[str] = []
    cursor = None
    while True:
        page, cursor = await taskward.list_tasks(db, limit=2, cursor=cursor)
        seen += [r["id"] for r in page]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == 5


async def test_list_rejects_bad_filters(db: StateDB) -> None:
    with pytest.raises(TaskValidationError) as info:
        await taskward.list_tasks(db, status="leased")
    assert "retry_wait" in str(info.value)
    with pytest.raises(TaskValidationError):
        await taskward.list_tasks(db, limit=0)
    with pytest.raises(TaskValidationError):
        await taskward.list_tasks(db, cursor="garbage!")


async def test_history_is_in_insertion_order(db: StateDB) -> None:
    task_id = await submit(db)
    # identical timestamps: order must still be insertion order
    await move(
        db, task_id, "queued", "running", "retry_wait", "queued", "running", "completed", now=10.0
    )
    facts = await taskward.list_transitions(db, task_id)
    assert [f["status"] for f in facts] == [
        "running",
        "retry_wait",
        "queued",
        "running",
        "completed",
    ]
