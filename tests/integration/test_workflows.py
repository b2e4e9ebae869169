"""Workflows (issue 26 over DESIGN.md R21) on both backends: a graph admitted in one
transaction with keys derived from the workflow's, replayed whole, refused whole.

Time is injected (``now=``); nothing sleeps.
"""

from __future__ import annotations

import pytest

import taskward
from taskward import TaskIdempotencyConflict, TaskValidationError, Workflow
from taskward.store.port import StateDB
from tests.integration.helpers import REGISTRY, move, submit

T0 = 1_800_000_000.0
TRUE = {"argv": ["true"]}


def diamond(key: str = "wf-1") -> Workflow:
    """extract -> (part-0, part-1, part-2) -> report, then a chain publish -> notify."""
    wf = Workflow(key)
    extract = wf.step("extract", "command", TRUE)
    parts = wf.group(
        [(f"part-{i}", "command", {"argv": ["echo", str(i)]}) for i in range(3)], after=extract
    )
    report = wf.step("report", "command", TRUE, after=parts, priority=5)
    wf.chain([("publish", "command", TRUE), ("notify", "command", TRUE)], after=report)
    return wf


async def statuses(db: StateDB, ids: dict[str, str]) -> dict[str, str]:
    return {name: (await taskward.get_task(db, i))["status"] for name, i in ids.items()}


async def test_a_workflow_is_admitted_in_one_call_with_derived_keys(db: StateDB) -> None:
    ids = await diamond().submit(db, registry=REGISTRY, now=T0)
    assert list(ids) == ["extract", "part-0", "part-1", "part-2", "report", "publish", "notify"]
    assert await statuses(db, ids) == {
        "extract": "queued",
        **{f"part-{i}": "waiting_dependency" for i in range(3)},
        "report": "waiting_dependency",
        "publish": "waiting_dependency",
        "notify": "waiting_dependency",
    }
    report = await taskward.get_task(db, ids["report"])
    assert (report["idempotency_key"], report["priority"]) == ("wf-1/report", 5)
    parents = (await taskward.task_dependencies(db, ids["report"]))["parents"]
    assert sorted(p["id"] for p in parents) == sorted(ids[f"part-{i}"] for i in range(3))
    notify_parents = (await taskward.task_dependencies(db, ids["notify"]))["parents"]
    assert [p["id"] for p in notify_parents] == [ids["publish"]]


async def test_resubmitting_the_workflow_returns_the_same_ids_and_writes_nothing(
    db: StateDB,
) -> None:
    first = await diamond().submit(db, registry=REGISTRY, now=T0)
    facts = {n: len(await taskward.list_transitions(db, i)) for n, i in first.items()}
    again = await diamond().submit(db, registry=REGISTRY, now=T0 + 60)
    assert again == first
    assert {n: len(await taskward.list_transitions(db, i)) for n, i in again.items()} == facts


async def test_a_changed_step_conflicts_and_the_whole_call_writes_nothing(db: StateDB) -> None:
    await diamond().submit(db, registry=REGISTRY, now=T0)
    other = Workflow("wf-1")
    other.step("extract", "command", {"argv": ["echo", "changed"]})
    other.step("extra", "command", TRUE)
    with pytest.raises(TaskIdempotencyConflict) as raised:
        await other.submit(db, registry=REGISTRY, now=T0)
    assert "wf-1/extract" in str(raised.value)
    # "extra" was in the refused call's first layer: not stored
    assert await db.fetchone("run_get_by_key", {"idempotency_key": "wf-1/extra"}) is None


async def test_an_invalid_step_is_named_before_anything_is_written(db: StateDB) -> None:
    wf = Workflow("wf-bad")
    first = wf.step("fine", "command", TRUE)
    wf.step("broken", "command", {"argv": "not a list"}, after=first)
    with pytest.raises(TaskValidationError) as raised:
        await wf.submit(db, registry=REGISTRY, now=T0)
    assert "step 'broken'" in str(raised.value)
    assert await db.fetchone("run_get_by_key", {"idempotency_key": "wf-bad/fine"}) is None


@pytest.mark.parametrize(
    ("name", "changes"),
    [
        ("a/b", {}),
        ("", {}),
        (" x", {}),
        ("x" * 101, {}),
        ("ok", {"idempotency_key": "mine"}),
        ("ok", {"depends_on": ["x"]}),
    ],
)
def test_a_bad_step_is_refused_when_added(name: str, changes: dict[str, object]) -> None:
    wf = Workflow("wf")
    with pytest.raises(TaskValidationError):
        wf.step(name, "command", TRUE, **changes)


def test_a_step_name_is_unique_and_after_names_added_steps() -> None:
    wf = Workflow("wf")
    wf.step("a", "command", TRUE)
    with pytest.raises(TaskValidationError):
        wf.step("a", "command", TRUE)
    with pytest.raises(TaskValidationError):
        wf.step("b", "command", TRUE, after=taskward.Step("elsewhere"))


async def test_a_step_may_run_after_an_existing_task(db: StateDB) -> None:
    outside = await submit(db, now=T0)
    wf = Workflow("wf-ext")
    wf.step("after-outside", "command", TRUE, after=outside)
    ids = await wf.submit(db, registry=REGISTRY, now=T0)
    assert await statuses(db, ids) == {"after-outside": "waiting_dependency"}
    await move(db, outside, "queued", "running", "completed", now=T0 + 1)
    assert await statuses(db, ids) == {"after-outside": "queued"}


async def test_a_failed_step_skips_everything_after_it(db: StateDB) -> None:
    ids = await diamond("wf-fail").submit(db, registry=REGISTRY, now=T0)
    await move(db, ids["extract"], "queued", "running", "completed", now=T0 + 1)
    await move(db, ids["part-1"], "queued", "running", "failed", now=T0 + 2)
    after = await statuses(db, ids)
    assert after["part-0"] == after["part-2"] == "queued"
    assert after["report"] == after["publish"] == after["notify"] == "skipped"
