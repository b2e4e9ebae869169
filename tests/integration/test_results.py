"""Stored results and task context (DESIGN.md R22), on both backends: a python function's JSON
return value is written with its completing transition on every completion path, bounded, read
back by ``get_task_result``; one that cannot be stored fails the attempt; a ``TaskContext``
parameter receives the attempt and its dependencies' results."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

import taskward
from taskward.adapters import AdapterConfig, build_registry
from taskward.claims import WorkerSpec, claim_runs
from taskward.execution import RetryPolicy, completion_result, finish_run, outcome_for
from taskward.models import Actor
from taskward.runtime import WorkerConfig, WorkerRuntime
from taskward.store.port import StateDB
from tests.fixtures import result_tasks

MODULE = "tests.fixtures.result_tasks"
REGISTRY = build_registry(AdapterConfig(imports=(MODULE,), python_modules=frozenset({MODULE})))
T0 = 1_000_000.0
WORKER = "host:aaaaaaaa"


async def submit(
    db: StateDB,
    kind: str,
    args: dict[str, Any],
    *,
    now: float = T0,
    depends_on: tuple[str, ...] = (),
) -> str:
    app = taskward.TaskApplication(
        action_kind=kind,
        args=args,
        execution_target="host",
        idempotency_key=f"k-{uuid.uuid4()}",
        depends_on=list(depends_on),
    )
    return await taskward.submit_task(db, app, registry=REGISTRY, now=now)


async def run(db: StateDB, registry: taskward.TaskAdapterRegistry = REGISTRY) -> int:
    """The ADR-0071 worker call: claim, run through the host, acknowledge (group commit)."""
    return await taskward.claim_and_execute(db, worker_id=WORKER, registry=registry, now=T0)


async def result_rows(db: StateDB, task_id: str) -> list[Any]:
    row = await db.fetchone("result_get", {"id": task_id})
    return [] if row is None or row["result"] is None else [row["result"]]


async def test_a_json_return_value_is_stored_with_the_completion_and_read_back(
    db: StateDB,
) -> None:
    value = {"b": [1, 2.5, None, True], "a": 'é漢 "q"', "n": {"deep": []}}
    task_id = await submit(db, "give", {"value": value})
    assert await run(db) == 1
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "completed"
    assert await taskward.get_task_result(db, task_id) == value
    # the exact JSON text, compact, keys in the order returned (the args arrived canonical)
    [text] = await result_rows(db, task_id)
    assert text == '{"a":"é漢 \\"q\\"","b":[1,2.5,null,true],"n":{"deep":[]}}'
    stored = await taskward.results.read_task_result(db, task_id)
    assert (stored.task_id, stored.attempt) == (task_id, 1)


@pytest.mark.parametrize("value", [0, "", [], False, "text", [1, [2]]])
async def test_falsy_and_scalar_values_are_stored_as_returned(db: StateDB, value: Any) -> None:
    task_id = await submit(db, "give", {"value": value})
    await run(db)
    assert await taskward.get_task_result(db, task_id) == value
    assert await result_rows(db, task_id) != []


async def test_none_stores_nothing_and_reads_as_none(db: StateDB) -> None:
    task_id = await submit(db, "nothing", {})
    await run(db)
    assert (await taskward.get_task(db, task_id))["status"] == "completed"
    assert await result_rows(db, task_id) == []
    assert await taskward.get_task_result(db, task_id) is None


async def test_unknown_and_unfinished_tasks_raise_typed_errors(db: StateDB) -> None:
    with pytest.raises(taskward.TaskNotFound):
        await taskward.get_task_result(db, "no-such-task")
    task_id = await submit(db, "give", {"value": 1})
    with pytest.raises(taskward.TaskNotCompleted) as raised:
        await taskward.get_task_result(db, task_id)
    assert (raised.value.task_id, raised.value.status) == (task_id, "queued")
    assert isinstance(raised.value, LookupError)
    assert not isinstance(raised.value, taskward.TaskNotFound)


async def test_a_value_that_is_not_json_fails_the_attempt_and_is_not_retried(
    db: StateDB,
) -> None:
    as_set = await submit(db, "give_set", {"items": [1, 2]})
    nan = await submit(db, "give_nan", {})
    assert await run(db) == 2
    for task_id, type_name in ((as_set, "set"), (nan, "float")):
        row = await taskward.get_task(db, task_id)
        assert (row["status"], row["status_reason_code"]) == ("failed", "result_not_serializable")
        assert f"({type_name})" in row["error_detail"]
        assert "not JSON-serialisable" in row["error_detail"]
        fact = (await taskward.list_transitions(db, task_id))[-1]
        assert fact["reason_code"] == "result_not_serializable"
        assert type_name in fact["reason_summary"]
        assert await result_rows(db, task_id) == []
        with pytest.raises(taskward.TaskNotCompleted) as raised:
            await taskward.get_task_result(db, task_id)
        assert raised.value.status == "failed"
    # give_nan's kind allows 3 attempts: the row is terminal after the first
    assert (await taskward.get_task(db, nan))["lease_attempts"] == 1


async def test_a_value_over_the_configured_bound_fails_naming_size_and_limit(
    db: StateDB,
) -> None:
    small = build_registry(
        AdapterConfig(imports=(MODULE,), python_modules=frozenset({MODULE}), max_result_bytes=100)
    )
    fits = await submit(db, "give_text", {"size": 98})  # 100 bytes of JSON with its quotes
    over = await submit(db, "give_text", {"size": 99})
    assert await run(db, small) == 2
    assert await taskward.get_task_result(db, fits) == "x" * 98
    row = await taskward.get_task(db, over)
    assert (row["status"], row["status_reason_code"]) == ("failed", "result_not_serializable")
    assert "101 bytes" in row["error_detail"] and "limit of 100 bytes" in row["error_detail"]
    assert await result_rows(db, over) == []


def test_the_bound_is_configured_from_the_environment() -> None:
    assert AdapterConfig.from_env({}).max_result_bytes == 1024 * 1024
    assert AdapterConfig.from_env({"TASKWARD_MAX_RESULT_BYTES": "2048"}).max_result_bytes == 2048
    for bad in ("0", "-1", "1.5", "lots", str(64 * 1024 * 1024 + 1)):
        with pytest.raises(taskward.TaskValidationError) as raised:
            AdapterConfig.from_env({"TASKWARD_MAX_RESULT_BYTES": bad})
        assert raised.value.field == "TASKWARD_MAX_RESULT_BYTES"


async def test_the_worker_runtimes_one_step_finish_stores_results(db: StateDB) -> None:
    """``taskward worker``'s runtime finishes with ``complete_with_summary`` (summary,
    completion and next claim in one transaction: on PostgreSQL one round trip with
    ``run_finish_batch``): every result is written there."""
    ids = [await submit(db, "give", {"value": {"n": n}}, now=time.time()) for n in range(12)]
    none_id = await submit(db, "nothing", {}, now=time.time())
    ended = 0
    done = asyncio.Event()

    def on_event(kind: str, *_: Any) -> None:
        nonlocal ended
        if kind == "end":
            ended += 1
            if ended == len(ids) + 1:
                done.set()

    config = WorkerConfig(
        concurrency=8,
        idle_wait_s=0.02,
        reap_interval_s=30.0,
        run_scheduler=False,
        deliver_outbox=False,
    )
    runtime = WorkerRuntime(db, REGISTRY, config, on_event=on_event)
    serving = asyncio.create_task(runtime.run())
    await asyncio.wait_for(done.wait(), 60)
    runtime.drain("test")
    assert await asyncio.wait_for(serving, 60) == 0
    for n, task_id in enumerate(ids):
        assert await taskward.get_task_result(db, task_id) == {"n": n}
    assert await taskward.get_task_result(db, none_id) is None


async def _claimed(db: StateDB, kind: str, args: dict[str, Any]) -> Any:
    task_id = await submit(db, kind, args)
    spec = WorkerSpec(worker_id=WORKER, kinds=REGISTRY.kinds(), execution_targets=["host"])
    [claimed] = await claim_runs(db, spec, limit=1, now=T0)
    return task_id, claimed


def _completed(lease: Any) -> Any:
    result = taskward.TaskExecutionResult(status="completed", exit_code=0, result='{"ok":1}')
    return result, lambda at: outcome_for(
        result, lease, max_attempts=3, cancel_requested=False, now=at, policy=RetryPolicy()
    )


async def test_the_one_transition_path_stores_the_result_only_when_it_applies(
    db: StateDB,
) -> None:
    """``transition_at`` on its own (no group commit): the result goes with the applied
    compare-and-swap; a lost one (a stale owner) writes none."""
    task_id, lease = await _claimed(db, "give", {"value": 1})
    result, outcome = _completed(lease)
    actor = Actor(type="system", id=WORKER)
    done = await finish_run(
        db, lease, outcome, actor=actor, now=T0 + 1, result=completion_result(result)
    )
    assert done.applied
    assert await taskward.get_task_result(db, task_id) == {"ok": 1}
    # the same lease again, under another key: its compare-and-swap loses, nothing written
    again = await finish_run(
        db, lease, outcome, actor=actor, now=T0 + 2, key_suffix="late", result='{"ok":2}'
    )
    assert not again.applied
    assert await taskward.get_task_result(db, task_id) == {"ok": 1}


async def test_a_group_of_completions_that_lose_writes_no_results(db: StateDB) -> None:
    """The set-based path (``apply_built``: ``run_finish_batch`` on PostgreSQL): of a group, the
    completions whose compare-and-swap applied store their results, the stale one none."""
    from taskward.groupcommit import GroupCommit

    first, lease_1 = await _claimed(db, "give", {"value": 1})
    second, lease_2 = await _claimed(db, "give", {"value": 2})
    await taskward.transition_task(  # the second lease is lost: a reaper took the row
        db,
        taskward.TransitionRequest(
            entity_id=second,
            from_state="running",
            to_state="retry_wait",
            reason=taskward.StateReason(code="lease_expired", summary="test"),
            actor=Actor(type="system", id="reaper"),
            idempotency_key="reap",
        ),
        patch={"leased_by": None, "lease_expires_at": None, "retry_at": T0},
        now=T0,
    )
    group = GroupCommit(db)
    actor = Actor(type="system", id=WORKER)
    results = await asyncio.gather(
        *(
            finish_run(db, lease, _completed(lease)[1], actor=actor, group=group, result=f"[{n}]")
            for n, lease in ((1, lease_1), (2, lease_2))
        )
    )
    assert [r.applied for r in results] == [True, False]
    assert await taskward.get_task_result(db, first) == [1]
    assert await result_rows(db, second) == []


async def test_a_task_context_carries_the_attempt_and_its_dependencies_results(
    db: StateDB,
) -> None:
    result_tasks.SEEN.clear()
    a = await submit(db, "give", {"value": {"n": 2}})
    b = await submit(db, "give", {"value": {"n": 5}})
    c = await submit(db, "nothing", {})
    assert await run(db) == 3
    fan = await submit(db, "fan_in", {"label": "all", "timeout_s": 30}, depends_on=[a, b, c])
    alone = await submit(db, "fan_in", {"label": "alone"})
    assert await run(db) == 2
    by_label = {seen["label"]: seen for seen in result_tasks.SEEN}
    seen = by_label["all"]
    assert (seen["task_id"], seen["attempt"], seen["cancelled"]) == (fan, 1, False)
    assert seen["deadline"] == pytest.approx(T0 + 30)
    assert seen["dependency_results"] == {a: {"n": 2}, b: {"n": 5}, c: None}
    assert by_label["alone"]["task_id"] == alone
    assert by_label["alone"]["dependency_results"] == {}
    assert await taskward.get_task_result(db, fan) == {"sum": 7, "label": "all"}


async def test_the_context_parameter_is_not_an_argument(db: StateDB) -> None:
    """Admission neither requires it nor accepts a value for it (R22)."""
    await submit(db, "fan_in", {"label": "x"})
    with pytest.raises(taskward.TaskValidationError) as raised:
        await submit(db, "fan_in", {"label": "x", "ctx": {}})
    assert raised.value.field == "args.ctx"
    with pytest.raises(taskward.TaskValidationError) as missing:
        await submit(db, "fan_in", {})
    assert "parameters: label" in str(missing.value)


async def test_the_sync_client_reads_a_result(db: StateDB, db_url: str) -> None:
    done = await submit(db, "give", {"value": [1, "two"]})
    await run(db)
    queued = await submit(db, "give", {"value": 3})

    def scenario() -> tuple[Any, BaseException, BaseException]:
        with taskward.SyncClient(db_url, registry=REGISTRY) as client:
            value = client.get_task_result(done)
            with pytest.raises(taskward.TaskNotCompleted) as not_completed:
                client.get_task_result(queued)
            with pytest.raises(taskward.TaskNotFound) as not_found:
                client.get_task_result("no-such-task")
            return value, not_completed.value, not_found.value

    value, not_completed, _ = await asyncio.to_thread(scenario)
    assert value == [1, "two"]
    assert isinstance(not_completed, taskward.TaskNotCompleted)
    assert not_completed.status == "queued"


async def test_a_workflows_fan_in_step_receives_its_parents_results_through_a_worker(
    db: StateDB,
) -> None:
    """Issue 26: a workflow (fan-out of three, one fan-in) drained by a burst worker; the
    fan-in's TaskContext holds each parent's stored result, and its own result is stored."""
    result_tasks.SEEN.clear()
    wf = taskward.Workflow("wf-results")
    parts = wf.group([(f"part-{n}", "give", {"value": {"n": n}}) for n in (1, 2, 4)])
    wf.step("sum", "fan_in", {"label": "sum"}, after=parts)
    ids = await wf.submit(db, registry=REGISTRY)
    config = WorkerConfig(
        concurrency=4,
        idle_wait_s=0.02,
        run_scheduler=False,
        deliver_outbox=False,
        exit_when_idle=True,
        reap_interval_s=3600.0,
    )
    assert await asyncio.wait_for(WorkerRuntime(db, REGISTRY, config).run(), 120) == 0
    assert await taskward.get_task_result(db, ids["sum"]) == {"sum": 7, "label": "sum"}
    [seen] = result_tasks.SEEN
    assert seen["dependency_results"] == {ids[f"part-{n}"]: {"n": n} for n in (1, 2, 4)}
