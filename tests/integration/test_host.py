"""LocalTaskSource, LocalSummaryStore and the resident host over a real store (ADR-0037 D2-D5,
R4-R6, R10), on both backends, beyond the ten conformance cases. Time is injected where a lease
must lapse; waits poll a condition, never a fixed sleep."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import taskward
from taskward import Actor, TaskExecutionResult
from taskward.adapters import AdapterConfig, build_registry
from taskward.claims import WorkerSpec
from taskward.execution import RetryPolicy
from taskward.host import (
    AdapterRunner,
    LocalSummaryStore,
    LocalTaskSource,
    ResidentEngineHost,
    SessionSummary,
    SummaryConflict,
    Task,
    TaskAck,
    TaskFailure,
    TaskResult,
    TaskSession,
    resolve_manifest,
)
from taskward.host.engine_host import manifest_ref_for, session_key_for
from taskward.host.summaries import _write_summaries
from taskward.maintenance.reaper import promote_due_retries, reap_expired_leases
from taskward.reads import count_by_status
from taskward.registry import CancellationToken, TaskAdapterRegistry
from taskward.runtime import EXIT_MEMORY_PRESSURE, EXIT_OK, WorkerConfig, WorkerRuntime
from taskward.settings import set_max_attempts
from taskward.store.port import StateDB
from taskward.testing import wait_until
from tests.integration.helpers import lapse_lease

from .helpers import Turns

MODULE = "tests.integration.worker_tasks"
REGISTRY = build_registry(AdapterConfig(command_allowlist=frozenset({"false", "true"})))
IMMEDIATE = RetryPolicy(base_s=0.0, jitter=0.0)
ACCEPTED = TaskAck(applied=True)
STALE = TaskAck(applied=False, rejection="stale_lease")
MISSING = TaskAck(applied=False, rejection="missing_holder")
OPERATOR = Actor(type="operator", id="test")


async def submit(
    db: StateDB,
    args: dict[str, Any] | None = None,
    *,
    kind: str = "command",
    registry: TaskAdapterRegistry = REGISTRY,
) -> str:
    app = taskward.TaskApplication(
        action_kind=kind,
        args=args if args is not None else {"argv": ["true"]},
        execution_target="host",
        idempotency_key=f"k-{uuid.uuid4()}",
    )
    return await taskward.submit_task(db, app, registry=registry)


# Every test here runs twice: with the host's two-step finish (SummaryStore.write, then
# complete, then a claim by the serve loop) and with LocalTaskSource's one-step finish
# (complete_with_summary: all three in one transaction), which ``taskward worker`` uses.
FINISH = {"one_step": False}


@pytest.fixture(autouse=True, params=["two_steps", "one_step"])
def finish_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    FINISH["one_step"] = request.param == "one_step"
    yield str(request.param)
    FINISH["one_step"] = False


def source(
    db: StateDB,
    worker_id: str = "host:aaaaaaaa",
    *,
    cwd: Path | None = None,
    registry: TaskAdapterRegistry = REGISTRY,
    one_step: bool | None = None,
) -> LocalTaskSource:
    spec = WorkerSpec(worker_id=worker_id, kinds=registry.kinds(), lease_ttl=20.0)
    one_step = FINISH["one_step"] if one_step is None else one_step
    summaries = LocalSummaryStore(db) if one_step else None
    return LocalTaskSource(db, spec, retry_policy=IMMEDIATE, cwd=cwd, summaries=summaries)


def summaries_of(src: LocalTaskSource, db: StateDB) -> LocalSummaryStore:
    """The source's own summary store (one-step finish), else a separate one."""
    own = src.summary_store
    return own if own is not None else LocalSummaryStore(db)


def host(
    src: LocalTaskSource,
    db: StateDB,
    run_task: Callable[[Task, Any], Awaitable[dict[str, Any]]],
    *,
    max_concurrent_tasks: int = 2,
    session_factory: Callable[[], Any] = TaskSession,
) -> ResidentEngineHost:
    return ResidentEngineHost(
        source=src,
        summaries=summaries_of(src, db),
        max_concurrent_tasks=max_concurrent_tasks,
        session_factory=session_factory,
        run_task=run_task,
        idle_wait_s=0.02,
    )


@asynccontextmanager
async def serving(h: ResidentEngineHost) -> AsyncIterator[asyncio.Task[None]]:
    serve = asyncio.ensure_future(h.serve())
    try:
        yield serve
    finally:
        h.stop_claiming("test finished")
        await asyncio.wait_for(serve, 10)


async def status(db: StateDB, task_id: str) -> str:
    return str((await taskward.get_task(db, task_id))["status"])


async def statuses(db: StateDB, task_id: str) -> list[str]:
    return [f["status"] for f in await taskward.list_transitions(db, task_id)]


