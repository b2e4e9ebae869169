"""Stored results (R22): reading a completed task's return value, and its dependencies'.

The writer is the completing transition itself (``transitions.apply`` and PostgreSQL's
``run_finish_batch`` insert the ``task_results`` row in the transaction of ``running ->
completed``, and only when the compare-and-swap applied), so a task has at most one stored
result: its completing attempt's. This module only reads. A completed task without a row
returned None (or ran a kind that returns nothing, or completed before R22): it reads as None.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from taskward.canonical import loads
from taskward.errors import TaskNotCompleted, TaskNotFound
from taskward.store.port import StateDB


class StoredResult(NamedTuple):
    """A completed task's result: its id, the completing attempt and the decoded value."""

    task_id: str
    attempt: int
    result: Any


async def read_task_result(db: StateDB, task_id: str) -> StoredResult:
    """The completed ``task_id``'s stored result with its attempt, in one read.

    Raises:
        TaskNotFound: no task has this id.
        TaskNotCompleted: the task is not ``completed`` (names its status).
    """
    row = await db.fetchone("result_get", {"id": task_id})
    if row is None:
        raise TaskNotFound(task_id)
    if row["status"] != "completed":
        raise TaskNotCompleted(task_id, row["status"])
    text = row["result"]
    return StoredResult(task_id, int(row["attempt"]), None if text is None else loads(text))


async def get_task_result(db: StateDB, task_id: str) -> Any:
    """The decoded return value of the completed ``task_id`` (R22); None when it returned None.

    Raises:
        TaskNotFound: no task has this id.
        TaskNotCompleted: the task is not ``completed`` (``.status`` says what it is).
    """
    return (await read_task_result(db, task_id)).result


async def dependency_results(db: StateDB, task_id: str) -> dict[str, Any]:
    """Each dependency of ``task_id`` (R21's ``task_dependencies``) and its stored result (None
    when it has none, or has not completed), ordered by id; empty without dependencies. What a
    ``TaskContext`` carries (R22)."""
    rows = await db.fetchall("result_of_dependencies", {"task_id": task_id})
    return {
        row["depends_on_id"]: None if row["result"] is None else loads(row["result"])
        for row in rows
    }
