"""Dependencies (DESIGN.md R21) on both backends: admission's three outcomes, readiness when a
dependency ends (in its own transaction and by the maintenance pass), the failure cascade,
cancellation, replays, and two dependencies ending at once.

Time is injected (``now=``); nothing sleeps.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

import taskward
from taskward import TaskApplication, TaskIdempotencyConflict, TaskValidationError
from taskward.admission import application_hash_of, validate_application
from taskward.canonical import content_hash
from taskward.checker import assert_invariants
from taskward.claims import WorkerSpec, claim_rows
from taskward.dependencies import task_dependencies
from taskward.fields import MAX_DEPENDENCIES
from taskward.maintenance import DependencyPromoter, Maintenance
from taskward.store.port import StateDB
from tests.integration.helpers import REGISTRY, move, submit

T0 = 1_800_000_000.0
WITH_FALSE = taskward.build_registry(
    taskward.AdapterConfig(command_allowlist=frozenset({"true", "echo", "false"}))
)
OPERATOR = taskward.Actor(type="operator", id="t")


def app(**changes: Any) -> TaskApplication:
    fields: dict[str, Any] = {
        "action_kind": "command",
        "args": {"argv": ["true"]},
        "execution_target": "host",
        "idempotency_key": f"k-{uuid.uuid4()}",
    }
    fields.update(changes)
    return TaskApplication(**fields)


async def status(db: StateDB, task_id: str) -> str:
    return str((await taskward.get_task(db, task_id))["status"])


async def facts(db: StateDB, task_id: str) -> list[tuple[str, str, str]]:
    return [
        (f["previous_status"], f["status"], f["reason_code"])
        for f in await taskward.list_transitions(db, task_id)
    ]


async def events(db: StateDB, task_id: str) -> int:
    return len(await taskward.list_task_events(db, task_id))


# R15: the field and its hash -----------------------------------------------------------------


def test_depends_on_joins_the_hash_sorted_and_de_duplicated() -> None:
    admitted = validate_application(app(idempotency_key="k", depends_on=["b", "a", "b"]), REGISTRY)
    assert admitted.depends_on == ("a", "b")
    expected = {
        "action_kind": "command",
        "args": {"argv": ["true"]},
        "depends_on": ["a", "b"],
        "execution_target": "host",
        "library_content_hash": None,
        "library_ref": None,
        "required_capabilities": [],
    }
    assert admitted.application_hash == content_hash(expected)
    plain = validate_application(app(idempotency_key="k"), REGISTRY)
    assert plain.application_hash == application_hash_of(
        "command", '{"argv":["true"]}', "host", [], None, None
    )


@pytest.mark.parametrize(
    "value",
    [
        "a-task-id",
        [""],
        [7],
        [" padded "],
        ["x" * 65],
        ["line\nbreak"],
        [f"id-{i}" for i in range(MAX_DEPENDENCIES + 1)],
    ],
)
def test_a_bad_depends_on_is_refused_by_name(value: object) -> None:
    with pytest.raises(TaskValidationError) as raised:
        validate_application(app(depends_on=value), REGISTRY)
    assert raised.value.field == "depends_on"
    assert "task ids" in raised.value.allowed


async def test_missing_dependencies_are_listed_and_nothing_is_stored(db: StateDB) -> None:
    real = await submit(db, now=T0)
    before = len(await taskward.list_tasks(db, limit=100))
    with pytest.raises(TaskValidationError) as raised:
        await taskward.submit_task(
            db,
            app(idempotency_key="orphan", depends_on=[real, "nope-1", "nope-2"]),
            registry=REGISTRY,
            now=T0,
        )
    assert raised.value.field == "depends_on"
    assert raised.value.value == ["nope-1", "nope-2"]
    assert "nope-1, nope-2" in str(raised.value)
    assert len(await taskward.list_tasks(db, limit=100)) == before
    assert (await task_dependencies(db, real))["children"] == []
    # the key was not taken: the same key admits once the ids exist
    task_id = await taskward.submit_task(
        db, app(idempotency_key="orphan", depends_on=[real]), registry=REGISTRY, now=T0
    )
    assert await status(db, task_id) == "waiting_dependency"


# R21: the three admission outcomes ------------------------------------------------------------


async def test_pending_dependencies_make_a_waiting_task_with_one_fact_and_one_event(
    db: StateDB,
) -> None:
    a, b = await submit(db, now=T0), await submit(db, now=T0)
    await move(db, a, "queued", "running", "completed", now=T0 + 1)
    task_id = await submit(db, now=T0 + 2, depends_on=[a, b])
    assert await status(db, task_id) == "waiting_dependency"
    [fact] = await taskward.list_transitions(db, task_id)
    assert (fact["previous_status"], fact["status"], fact["reason_code"]) == (
        "queued",
        "waiting_dependency",
        "dependencies_pending",
    )
    assert fact["reason_summary"] == "waiting for 1 of 2 dependencies"
    assert fact["evidence_refs"] == [{"kind": "task", "id": b}]
    assert await events(db, task_id) == 1
    links = await task_dependencies(db, task_id)
    assert [p["id"] for p in links["parents"]] == sorted([a, b])
    assert [c["id"] for c in (await task_dependencies(db, b))["children"]] == [task_id]
    # a waiting task is never claimed
    spec = WorkerSpec(worker_id="host:dep", kinds=("command",), lease_ttl=60.0)
    claimed = await claim_rows(db, spec, limit=10, now=T0 + 3)
    assert [c.lease.task_id for c in claimed] == [b]
    assert await status(db, task_id) == "waiting_dependency"


async def test_completed_dependencies_leave_the_task_queued_with_no_fact(db: StateDB) -> None:
    a = await submit(db, now=T0)
    await move(db, a, "queued", "running", "completed", now=T0 + 1)
    task_id = await submit(db, now=T0 + 2, depends_on=[a])
    assert await status(db, task_id) == "queued"
    assert await facts(db, task_id) == []


@pytest.mark.parametrize("ended", ["failed", "timed_out", "cancelled"])
async def test_a_dependency_ended_otherwise_skips_the_task_at_admission(
    db: StateDB, ended: str
) -> None:
    a = await submit(db, now=T0)
    await move(db, a, "queued", "running", ended, now=T0 + 1)
    task_id = await submit(db, now=T0 + 2, depends_on=[a])
    assert await status(db, task_id) == "skipped"
    [fact] = await taskward.list_transitions(db, task_id)
    assert (fact["previous_status"], fact["status"], fact["reason_code"]) == (
        "queued",
        "skipped",
        "dependency_failed",
    )
    assert fact["evidence_refs"] == [{"kind": "task", "id": a, "status": ended}]
    assert (await taskward.get_task(db, task_id))["ended_at"] == T0 + 2


async def test_a_replayed_key_returns_the_task_and_another_depends_on_conflicts(
    db: StateDB,
) -> None:
    a, b = await submit(db, now=T0), await submit(db, now=T0)
    first = await submit(db, now=T0, idempotency_key="dep-k", depends_on=[a])
    again = await submit(db, now=T0 + 5, idempotency_key="dep-k", depends_on=[a, a])
    assert again == first
    assert len(await facts(db, first)) == 1
    assert len((await task_dependencies(db, a))["children"]) == 1
    with pytest.raises(TaskIdempotencyConflict):
        await submit(db, now=T0, idempotency_key="dep-k", depends_on=[b])
    with pytest.raises(TaskIdempotencyConflict):
        await submit(db, now=T0, idempotency_key="dep-k")


# R21: readiness when a dependency ends ----------------------------------------------------------


async def test_the_last_dependency_completing_queues_the_task_in_its_transaction(
    db: StateDB,
) -> None:
    a, b = await submit(db, now=T0), await submit(db, now=T0)
    task_id = await submit(db, now=T0, depends_on=[a, b])
    await move(db, a, "queued", "running", "completed", now=T0 + 1)
    assert await status(db, task_id) == "waiting_dependency"
    await move(db, b, "queued", "running", "completed", now=T0 + 2)
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["queued_at"]) == ("queued", T0 + 2)
    assert await facts(db, task_id) == [
        ("queued", "waiting_dependency", "dependencies_pending"),
        ("waiting_dependency", "queued", "dependencies_met"),
    ]
    assert await events(db, task_id) == 2
    # nothing left for the maintenance pass
    assert await DependencyPromoter().run_once(db, now=T0 + 3) == {
        "dependencies_met": 0,
        "dependency_failed": 0,
    }


async def test_a_delayed_dependent_keeps_its_run_after_when_its_dependencies_are_met(
    db: StateDB,
) -> None:
    a = await submit(db, now=T0)
    task_id = await submit(db, now=T0, depends_on=[a], run_after=T0 + 100)
    await move(db, a, "queued", "running", "completed", now=T0 + 1)
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["queued_at"]) == ("queued", T0 + 100)


async def test_a_failure_cascades_through_the_chain_in_one_transaction(db: StateDB) -> None:
    a = await submit(db, now=T0)
    b = await submit(db, now=T0, depends_on=[a])
    c = await submit(db, now=T0, depends_on=[b])
    other = await submit(db, now=T0)
    d = await submit(db, now=T0, depends_on=[c, other])
    await move(db, a, "queued", "running", "failed", now=T0 + 1)
    for task_id, cause in ((b, a), (c, b), (d, c)):
        assert await status(db, task_id) == "skipped"
        last = (await taskward.list_transitions(db, task_id))[-1]
        assert (last["previous_status"], last["reason_code"]) == (
            "waiting_dependency",
            "dependency_failed",
        )
        assert last["evidence_refs"][0]["id"] == cause
    assert await status(db, other) == "queued"  # a sibling dependency is not touched


async def test_cancelling_a_waiting_task_skips_its_dependents(db: StateDB) -> None:
    a = await submit(db, now=T0)
    b = await submit(db, now=T0, depends_on=[a])
    c = await submit(db, now=T0, depends_on=[b])
    result = await taskward.request_task_cancel(
        db, b, actor=OPERATOR, idempotency_key="stop-b", now=T0 + 1
    )
    assert (result.state, result.current_status) == ("cancelled", "cancelled")
    assert await facts(db, b) == [
        ("queued", "waiting_dependency", "dependencies_pending"),
        ("waiting_dependency", "cancelled", "cancelled"),
    ]
    assert await status(db, c) == "skipped"
    assert await status(db, a) == "queued"


async def test_cancelling_a_queued_dependency_skips_its_waiting_dependents(db: StateDB) -> None:
    a = await submit(db, now=T0)
    b = await submit(db, now=T0, depends_on=[a])
    await taskward.request_task_cancel(db, a, actor=OPERATOR, idempotency_key="stop-a", now=T0)
    assert await status(db, b) == "skipped"


async def test_a_retried_dependency_keeps_its_dependent_waiting(db: StateDB) -> None:
    a = await submit(db, now=T0)
    b = await submit(db, now=T0, depends_on=[a])
    await move(db, a, "queued", "running", "retry_wait", now=T0 + 1)
    assert await status(db, b) == "waiting_dependency"
    await move(db, a, "retry_wait", "queued", "running", "completed", now=T0 + 2)
    assert await status(db, b) == "queued"


async def test_bulk_admission_links_and_moves_each_new_task(db: StateDB) -> None:
    a = await submit(db, now=T0)
    done = await submit(db, now=T0)
    await move(db, done, "queued", "running", "completed", now=T0)
    ids = await taskward.submit_tasks(
        db,
        [
            app(idempotency_key="bulk-wait", depends_on=[a]),
            app(idempotency_key="bulk-go", depends_on=[done]),
            app(idempotency_key="bulk-plain"),
        ],
        registry=REGISTRY,
        now=T0 + 1,
    )
    assert [await status(db, i) for i in ids] == ["waiting_dependency", "queued", "queued"]
    again = await taskward.submit_tasks(
        db,
        [app(idempotency_key="bulk-wait", depends_on=[a])],
        registry=REGISTRY,
        now=T0 + 2,
    )
    assert again == ids[:1]
    assert len((await task_dependencies(db, a))["children"]) == 1
    with pytest.raises(TaskValidationError):
        await taskward.submit_tasks(
            db,
            [app(idempotency_key="bulk-new"), app(idempotency_key="bulk-bad", depends_on=["x"])],
            registry=REGISTRY,
        )
    # all or nothing: the valid application of the refused call was not stored either
    assert await db.fetchone("run_get_by_key", {"idempotency_key": "bulk-new"}) is None


# the maintenance pass -----------------------------------------------------------------------


async def test_the_maintenance_pass_settles_what_a_terminal_write_did_not(
    db: StateDB,
) -> None:
    a, b = await submit(db, now=T0), await submit(db, now=T0)
    waiting = await submit(db, now=T0, depends_on=[a])
    doomed = await submit(db, now=T0, depends_on=[b])
    after_doomed = await submit(db, now=T0, depends_on=[doomed])
    # Around the one writer, as a terminal write whose settle never committed would leave them
    # (the safety net's case): the statuses change, no dependent moves.
    async with db.transaction() as tx:
        for task_id, new in ((a, "completed"), (b, "failed")):
            changed = await tx.run_update_if(task_id, "queued", {"status": new}, {})
            assert changed is not None
    counts = await Maintenance().run_once(db, now=T0 + 10)
    assert counts["dependencies_met"] == 1
    assert counts["dependency_failed"] == 1  # its cascade is written, not counted
    assert await status(db, waiting) == "queued"
    assert await status(db, doomed) == "skipped"
    assert await status(db, after_doomed) == "skipped"
    assert await DependencyPromoter().run_once(db, now=T0 + 11) == {
        "dependencies_met": 0,
        "dependency_failed": 0,
    }


# R21: two dependencies ending at once ----------------------------------------------------------


async def test_the_last_two_dependencies_completing_at_once_queue_the_dependent_once(
    db: StateDB, db_url: str
) -> None:
    """Two workers (two stores opened on one database, each with its own connections) end a
    task's last two dependencies at the same moment: the dependent is queued exactly once, and
    never left waiting. Without the dependents' lock (``dependents_waiting ... FOR UPDATE``) the
    PostgreSQL case leaves dependents waiting."""
    rounds = 12
    pairs = []
    for _ in range(rounds):
        a, b = await submit(db, now=T0), await submit(db, now=T0)
        await move(db, a, "queued", "running", now=T0)
        await move(db, b, "queued", "running", now=T0)
        pairs.append((a, b, await submit(db, now=T0, depends_on=[a, b])))

    async with taskward.open_db(db_url) as other:
        for a, b, _ in pairs:
            await asyncio.gather(
                move(db, a, "running", "completed"), move(other, b, "running", "completed")
            )
    for _, _, dependent in pairs:
        assert await status(db, dependent) == "queued"
        assert [f[2] for f in await facts(db, dependent)] == [
            "dependencies_pending",
            "dependencies_met",
        ]


# through a worker: the host's terminal writes settle dependents ---------------------------------


async def test_a_worker_drains_a_chain_and_a_fan_in_in_dependency_order(db: StateDB) -> None:
    """The resident host's acknowledgements (``apply`` on SQLite, the one-statement finish on
    PostgreSQL) queue each dependent as its last dependency completes: a burst worker drains
    the whole graph, and every task starts after all of its dependencies ended."""
    from taskward.runtime import WorkerConfig, WorkerRuntime

    a = await submit(db)
    b = await submit(db, depends_on=[a])
    fan = [await submit(db, depends_on=[b]) for _ in range(6)]
    join = await submit(db, depends_on=fan)
    failing = await taskward.submit_task(db, app(args={"argv": ["false"]}), registry=WITH_FALSE)
    never = await submit(db, depends_on=[failing, a])
    config = WorkerConfig(
        concurrency=4,
        idle_wait_s=0.02,
        run_scheduler=False,
        deliver_outbox=False,
        exit_when_idle=True,
        reap_interval_s=3600.0,  # the maintenance pass is not what settles them here
    )
    runtime = WorkerRuntime(db, WITH_FALSE, config)
    assert await asyncio.wait_for(runtime.run(), 120) == 0
    for task_id in (a, b, *fan, join):
        assert await status(db, task_id) == "completed", task_id
    assert await status(db, never) == "skipped"

    async def started(task_id: str) -> float:
        claims = [
            f for f in await taskward.list_transitions(db, task_id) if f["status"] == "running"
        ]
        return float(claims[0]["created_at"])

    async def ended(task_id: str) -> float:
        return float((await taskward.get_task(db, task_id))["ended_at"])

    assert await started(b) >= await ended(a)
    for task_id in fan:
        assert await started(task_id) >= await ended(b)
    assert await started(join) >= max([await ended(t) for t in fan])
    await assert_invariants(db)  # facts, events, summaries, outbox; R21's three checks


async def test_the_sync_client_admits_dependencies_and_workflows(db: StateDB, db_url: str) -> None:
    a = await submit(db, now=T0)

    def scenario() -> tuple[str, str, dict[str, str]]:
        with taskward.SyncClient(db_url, registry=REGISTRY) as client:
            waiting = client.submit_task(app(idempotency_key="sync-dep", depends_on=[a]))
            again = client.submit_task(app(idempotency_key="sync-dep", depends_on=[a]))
            with pytest.raises(TaskValidationError):
                client.submit_task(app(idempotency_key="sync-bad", depends_on=["nope"]))
            wf = taskward.Workflow("sync-wf")
            first = wf.step("first", "command", {"argv": ["true"]})
            wf.step("second", "command", {"argv": ["true"]}, after=first)
            return waiting, again, client.submit_workflow(wf)

    waiting, again, ids = await asyncio.to_thread(scenario)
    assert waiting == again
    assert await status(db, waiting) == "waiting_dependency"
    assert [await status(db, ids[n]) for n in ("first", "second")] == [
        "queued",
        "waiting_dependency",
    ]


async def test_linked_tasks_walks_the_graph_both_ways_and_bounds_it(db: StateDB) -> None:
    a, other = await submit(db, now=T0), await submit(db, now=T0)
    b = await submit(db, now=T0, depends_on=[a])
    c = await submit(db, now=T0, depends_on=[a])
    d = await submit(db, now=T0, depends_on=[b, c, other])
    lonely = await submit(db, now=T0)
    found = await taskward.dependencies.linked_tasks(db, b)
    assert set(found.nodes) == {a, b, c, d, other}
    assert found.edges == {(b, a), (c, a), (d, b), (d, c), (d, other)}
    assert not found.truncated
    assert found.nodes[d]["status"] == "waiting_dependency"
    small = await taskward.dependencies.linked_tasks(db, a, max_nodes=3)
    assert (len(small.nodes), small.truncated) == (3, True)
    assert all(x in small.nodes and y in small.nodes for x, y in small.edges)
    assert set((await taskward.dependencies.linked_tasks(db, lonely)).nodes) == {lonely}
    with pytest.raises(taskward.TaskNotFound):
        await taskward.dependencies.linked_tasks(db, "no-such-task")


async def test_an_operator_retry_of_a_skipped_dependent_runs_now_without_dependencies(
    db: StateDB,
) -> None:
    a = await submit(db, now=T0)
    b = await submit(db, now=T0, depends_on=[a])
    await move(db, a, "queued", "running", "failed", now=T0 + 1)
    assert await status(db, b) == "skipped"
    again = await taskward.retry_task(
        db, b, actor=OPERATOR, idempotency_key="rerun", registry=REGISTRY, now=T0 + 2
    )
    assert await status(db, again) == "queued"
    assert await task_dependencies(db, again) == {"parents": [], "children": []}