def is_status(db: StateDB, task_id: str, *wanted: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await status(db, task_id) in wanted

    return check


def result_for(task: Task) -> TaskResult:
    key = session_key_for(task)
    return TaskResult(run_id=key, status="completed", summary_ref=key)


async def claim(src: LocalTaskSource) -> Task:
    task = await src.claim()
    assert task is not None
    return task


async def lapse_and_reap(db: StateDB, task_id: str) -> None:
    """A crashed owner's lease runs out now and the reaper requeues the task at once (on the
    store's clock: ``helpers.lapse_lease``)."""
    await lapse_lease(db, task_id)
    counts = await reap_expired_leases(db, retry_policy=IMMEDIATE)
    assert (counts["retry_wait"], counts["queued"]) == (1, 1), counts


async def _forever(task: Task, session: Any) -> dict[str, Any]:
    await asyncio.Event().wait()
    return {}


async def _ok(task: Task, session: Any) -> dict[str, Any]:
    return {}


# -- claiming -----------------------------------------------------------------------------


async def test_claim_returns_none_when_empty_and_does_not_block(db: StateDB) -> None:
    started = time.monotonic()
    assert await asyncio.wait_for(source(db).claim(), 2) is None
    assert time.monotonic() - started < 1.0


async def test_a_claimed_task_maps_the_row_as_r10_says(db: StateDB, tmp_path: Path) -> None:
    args = {"argv": ["true"], "objective": "summarise the logs", "cwd": str(tmp_path)}
    task_id = await submit(db, {**args, "timeout_s": 42})
    before = await db.now()
    task = await claim(source(db, cwd=Path("/srv/elsewhere")))
    row = await taskward.get_task(db, task_id)
    assert (task.id, task.objective, task.cwd) == (task_id, "summarise the logs", tmp_path)
    assert task.deadline == datetime.fromtimestamp(row["deadline_at"], UTC)
    assert task.lease_expires_at == datetime.fromtimestamp(row["lease_expires_at"], UTC)
    assert row["deadline_at"] - before == pytest.approx(42, abs=5)
    assert task.attempt == row["lease_attempts"] == 1
    assert task.lease_id == f"{row['leased_by']}/{row['lease_attempts']}" == "host:aaaaaaaa/1"
    assert session_key_for(task) == f"{task_id}:1"


@pytest.mark.parametrize("objective", [None, "", "   ", 7])
async def test_a_missing_or_blank_objective_becomes_kind_and_id_and_cwd_the_workers(
    db: StateDB, objective: object
) -> None:
    args: dict[str, Any] = {"argv": ["true"]}
    if objective is not None:
        args["objective"] = objective
    task_id = await submit(db, args)
    task = await claim(source(db))
    assert task.objective == f"command {task_id}"
    assert task.cwd == Path(os.getcwd())


async def test_attempt_and_session_key_follow_a_reclaim(db: StateDB) -> None:
    task_id = await submit(db)
    first = await claim(source(db, "host:aaaaaaaa"))
    await lapse_and_reap(db, task_id)
    second = await claim(source(db, "host:bbbbbbbb"))
    assert (second.attempt, second.lease_id) == (2, "host:bbbbbbbb/2")
    assert session_key_for(first) != session_key_for(second) == f"{task_id}:2"


async def test_tasks_at_the_ceiling_are_never_claimed(db: StateDB) -> None:
    await set_max_attempts(db, 2)
    task_id = await submit(db)
    src = source(db)
    for attempt in (1, 2):
        task = await claim(src)
        assert task.attempt == attempt
        failure = TaskFailure(code="flow_failed", detail="again", retryable=True)
        await src.fail(task.id, task.lease_id, failure)
        await promote_due_retries(db)
    assert await status(db, task_id) == "failed"
    # R18: the row keeps the ceiling of its admission, so lowering the queue's to the row's
    # attempts strands nothing: it is claimed again and dead-lettered at its own ceiling
    other = await submit(db)
    task = await claim(src)
    assert task.id == other
    failure = TaskFailure(code="flow_failed", detail="x", retryable=True)
    assert await src.fail(task.id, task.lease_id, failure) == ACCEPTED
    await set_max_attempts(db, 1)
    await promote_due_retries(db)
    assert await status(db, other) == "queued"
    task = await claim(src)
    assert (task.id, task.attempt) == (other, 2)
    at_ceiling = TaskAck(applied=True, rejection="attempt_ceiling")
    assert await src.fail(task.id, task.lease_id, failure) == at_ceiling
    assert await status(db, other) == "failed"
    assert await src.claim() is None


# -- acknowledgements -------------------------------------------------------------------------


async def test_an_unknown_or_never_leased_task_is_missing_holder(db: StateDB) -> None:
    src = source(db)
    failure = TaskFailure(code="flow_failed", detail="x", retryable=False)
    assert await src.fail("no-such-task", "host:aaaaaaaa/1", failure) == MISSING
    queued = await submit(db)
    result = TaskResult(run_id=f"{queued}:1", status="completed", summary_ref=f"{queued}:1")
    assert await src.complete(queued, "host:aaaaaaaa/1", result) == MISSING
    assert await src.fail(queued, "garbage", failure) == MISSING
    assert await statuses(db, queued) == []


@pytest.mark.parametrize(
    "presented",
    ["host:bbbbbbbb/1", "host:aaaaaaaa/2", "host:aaaaaaaa/0", "host:aaaaaaaa", "/1", "nonsense"],
)
async def test_a_mismatched_lease_id_is_stale_lease(db: StateDB, presented: str) -> None:
    task_id = await submit(db)
    src = source(db)
    task = await claim(src)
    assert await src.complete(task_id, presented, result_for(task)) == STALE
    failure = TaskFailure(code="flow_failed", detail="x", retryable=True)
    assert await source(db, "host:bbbbbbbb").fail(task_id, presented, failure) == STALE
    assert await statuses(db, task_id) == ["running"]
    # R4: database state decides, so the current lease applies even through another source
    assert await source(db, "host:cccccccc").complete(task_id, task.lease_id, result_for(task)) == (
        ACCEPTED
    )


async def test_a_different_payload_after_a_terminal_ack_is_stale_lease(db: StateDB) -> None:
    done_id, failed_id = await submit(db), await submit(db)
    src = source(db)
    done, failed = await claim(src), await claim(src)
    assert await src.complete(done.id, done.lease_id, result_for(done)) == ACCEPTED
    other = TaskResult(run_id="another-run", status="completed", summary_ref="elsewhere")
    assert await src.complete(done.id, done.lease_id, other) == STALE
    failure = TaskFailure(code="flow_failed", detail="first", retryable=False)
    assert await src.fail(failed.id, failed.lease_id, failure) == ACCEPTED
    changed = TaskFailure(code="flow_failed", detail="second", retryable=False)
    assert await src.fail(failed.id, failed.lease_id, changed) == STALE
    # the same through a new source, which has no memory of the first acknowledgement
    assert await source(db, "host:bbbbbbbb").complete(done.id, done.lease_id, other) == STALE
    assert await source(db, "host:bbbbbbbb").fail(failed.id, failed.lease_id, changed) == STALE
    assert await statuses(db, done_id) == ["running", "completed"]
    assert await statuses(db, failed_id) == ["running", "failed"]


async def test_an_exact_replay_returns_the_same_ack_without_a_second_fact(db: StateDB) -> None:
    done_id, failed_id = await submit(db), await submit(db)
    src = source(db)
    done, failed = await claim(src), await claim(src)
    failure = TaskFailure(code="flow_failed", detail="retry me", retryable=True)
    first_done = await src.complete(done.id, done.lease_id, result_for(done))
    first_failed = await src.fail(failed.id, failed.lease_id, failure)
    assert first_done == first_failed == ACCEPTED
    events = {t: len(await taskward.list_task_events(db, t)) for t in (done_id, failed_id)}
    for replayer in (src, source(db, "host:bbbbbbbb")):
        assert await replayer.complete(done.id, done.lease_id, result_for(done)) == first_done
        assert await replayer.fail(failed.id, failed.lease_id, failure) == first_failed
    assert await statuses(db, done_id) == ["running", "completed"]
    assert await statuses(db, failed_id) == ["running", "retry_wait"]
    assert {t: len(await taskward.list_task_events(db, t)) for t in events} == events


async def test_a_retryable_failure_at_the_ceiling_is_applied_and_reports_the_ceiling(
    db: StateDB,
) -> None:
    await set_max_attempts(db, 1)
    failed_id, timed_id = await submit(db), await submit(db)
    src = source(db)
    failed, timed = await claim(src), await claim(src)
    flow = TaskFailure(code="flow_failed", detail="transient", retryable=True)
    deadline = TaskFailure(code="deadline", detail="watchdog", retryable=True)
    ceiling = TaskAck(applied=True, rejection="attempt_ceiling")
    assert await src.fail(failed.id, failed.lease_id, flow) == ceiling
    assert await src.fail(timed.id, timed.lease_id, deadline) == ceiling
    for task_id, final in ((failed_id, "failed"), (timed_id, "timed_out")):
        row = await taskward.get_task(db, task_id)
        assert (row["status"], row["status_reason_code"]) == (final, "attempt_ceiling")
        assert row["ended_at"] is not None and row["leased_by"] is not None
        fact = (await taskward.list_transitions(db, task_id))[-1]
        assert fact["metadata"]["attempt_ceiling"] == 1
    assert await src.fail(failed.id, failed.lease_id, flow) == ceiling  # replay


async def test_a_stale_acknowledgement_releases_the_side_channel_entry(db: StateDB) -> None:
    task_id = await submit(db)
    old_src = source(db, "host:aaaaaaaa")
    old = await claim(old_src)
    assert set(old_src.tokens) == {task_id}
    past = (await taskward.get_task(db, task_id))["lease_expires_at"] + 0.001
    await reap_expired_leases(db, now=past, retry_policy=IMMEDIATE)
    assert await old_src.complete(task_id, old.lease_id, result_for(old)) == STALE
    assert old_src.tokens == {}  # no stale token left for the cancellation watcher
    with pytest.raises(KeyError):
        old_src.claimed(task_id)


async def test_a_non_retryable_failure_is_terminal_with_its_code(db: StateDB) -> None:
    task_id = await submit(db)
    src = source(db)
    task = await claim(src)
    failure = TaskFailure(code="invalid_task", detail="cwd is missing", retryable=False)
    assert await src.fail(task.id, task.lease_id, failure) == ACCEPTED
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["status_reason_code"]) == ("failed", "invalid_task")
    assert row["error_detail"] == "cwd is missing"


