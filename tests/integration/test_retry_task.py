"""Operator retry (DESIGN.md R19) on both backends: a terminal task admitted again as a new
task, the original untouched, the same operator key the same new task."""

from __future__ import annotations

import pytest

import taskward
from taskward import Actor, TaskNotFound, TaskNotRetryable, TaskValidationError
from taskward.claims import WorkerSpec, claim_runs
from taskward.execution import Outcome, finish_run
from taskward.reads import count_by_status, list_retries
from taskward.resubmit import retry_key
from taskward.store.port import StateDB

from .helpers import REGISTRY, submit

OPERATOR = Actor(type="operator", id="ops")
T0 = 1_000.0


async def _failed(db: StateDB) -> str:
    """A task claimed and failed (terminal), with capabilities and args to copy."""
    task_id = await submit(
        db,
        args={"argv": ["echo", "é"], "env": {"TOKEN": "s3cret"}},
        required_capabilities=["gpu"],
        now=T0,
    )
    spec = WorkerSpec(worker_id="host:retry001", kinds=REGISTRY.kinds(), capabilities=["gpu"])
    [lease] = await claim_runs(db, spec, now=T0 + 1)
    result = await finish_run(
        db,
        lease,
        Outcome("failed", "execution_failed", "boom", {"ended_at": T0 + 2}),
        actor=spec.actor,
        now=T0 + 2,
    )
    assert result.applied
    return task_id


async def test_a_failed_task_is_admitted_again_as_a_new_task(db: StateDB) -> None:
    original = await _failed(db)
    before = await db.fetchone("run_get", {"id": original})
    facts = await taskward.list_transitions(db, original)
    new = await taskward.retry_task(
        db, original, actor=OPERATOR, idempotency_key="k1", registry=REGISTRY, now=T0 + 10
    )
    assert new != original
    row = await db.fetchone("run_get", {"id": new})
    assert row is not None
    assert (row["status"], row["lease_attempts"], row["queued_at"]) == ("queued", 0, T0 + 10)
    for column in ("action_kind", "action_args", "execution_target", "required_capabilities"):
        assert row[column] == before[column], column  # the real env too, not the redacted one
    assert row["idempotency_key"] == retry_key(original, "k1") == f"retry:{original}:k1"
    assert (row["chain_parent_id"], row["chain_depth"], row["admission_source"]) == (
        original,
        1,
        "retry",
    )
    assert row["trigger_context"] == {"retry_of": original, "actor": "operator:ops"}
    # The original never changes: its row and its facts are as they were.
    assert await db.fetchone("run_get", {"id": original}) == before
    assert await taskward.list_transitions(db, original) == facts
    # The same operator key answers the same new task; another key, another task.
    again = await taskward.retry_task(
        db, original, actor=OPERATOR, idempotency_key=" k1 ", registry=REGISTRY
    )
    assert again == new
    other = await taskward.retry_task(
        db, original, actor=OPERATOR, idempotency_key="k2", registry=REGISTRY
    )
    assert other not in (new, original)


async def test_a_retry_of_a_retry_is_one_deeper_in_the_chain(db: StateDB) -> None:
    original = await _failed(db)
    first = await taskward.retry_task(
        db, original, actor=OPERATOR, idempotency_key="a", registry=REGISTRY
    )
    await taskward.request_task_cancel(db, first, actor=OPERATOR, idempotency_key="c")
    second = await taskward.retry_task(
        db, first, actor=OPERATOR, idempotency_key="a", registry=REGISTRY
    )
    row = await db.fetchone("run_get", {"id": second})
    assert row is not None and (row["chain_parent_id"], row["chain_depth"]) == (first, 2)


async def test_only_a_terminal_task_is_retried(db: StateDB) -> None:
    queued = await submit(db)
    assert sum((await count_by_status(db)).values()) == 1
    with pytest.raises(TaskNotRetryable) as caught:
        await taskward.retry_task(
            db, queued, actor=OPERATOR, idempotency_key="k", registry=REGISTRY
        )
    assert caught.value.status == "queued"
    with pytest.raises(TaskNotFound):
        await taskward.retry_task(
            db, "no-such-task", actor=OPERATOR, idempotency_key="k", registry=REGISTRY
        )
    assert sum((await count_by_status(db)).values()) == 1  # nothing was admitted


async def test_a_bad_operator_key_writes_nothing(db: StateDB) -> None:
    original = await _failed(db)
    for key in ("", "x" * 250, "bad\x00key"):
        with pytest.raises(TaskValidationError) as caught:
            await taskward.retry_task(
                db, original, actor=OPERATOR, idempotency_key=key, registry=REGISTRY
            )
        assert caught.value.field == "idempotency_key"
    row = await db.fetchone("run_get_by_key", {"idempotency_key": retry_key(original, "")})
    assert row is None


async def test_list_retries_names_the_tasks_retried_from_a_task_oldest_first(db: StateDB) -> None:
    """``reads.list_retries`` (the dashboard's "Retried as"): the original's retries, oldest
    first and bounded; a retry of a retry belongs to its own parent; an unknown id has none."""
    original = await _failed(db)
    assert await list_retries(db, original) == []
    first = await taskward.retry_task(
        db, original, actor=OPERATOR, idempotency_key="a", registry=REGISTRY, now=T0 + 10
    )
    second = await taskward.retry_task(
        db, original, actor=OPERATOR, idempotency_key="b", registry=REGISTRY, now=T0 + 20
    )
    await taskward.request_task_cancel(db, first, actor=OPERATOR, idempotency_key="c")
    grandchild = await taskward.retry_task(
        db, first, actor=OPERATOR, idempotency_key="a", registry=REGISTRY, now=T0 + 30
    )
    retries = await list_retries(db, original)
    assert [(r["id"], r["status"], r["idempotency_key"]) for r in retries] == [
        (first, "cancelled", retry_key(original, "a")),
        (second, "queued", retry_key(original, "b")),
    ]
    assert [r["created_at"] for r in retries] == [T0 + 10, T0 + 20]
    assert [r["id"] for r in await list_retries(db, original, limit=1)] == [first]
    assert [r["id"] for r in await list_retries(db, first)] == [grandchild]
    assert await list_retries(db, "no-such-task") == []
    with pytest.raises(TaskValidationError):
        await list_retries(db, original, limit=0)