# -- the host over the local source ---------------------------------------------------------


async def test_the_adapter_result_reaches_the_terminal_transition(db: StateDB) -> None:
    failing = await submit(db, {"argv": ["false"]})
    passing = await submit(db, {"argv": ["true"]})
    src = source(db)
    seen: dict[str, TaskExecutionResult] = {}
    record = src.record_result

    def keep(task_id: str, result: TaskExecutionResult) -> None:
        seen[task_id] = result
        record(task_id, result)

    src.record_result = keep  # type: ignore[method-assign]
    async with serving(host(src, db, AdapterRunner(REGISTRY, src))) as serve:
        await wait_until(is_status(db, failing, "failed"), "false to fail", serving=serve)
        await wait_until(is_status(db, passing, "completed"), "true to complete", serving=serve)

    row = await taskward.get_task(db, failing)
    result = seen[failing]
    assert (row["exit_code"], result.exit_code) == (1, 1)
    assert row["status_reason_code"] == "execution_failed"
    assert row["error_detail"] == result.error_detail and row["error_detail"]
    assert row["invocation_id"] == result.invocation_id
    fact = (await taskward.list_transitions(db, failing))[-1]
    assert fact["evidence_refs"] == result.evidence_refs
    assert any(ref.get("kind") == "process" for ref in fact["evidence_refs"])

    row = await taskward.get_task(db, passing)
    assert row["exit_code"] == 0 and row["invocation_id"] == seen[passing].invocation_id
    fact = (await taskward.list_transitions(db, passing))[-1]
    key = f"{passing}:1"
    assert fact["evidence_refs"] == [
        *seen[passing].evidence_refs,
        {"kind": "summary", "session_key": key},
    ]
    summary = await LocalSummaryStore(db).get(key)
    assert summary is not None and summary["state"] == "complete"
    assert summary["summary"]["facts"]["operation_statuses"] == {"command": "completed"}
    # The host's facts are of the shape summary_json splices (its fast path, every task).
    from taskward.host.summaries import _host_facts_json

    assert _host_facts_json(summary["summary"]["facts"]) is not None


async def test_a_timeout_error_raised_by_the_flow_is_a_flow_failure_not_a_deadline(
    db: StateDB,
) -> None:
    task_id = await submit(db)

    async def run_task(task: Task, session: Any) -> dict[str, Any]:
        raise TimeoutError("the provider timed out")

    async with serving(host(source(db), db, run_task)) as serve:
        await wait_until(is_status(db, task_id, "retry_wait"), "the failure", serving=serve)
    row = await taskward.get_task(db, task_id)
    assert row["status_reason_code"] == "retryable_failure"
    assert "flow_failed: TimeoutError: the provider timed out" in row["status_reason_summary"]
    pending = await LocalSummaryStore(db).get(f"{task_id}:1")
    assert pending is not None and pending["reason"].startswith("flow_failed")


async def test_the_watchdog_reports_a_deadline_and_cancels_the_flow(db: StateDB) -> None:
    task_id = await submit(db, {"argv": ["true"], "timeout_s": 0.2})
    cleaned: list[str] = []

    async def run_task(task: Task, session: Any) -> dict[str, Any]:
        try:
            return await _forever(task, session)
        except asyncio.CancelledError:
            cleaned.append(task.id)
            raise

    async with serving(host(source(db), db, run_task)) as serve:
        await wait_until(is_status(db, task_id, "retry_wait"), "the deadline", serving=serve)
    row = await taskward.get_task(db, task_id)
    assert row["status_reason_code"] == "deadline_exceeded" and cleaned == [task_id]


async def test_drain_waits_for_a_claim_already_in_flight(db: StateDB) -> None:
    task_id = await submit(db)
    inner = source(db)
    in_flight, release = asyncio.Event(), asyncio.Event()

    class SlowClaims:
        """Ports only: a claim that is still on its way when drain() is called."""

        async def claim(self) -> Task | None:
            in_flight.set()
            await release.wait()
            return await inner.claim()

        async def complete(self, task_id: str, lease_id: str, result: TaskResult) -> TaskAck:
            return await inner.complete(task_id, lease_id, result)

        async def fail(self, task_id: str, lease_id: str, failure: TaskFailure) -> TaskAck:
            return await inner.fail(task_id, lease_id, failure)

    h = ResidentEngineHost(
        source=SlowClaims(),
        summaries=LocalSummaryStore(db),
        max_concurrent_tasks=1,
        session_factory=TaskSession,
        run_task=_ok,
        idle_wait_s=0.02,
    )
    serve = asyncio.ensure_future(h.serve())
    await asyncio.wait_for(in_flight.wait(), 5)
    drain = asyncio.ensure_future(h.drain())
    done, _ = await asyncio.wait({drain}, timeout=0.1)
    assert not done  # the claim may still hand the host a lease
    release.set()
    await asyncio.wait_for(drain, 5)
    assert await status(db, task_id) == "completed"  # settled before drain() returned
    await asyncio.wait_for(serve, 5)


class WatchedSource(LocalTaskSource):
    """A LocalTaskSource that notes the loop turn of each claim and each idle wait."""

    turns: Turns
    claims: list[int]
    waits: list[int]

    async def claim_many(self, limit: int) -> list[Task]:
        self.claims.append(self.turns.count)
        return await super().claim_many(limit)

    def wait_for_work(self, wait_s: float) -> asyncio.Future[bool]:
        self.waits.append(self.turns.count)
        return super().wait_for_work(wait_s)


def watched(db: StateDB, turns: Turns, registry: TaskAdapterRegistry = REGISTRY) -> WatchedSource:
    spec = WorkerSpec(worker_id="host:aaaaaaaa", kinds=registry.kinds(), lease_ttl=20.0)
    summaries = LocalSummaryStore(db) if FINISH["one_step"] else None
    src = WatchedSource(db, spec, retry_policy=IMMEDIATE, summaries=summaries)
    src.turns, src.claims, src.waits = turns, [], []
    return src


async def test_an_idle_host_claims_in_the_loop_turn_after_a_wake_up(db: StateDB) -> None:
    """The pickup path of an idle worker: the store's wake-up resolves the future the host
    awaits, and the claim starts at the next turn (issue 7: it took five or more, through a
    task per waiter, ``asyncio.wait`` and a gather of the cancelled waiters)."""
    turns = Turns()
    src = watched(db, turns)
    h = host(src, db, _ok)
    h.idle_wait_s = 60.0  # the bound never ends these waits
    try:
        async with serving(h) as serve:
            for round_ in range(1, 4):

                async def idle(round_: int = round_) -> bool:  # claimed, found nothing, waits
                    # (PostgreSQL's listener wakes the host once more as it connects)
                    return len(src.waits) == len(src.claims) >= round_

                await wait_until(idle, "the host idle", serving=serve)
                claims, woken_at = len(src.claims), turns.count
                db.wake("queued")

                async def claimed(claims: int = claims) -> bool:
                    return len(src.claims) > claims

                await wait_until(claimed, "a claim after the wake-up", serving=serve)
                assert src.claims[claims] - woken_at <= 2
    finally:
        turns.stop()


class CoroutineWaits(WatchedSource):
    """A source whose wait for work is a coroutine, not a future (the host runs it as a task)."""

    async def wait_for_work(self, wait_s: float) -> bool:  # type: ignore[override]
        return await super().wait_for_work(wait_s)


async def test_an_idle_host_is_woken_by_a_coroutine_wait_for_work(db: StateDB) -> None:
    turns = Turns()
    spec = WorkerSpec(worker_id="host:aaaaaaaa", kinds=REGISTRY.kinds(), lease_ttl=20.0)
    src = CoroutineWaits(db, spec, retry_policy=IMMEDIATE)
    src.turns, src.claims, src.waits = turns, [], []
    h = host(src, db, _ok)
    h.idle_wait_s = 60.0  # only the wake-up can end this wait in time
    try:
        async with serving(h) as serve:

            async def idle() -> bool:
                return len(src.waits) == len(src.claims) >= 1

            await wait_until(idle, "the host idle", serving=serve)
            task_id = await submit(db)  # the admission wakes this process's waiters
            await wait_until(is_status(db, task_id, "completed"), "completion", serving=serve)
    finally:
        turns.stop()


async def test_a_job_ending_does_not_make_an_idle_host_claim_again(db: StateDB) -> None:
    """A freed slot ends only a wait for a slot: an idle host (a free slot, no work) waits for
    the store's wake-up, not for its jobs, so it sends no empty claims as they finish."""
    registry, gate = gate_registry()
    task_id = await submit(db, {}, kind="gate", registry=registry)
    turns = Turns()
    src = watched(db, turns, registry)
    h = host(src, db, AdapterRunner(registry, src))
    h.idle_wait_s = 60.0
    try:
        async with serving(h) as serve:

            async def idle_with_the_gate_running() -> bool:
                return bool(gate.started) and len(src.waits) >= 1 and h.active_count == 1

            await wait_until(idle_with_the_gate_running, "the gate running", serving=serve)
            claims = len(src.claims)
            gate.release.set()
            await wait_until(is_status(db, task_id, "completed"), "completion", serving=serve)

            async def settled() -> bool:
                return h.active_count == 0

            await wait_until(settled, "the job ended", serving=serve)
            for _ in range(20):
                await asyncio.sleep(0)
            assert len(src.claims) == claims
    finally:
        turns.stop()


async def test_a_host_shutdown_is_a_retryable_failure_due_at_once(db: StateDB) -> None:
    task_id = await submit(db)
    src = source(db)
    h = host(src, db, _forever)
    serve = asyncio.ensure_future(h.serve())

    async def running() -> bool:
        return h.active_count == 1

    await wait_until(running, "the task to start", serving=serve)
    serve.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serve
    now = await db.now()
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["status_reason_code"]) == ("retry_wait", "host_shutdown")
    assert now - 5 <= row["retry_at"] <= now
    assert row["leased_by"] is None and row["lease_expires_at"] is None
    assert "cancelled" not in await statuses(db, task_id)
    pending = await LocalSummaryStore(db).get(f"{task_id}:1")
    assert pending is not None and pending["state"] == "pending"
    await promote_due_retries(db)  # due at once
    assert (await claim(src)).attempt == 2


async def test_a_host_shutdown_while_the_summary_is_written_is_a_retryable_failure(
    db: StateDB,
) -> None:
    """R10 during the summary (its narrative, or the two-step write): the run's output is in
    hand but nothing is acknowledged yet, so a shutdown then hands the task back as a
    host-shutdown retry, due at once, instead of leaving it ``running`` until its lease
    expires (the job was cancelled outside every failure report)."""
    task_id = await submit(db)
    src = source(db)
    narrating = asyncio.Event()

    async def summarize(task: Task, session: Any, output: dict[str, Any]) -> str:
        narrating.set()
        await asyncio.Event().wait()  # a narrative that never ends
        return ""

    h = ResidentEngineHost(
        source=src,
        summaries=summaries_of(src, db),
        max_concurrent_tasks=1,
        session_factory=TaskSession,
        run_task=_ok,
        summarize=summarize,
        idle_wait_s=0.02,
    )
    serve = asyncio.ensure_future(h.serve())

    async def summarizing() -> bool:
        return narrating.is_set()

    await wait_until(summarizing, "the summary's narrative to start", serving=serve)
    serve.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serve
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["status_reason_code"]) == ("retry_wait", "host_shutdown")
    assert row["leased_by"] is None
    assert await statuses(db, task_id) == ["running", "retry_wait"]


async def test_a_recorded_cancellation_acknowledged_by_the_adapter_is_cancelled(
    db: StateDB, tmp_path: Path
) -> None:
    registry = build_registry(AdapterConfig(python_modules=frozenset({MODULE}), imports=(MODULE,)))
    marker = tmp_path / "started"
    task_id = await submit(db, {"marker": str(marker)}, kind="until_cancelled", registry=registry)
    config = WorkerConfig(concurrency=2, idle_wait_s=0.02, cancel_poll_s=0.05, reap_interval_s=30)
    runtime = WorkerRuntime(db, registry, config)
    run = asyncio.ensure_future(runtime.run())
    try:

        async def started() -> bool:
            return marker.exists()

        await wait_until(started, "the task to start", serving=run)
        await taskward.request_task_cancel(db, task_id, actor=OPERATOR, idempotency_key="c")
        await wait_until(is_status(db, task_id, "cancelled"), "the cancellation", serving=run)
        runtime.request_stop()
        assert await asyncio.wait_for(run, 10) == EXIT_OK
    finally:
        if not run.done():
            run.cancel()
    row = await taskward.get_task(db, task_id)
    assert row["status_reason_code"] == "cancel_acknowledged"
    assert await statuses(db, task_id) == ["running", "cancelled"]


async def test_the_host_never_holds_more_leases_than_max_concurrent_tasks(db: StateDB) -> None:
    ids = [await submit(db) for _ in range(5)]
    gates = {task_id: asyncio.Event() for task_id in ids}
    started: list[str] = []
    running_seen: list[int] = []

    async def run_task(task: Task, session: Any) -> dict[str, Any]:
        running_seen.append((await count_by_status(db))["running"])
        started.append(task.id)
        await gates[task.id].wait()
        return {}

    h = host(source(db), db, run_task, max_concurrent_tasks=2)
    released: set[str] = set()
    async with serving(h) as serve:
        while len(released) < len(ids):
            expected = min(2, len(ids) - len(released))

            async def active(expected: int = expected) -> bool:
                return len(set(started) - released) == expected

            await wait_until(active, f"{expected} active tasks", serving=serve)
            assert (await count_by_status(db))["running"] == expected == h.active_count
            for task_id in set(started) - released:
                released.add(task_id)
                gates[task_id].set()
        for task_id in ids:
            await wait_until(is_status(db, task_id, "completed"), "completion", serving=serve)
    assert max(running_seen) <= 2
    assert sorted(started) == sorted(ids)


async def test_session_factory_is_called_once_per_valid_task(db: StateDB, tmp_path: Path) -> None:
    valid = [await submit(db) for _ in range(3)]
    invalid = await submit(db, {"argv": ["true"], "cwd": str(tmp_path / "missing")})
    sessions: list[TaskSession] = []
    owners: dict[int, list[str]] = {}

    def factory() -> TaskSession:
        sessions.append(TaskSession())
        return sessions[-1]

    async def run_task(task: Task, session: Any) -> dict[str, Any]:
        owners.setdefault(id(session), []).append(task.id)
        return {}

    async with serving(host(source(db), db, run_task, session_factory=factory)) as serve:
        for task_id in valid:
            await wait_until(is_status(db, task_id, "completed"), "completion", serving=serve)
        await wait_until(is_status(db, invalid, "failed"), "the invalid task", serving=serve)
    assert len(sessions) == 3 and len({id(s) for s in sessions}) == 3
    assert sorted(tid for tids in owners.values() for tid in tids) == sorted(valid)
    assert all(len(tids) == 1 for tids in owners.values())
    assert (await taskward.get_task(db, invalid))["status_reason_code"] == "invalid_task"


async def test_a_task_directory_is_checked_again_once_its_remembered_answer_expires(
    db: StateDB, tmp_path: Path
) -> None:
    """The cwd check remembers a directory that exists for CWD_CHECK_TTL_S, never one that
    does not: a removed directory fails the tasks that reach the host once that time passed."""
    from taskward.host import engine_host

    ttl = engine_host.CWD_CHECK_TTL_S
    h = host(source(db), db, _ok)
    workdir = tmp_path / "work"
    assert not h._cwd_exists(workdir, now=1000.0)  # missing: not remembered
    workdir.mkdir()
    assert h._cwd_exists(workdir, now=1000.0)  # found at once, then remembered
    workdir.rmdir()
    assert h._cwd_exists(workdir, now=1000.0 + ttl / 2)  # within the remembered time
    assert not h._cwd_exists(workdir, now=1000.0 + ttl * 1.5)


async def test_the_manifest_ref_resolves_to_the_row_and_its_facts(db: StateDB) -> None:
    task_id = await submit(db)
    async with serving(host(source(db), db, _ok)) as serve:
        await wait_until(is_status(db, task_id, "completed"), "completion", serving=serve)
    summary = await LocalSummaryStore(db).get(f"{task_id}:1")
    assert summary is not None
    body = summary["summary"]
    ref = body["manifest_ref"]
    assert (summary["task_id"], summary["attempt"]) == (task_id, 1)
    assert body["facts"]["task_id"] == task_id and body["facts"]["run_id"] == f"{task_id}:1"
    manifest = await resolve_manifest(db, ref)
    assert manifest["row"]["id"] == task_id and manifest["row"]["status"] == "completed"
    assert [f["status"] for f in manifest["facts"]] == ["running", "completed"]
    assert manifest["summary"]["session_key"] == f"{task_id}:1"
    assert manifest["lease_id"] == "host:aaaaaaaa/1"
    with pytest.raises(ValueError, match="not a taskward manifest reference"):
        await resolve_manifest(db, "file:///tmp/manifest.json")


async def test_an_earlier_attempts_manifest_names_that_attempts_lease(db: StateDB) -> None:
    task_id = await submit(db)
    first = await claim(source(db, "host:aaaaaaaa"))
    await lapse_and_reap(db, task_id)
    second_src = source(db, "host:bbbbbbbb")
    second = await claim(second_src)
    assert await second_src.complete(task_id, second.lease_id, result_for(second)) == ACCEPTED
    old = await resolve_manifest(db, manifest_ref_for(first))
    new = await resolve_manifest(db, manifest_ref_for(second))
    assert (old["lease_id"], new["lease_id"]) == ("host:aaaaaaaa/1", "host:bbbbbbbb/2")
    assert old["row"]["status"] == "completed" and old["summary"] is None
    never = f"taskward:schedule_runs/{task_id}?attempt=3"
    assert (await resolve_manifest(db, never))["lease_id"] is None


async def test_manifest_ref_names_the_task_and_attempt() -> None:
    now = datetime.now(UTC)
    task = Task(
        id="t-1",
        objective="o",
        cwd=Path("."),
        lease_id="host:a/3",
        lease_expires_at=now,
        attempt=3,
        deadline=now,
    )
    assert manifest_ref_for(task) == "taskward:schedule_runs/t-1?attempt=3"


# -- memory pressure (D5) -------------------------------------------------------------------


class GateAdapter:
    """Runs until released: lets a test hold a task active."""

    action_kind = "gate"

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started: list[str] = []
        self.cancelled: list[str] = []

    def validate_args(self, args: dict[str, Any]) -> None:
        return None

    async def execute(
        self, task: dict[str, Any], *, cancellation: CancellationToken
    ) -> TaskExecutionResult:
        self.started.append(task["id"])
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.append(task["id"])
            raise
        return TaskExecutionResult(status="completed", exit_code=0)


def gate_registry() -> tuple[TaskAdapterRegistry, GateAdapter]:
    registry = build_registry(AdapterConfig(command_allowlist=frozenset({"true"})))
    gate = GateAdapter()
    registry.register(gate)
    return registry, gate


def runtime_config(**changes: Any) -> WorkerConfig:
    values: dict[str, Any] = {
        "concurrency": 2,
        "idle_wait_s": 0.02,
        "cancel_poll_s": 0.05,
        "reap_interval_s": 30.0,
    }
    values.update(changes)
    return WorkerConfig(**values)


async def test_memory_pressure_stops_claiming_and_exits_for_a_restart(db: StateDB) -> None:
    registry, _ = gate_registry()
    task_id = await submit(db, {}, kind="gate", registry=registry)
    runtime = WorkerRuntime(db, registry, runtime_config(memory_limit_mb=1))
    assert await asyncio.wait_for(runtime.run(), 10) == EXIT_MEMORY_PRESSURE == 75
    assert runtime.host.stats.claimed == 0
    assert await status(db, task_id) == "queued"


async def test_memory_pressure_drains_active_tasks_without_cancelling_them(db: StateDB) -> None:
    registry, gate = gate_registry()
    active = await submit(db, {}, kind="gate", registry=registry)
    runtime = WorkerRuntime(db, registry, runtime_config(memory_limit_mb=None))
    run = asyncio.ensure_future(runtime.run())
    try:

        async def started() -> bool:
            return gate.started == [active]

        await wait_until(started, "the gate task to start", serving=run)
        runtime.config.memory_limit_mb = 1  # the resident set is now over the limit

        async def stopped_claiming() -> bool:
            return runtime.host.stats.stop_reason is not None

        await wait_until(stopped_claiming, "claiming to stop", serving=run)
        late = await submit(db, {}, kind="gate", registry=registry)
        assert not run.done()
        gate.release.set()
        assert await asyncio.wait_for(run, 10) == EXIT_MEMORY_PRESSURE
    finally:
        if not run.done():
            run.cancel()
    assert gate.cancelled == []
    assert await status(db, active) == "completed"
    assert await status(db, late) == "queued"
    assert runtime.host.stats.claimed == 1


# -- LocalSummaryStore (D4) -------------------------------------------------------------------


def a_summary(narrative: str | None = None) -> SessionSummary:
    return SessionSummary(
        facts={"task_id": "t", "attempt": 2}, narrative=narrative, manifest_ref="m"
    )


async def test_summary_write_is_idempotent_by_session_key(db: StateDB) -> None:
    store = LocalSummaryStore(db)
    await store.write("t:2", a_summary("n"))
    first = await store.get("t:2")
    await store.write("t:2", a_summary("n"))
    row = await store.get("t:2")
    assert first is not None and row is not None
    assert row["state"] == "complete" and row["summary_hash"] == first["summary_hash"]
    assert (row["task_id"], row["attempt"]) == ("t", 2)
    assert row["summary"] == a_summary("n").model_dump(mode="json")
    assert row["updated_at"] == first["updated_at"]


async def test_a_different_summary_for_a_complete_key_raises_summary_conflict(
    db: StateDB,
) -> None:
    store = LocalSummaryStore(db)
    await store.write("t:2", a_summary("n"))
    with pytest.raises(SummaryConflict, match="t:2"):
        await store.write("t:2", a_summary("other"))
    row = await store.get("t:2")
    assert row is not None and row["summary"]["narrative"] == "n"


async def test_a_batch_of_summaries_answers_each_row_on_its_own(db: StateDB) -> None:
    """The group's combine writes every row with one ``write_many``; when it falls short (some
    row was complete already) each session is judged on its own: new, pending and replayed
    rows are written or equal, a different complete summary is not ours (None)."""
    store = LocalSummaryStore(db)
    await store.write("old:1", a_summary("kept"))
    await store.mark_pending("pend:1", "waiting")
    batch = [
        store.params("new:1", a_summary("fresh")),
        store.params("old:1", a_summary("different")),
        store.params("pend:1", a_summary("done")),
    ]
    async with db.transaction() as tx:
        answers = await _write_summaries(tx, batch)
    assert answers == [{"session_key": "new:1"}, None, {"session_key": "pend:1"}]
    kept, done = await store.get("old:1"), await store.get("pend:1")
    assert kept is not None and kept["summary"]["narrative"] == "kept"
    assert done is not None and (done["state"], done["summary"]["narrative"]) == (
        "complete",
        "done",
    )
    async with db.transaction() as tx:  # all new: the count alone answers
        assert await _write_summaries(tx, [store.params("new:2", a_summary())]) == [
            {"session_key": "new:2"}
        ]


async def test_mark_pending_is_idempotent_and_never_downgrades_complete(db: StateDB) -> None:
    store = LocalSummaryStore(db)
    await store.mark_pending("t:1", "flow_failed: one")
    await store.mark_pending("t:1", "flow_failed: one")
    await store.mark_pending("t:1", "deadline: two")  # the diagnostic reason may change
    row = await store.get("t:1")
    assert row is not None and (row["state"], row["reason"]) == ("pending", "deadline: two")
    assert row["summary"] is None
    await store.write("t:1", a_summary())  # a pending key may still complete
    await store.mark_pending("t:1", "late failure")
    row = await store.get("t:1")
    assert row is not None and row["state"] == "complete" and row["reason"] is None
    assert row["summary"] == a_summary().model_dump(mode="json")


async def test_a_session_key_that_is_not_a_run_id_is_kept_without_task_columns(
    db: StateDB,
) -> None:
    store = LocalSummaryStore(db)
    await store.write("free-form", a_summary())
    row = await store.get("free-form")
    assert row is not None and (row["task_id"], row["attempt"]) == (None, None)
    assert await store.get("never-written") is None


# -- adapter results: their own deadline, and a stale owner's late result -------------------

PYTHONS = build_registry(
    AdapterConfig(
        command_allowlist=frozenset({"true"}),
        python_modules=frozenset({"tests.fixtures.sample_tasks"}),
    )
)


@pytest.mark.parametrize(
    ("retryable", "status_after", "reason"),
    [(False, "timed_out", "deadline_exceeded"), (True, "retry_wait", "deadline_exceeded")],
)
async def test_an_adapters_own_timed_out_is_terminal_unless_it_says_retryable(
    db: StateDB, retryable: bool, status_after: str, reason: str
) -> None:
    # ADR-0072 D4: the adapter's result becomes the one terminal transition; only the
    # watchdog's deadline is retryable by rule (R5, the test above).
    task_id = await submit(
        db,
        {
            "function": "tests.fixtures.sample_tasks:report",
            "kwargs": {"status": "timed_out", "retryable": retryable},
        },
        kind="python",
        registry=PYTHONS,
    )
    src = source(db, registry=PYTHONS)
    async with serving(host(src, db, AdapterRunner(PYTHONS, src))) as serve:
        await wait_until(is_status(db, task_id, status_after), status_after, serving=serve)
    row = await taskward.get_task(db, task_id)
    assert (row["lease_attempts"], row["status_reason_code"]) == (1, reason)
    assert row["exit_code"] == 7 and "reported" in (row["error_detail"] or "")


async def test_a_stale_owners_late_result_is_kept_as_a_stale_result_event(db: StateDB) -> None:
    # ADR-0072 D4: "If the terminal guard loses, the adapter result is retained only as
    # diagnostic evidence" -- on the path ``taskward worker`` takes (host + AdapterRunner).
    task_id = await submit(db, {"argv": ["true"]})
    old_src = source(db, "host:aaaaaaaa")
    gate, started = asyncio.Event(), asyncio.Event()
    runner = AdapterRunner(REGISTRY, old_src)

    async def held(task: Task, session: Any) -> dict[str, Any]:
        started.set()
        await gate.wait()
        return await runner(task, session)

    async with serving(host(old_src, db, held, max_concurrent_tasks=1)) as serve:

        async def running() -> bool:
            return started.is_set()

        await wait_until(running, "the old owner to start", serving=serve)
        # The old owner looks dead: its lease lapses, the reaper requeues, another worker wins.
        await lapse_and_reap(db, task_id)
        new = await claim(source(db, "host:bbbbbbbb"))
        gate.set()

        async def kept() -> bool:
            events = await taskward.list_task_events(db, task_id)
            return any(e["kind"] == "stale_result" for e in events)

        await wait_until(kept, "the stale result event", serving=serve)
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["leased_by"]) == ("running", "host:bbbbbbbb")  # untouched
    [event] = [
        e for e in await taskward.list_task_events(db, task_id) if e["kind"] == "stale_result"
    ]
    assert event["payload"]["lease_id"] == "host:aaaaaaaa/1"
    assert event["payload"]["status"] == "completed" and event["payload"]["exit_code"] == 0
    assert any(ref.get("kind") == "process" for ref in event["payload"]["evidence_refs"])
    assert event["status"] == "running" and new.lease_id == "host:bbbbbbbb/2"
    # a fact per change only: the late result wrote none
    assert await statuses(db, task_id) == ["running", "retry_wait", "queued", "running"]
