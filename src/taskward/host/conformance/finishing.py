"""Conformance cases six to ten (ADR-0037 D2-D5): summary before completion, a summary
failure, deadlines and crash reclaim, the attempt ceiling, and the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from taskward.host.conformance.harness import (
    ACCEPTED,
    AT_CEILING,
    STALE,
    WAIT_TIMEOUT_S,
    WATCHDOG_TIMEOUT_S,
    CallLog,
    ConformanceFailure,
    ConformanceHarness,
    ConformanceSession,
    RecordingSummaryStore,
    RecordingTaskSource,
    SummaryOutage,
    _ack_calls_settled,
    _check_claimed,
    _expect,
    _expect_status,
    _host,
    _one,
    _result,
    _run_forever,
    _run_ok,
    _serving,
    _stop_after,
    wait_until,
)
from taskward.host.engine_host import session_key_for
from taskward.host.models import SessionSummary, Task


async def summary_written_before_complete(h: ConformanceHarness) -> None:
    """D4: the complete summary is durably written before complete(); a failed narrative is
    best-effort; writes are idempotent by session key and a complete summary never reverts."""
    told = await h.enqueue(objective="with narrative")
    quiet = await h.enqueue(objective="narrative fails")
    log = CallLog()

    async def run_task(task: Task, session: Any) -> dict[str, Any]:
        return {
            "operation_statuses": {"step": "completed"},
            "usage": {"tokens": 3},
            "artifact_refs": [{"kind": "file", "ref": f"{task.id}.txt"}],
        }

    async def summarize(task: Task, session: Any, output: dict[str, Any]) -> str | None:
        if task.objective == "narrative fails":
            raise RuntimeError("the narrative turn failed")
        return f"narrative for {task.id}"

    summaries = RecordingSummaryStore(h.summaries, log)
    host = _host(
        RecordingTaskSource(await h.make_source(), log),
        summaries,
        run_task=run_task,
        summarize=summarize,
        should_stop_claiming=_stop_after(log, 2),
    )
    async with _serving(host) as serve:
        await wait_until(
            lambda: _ack_calls_settled(log, [told, quiet]), "both completions", serving=serve
        )
    claims = {t.id: t for t in log.claimed()}
    for task_id, narrative in ((told, f"narrative for {told}"), (quiet, None)):
        task = claims[task_id]
        key = session_key_for(task)
        writes, completes = log.of("write", key), log.of("complete", task_id)
        _expect(len(writes) == 1 and len(completes) == 1, f"task {task_id}: {log.calls!r}")
        write, complete = writes[0], completes[0]
        _expect(write.error is None, f"task {task_id}: summary write raised {write.error!r}")
        _expect(
            write.ended_seq is not None and write.ended_seq < complete.seq,
            f"task {task_id}: complete() started before the summary write returned (D4)",
        )
        _expect(complete.outcome == ACCEPTED, f"task {task_id}: complete() -> {complete.outcome}")
        _expect(complete.payload.run_id == key, f"task {task_id}: run_id is not the session key")
        summary: SessionSummary = write.payload
        _expect(
            summary.facts.get("task_id") == task_id
            and summary.facts.get("attempt") == task.attempt
            and summary.facts.get("usage") == {"tokens": 3},
            f"task {task_id}: facts {summary.facts!r} are not the host-authored facts (D4)",
        )
        _expect(bool(summary.manifest_ref), f"task {task_id}: empty manifest_ref")
        _expect(summary.narrative == narrative, f"task {task_id}: narrative {summary.narrative!r}")
        _expect(not log.of("mark_pending", key), f"task {task_id}: a completed run was pending")
        _expect(await h.summary_state(key) == "complete", f"task {task_id}: summary not complete")
        await _expect_status(h, task_id, "completed", "the summary was written")

        await h.summaries.write(key, summary)  # an exact replay succeeds
        try:
            await h.summaries.write(key, summary.model_copy(update={"narrative": "rewritten"}))
        except Exception:
            pass
        else:
            raise ConformanceFailure(f"{key}: a different summary for a complete key was kept")
        await h.summaries.mark_pending(key, "late failure report")
        _expect(await h.summary_state(key) == "complete", f"{key}: mark_pending reverted it (D4)")


async def summary_failure_is_pending_and_failed_never_completed(h: ConformanceHarness) -> None:
    """D4: a summary outage or a flow failure marks the summary pending, then fails the task;
    nothing is completed and no partial summary is written as complete."""
    await h.set_ceiling(3)
    outage = await h.enqueue(objective="summary outage")
    broken = await h.enqueue(objective="flow fails")
    log = CallLog()

    async def run_task(task: Task, session: Any) -> dict[str, Any]:
        if task.objective == "flow fails":
            raise RuntimeError("the flow exploded")
        return {"operation_statuses": {"step": "completed"}}

    host = _host(
        RecordingTaskSource(await h.make_source(), log),
        RecordingSummaryStore(h.summaries, log, fail_writes=True),
        run_task=run_task,
        should_stop_claiming=_stop_after(log, 2),
    )
    async with _serving(host) as serve:
        await wait_until(
            lambda: _ack_calls_settled(log, [outage, broken]), "both failures", serving=serve
        )
    _expect(not log.of("complete"), "a task was completed although its summary failed (D4)")
    claims = {t.id: t for t in log.claimed()}
    for task_id, code in ((outage, "summary_failed"), (broken, "flow_failed")):
        key = session_key_for(claims[task_id])
        pending = _one(log.of("mark_pending", key), f"mark_pending of {key}")
        fail = _one(log.of("fail", task_id), f"fail of {task_id}")
        _expect(
            fail.payload.code == code and fail.payload.retryable,
            f"task {task_id}: failed with {fail.payload!r}, expected retryable {code}",
        )
        _expect(
            pending.ended_seq is not None and pending.ended_seq < fail.seq,
            f"task {task_id}: fail() started before mark_pending returned (D4)",
        )
        _expect(fail.outcome == ACCEPTED, f"task {task_id}: fail() returned {fail.outcome!r}")
        _expect(await h.summary_state(key) == "pending", f"task {task_id}: summary not pending")
        await _expect_status(h, task_id, "queued", "a retryable failure below the ceiling")
    outage_key = session_key_for(claims[outage])
    write = _one(log.of("write", outage_key), f"write of {outage_key}")
    _expect(isinstance(write.error, SummaryOutage), "the outage write did not fail")
    _expect(not log.of("write", session_key_for(claims[broken])), "a failed flow wrote a summary")


async def deadline_cancellation_and_crash_reclaim(h: ConformanceHarness) -> None:
    """D5: a crashed host's task is reclaimed after lease expiry with attempt + 1; the watchdog
    cancels a run at its deadline and reports a retryable deadline while the lease is valid; a
    task whose deadline already passed fails with deadline before a Session exists."""
    await h.set_ceiling(3)
    crash_id = await h.enqueue(objective="host crashes")
    crashed = await h.make_source()
    lost = _check_claimed(await crashed.claim(), "crashed source")  # never acknowledged
    _expect(lost.id == crash_id, f"claimed {lost.id}, expected {crash_id}")
    await h.expire_lease(crash_id)
    log = CallLog()
    host = _host(
        RecordingTaskSource(await h.make_source(), log),
        RecordingSummaryStore(h.summaries, log),
        run_task=_run_ok,
        should_stop_claiming=_stop_after(log, 1),
    )
    async with _serving(host) as serve:
        await wait_until(lambda: _ack_calls_settled(log, [crash_id]), "recovery", serving=serve)
    _expect(len(log.claimed()) == 1, f"expected one recovery claim, saw {log.claimed()!r}")
    recovered = log.claimed()[0]
    _expect(recovered.attempt == lost.attempt + 1, f"recovered attempt {recovered.attempt}")
    complete = _one(log.of("complete", crash_id), f"complete of {crash_id}")
    _expect(complete.outcome == ACCEPTED, f"recovered completion returned {complete.outcome!r}")
    _expect(
        await h.summary_state(session_key_for(recovered)) == "complete"
        and await h.summary_state(session_key_for(lost)) is None,
        "summaries are not kept per attempt (run id) (D4)",
    )
    late = await crashed.complete(crash_id, lost.lease_id, _result(lost))
    _expect(late == STALE, f"the crashed host's late complete() returned {late!r}")

    slow = await h.enqueue(objective="overruns", timeout_s=WATCHDOG_TIMEOUT_S)
    late_id = await h.enqueue(objective="already late")
    log = CallLog()
    cleaned: list[str] = []
    sessions: list[ConformanceSession] = []

    def session_factory() -> ConformanceSession:
        sessions.append(ConformanceSession())
        return sessions[-1]

    async def run_task(task: Task, session: Any) -> dict[str, Any]:
        try:
            return await _run_forever(task, session)
        except asyncio.CancelledError:
            cleaned.append(task.id)
            raise

    def already_late(task: Task) -> Task:
        if task.id != late_id:
            return task
        return task.model_copy(update={"deadline": datetime.now(UTC) - timedelta(seconds=1)})

    host = _host(
        RecordingTaskSource(await h.make_source(), log, transform=already_late),
        RecordingSummaryStore(h.summaries, log),
        run_task=run_task,
        session_factory=session_factory,
        should_stop_claiming=_stop_after(log, 2),
    )
    started = time.monotonic()
    async with _serving(host) as serve:
        await wait_until(
            lambda: _ack_calls_settled(log, [slow, late_id]), "the deadlines", serving=serve
        )
    _expect(time.monotonic() - started < 2.0, "the watchdog did not fire near the deadline")
    _expect(cleaned == [slow], f"the watchdog did not cancel the run (cleanup ran for {cleaned})")
    _expect(len(sessions) == 1, "a task past its deadline got a Session (D3)")
    claims = {t.id: t for t in log.claimed()}
    for task_id in (slow, late_id):
        fail = _one(log.of("fail", task_id), f"fail of {task_id}")
        _expect(
            fail.payload.code == "deadline" and fail.payload.retryable,
            f"task {task_id}: failed with {fail.payload!r}, expected a retryable deadline",
        )
        _expect(fail.outcome == ACCEPTED, f"task {task_id}: fail() returned {fail.outcome!r}")
        key = session_key_for(claims[task_id])
        pending = _one(log.of("mark_pending", key), f"mark_pending of {key}")
        _expect(pending.seq < fail.seq, f"task {task_id}: not marked pending before fail()")
        _expect(not log.of("write", key), f"task {task_id}: a timed-out run wrote a summary")
        await _expect_status(h, task_id, "queued", "a deadline is retryable below the ceiling")
    _expect(not log.of("complete"), "a timed-out task was completed")


async def attempt_ceiling_dead_letters_poison_work(h: ConformanceHarness) -> None:
    """D2/P5: a retryable failure at the global ceiling is dead-lettered with an applied
    attempt_ceiling ack; expiry at the ceiling dead-letters too; claim() never returns a task
    at or above the ceiling."""
    await h.set_ceiling(2)
    poison = await h.enqueue(objective="poison")
    log = CallLog()

    async def run_task(task: Task, session: Any) -> dict[str, Any]:
        raise RuntimeError("deterministic failure")

    host = _host(
        RecordingTaskSource(await h.make_source(), log),
        RecordingSummaryStore(h.summaries, log),
        run_task=run_task,
    )

    async def dead_lettered() -> bool:
        await h.release_retries()
        return await h.status(poison) == "dead_letter"

    async with _serving(host) as serve:
        await wait_until(dead_lettered, "the poison task to be dead-lettered", serving=serve)

        async def both_acked() -> bool:
            return len([c for c in log.of("fail", poison) if c.ended_seq is not None]) == 2

        await wait_until(both_acked, "the second fail() to return", serving=serve)
    _expect([t.attempt for t in log.claimed()] == [1, 2], f"claims {log.claimed()!r}")
    acks = [c.outcome for c in log.of("fail", poison)]
    _expect(acks == [ACCEPTED, AT_CEILING], f"fail() acks {acks!r}, expected applied then ceiling")
    source = await h.make_source()
    _expect(await source.claim() is None, "a dead-lettered task was claimed again (D2)")

    crashing = await h.enqueue(objective="crashes every time")
    for attempt in (1, 2):
        task = _check_claimed(await source.claim(), "source")
        _expect((task.id, task.attempt) == (crashing, attempt), f"claimed {task!r}")
        await h.expire_lease(crashing)
    await _expect_status(h, crashing, "dead_letter", "lease expiry at the ceiling")
    _expect(await source.claim() is None, "a task at the ceiling was claimed (D2)")


async def stop_claiming_drains_without_cancelling(h: ConformanceHarness) -> None:
    """D3/D5: should_stop_claiming() stops new claims but lets active Tasks finish; drain()
    returns only after their acknowledgements settled."""
    ids = [await h.enqueue(objective=f"drained {i}") for i in range(3)]
    log = CallLog()
    gate = asyncio.Event()
    started: list[str] = []
    cancelled: list[str] = []
    stop = False

    async def run_task(task: Task, session: Any) -> dict[str, Any]:
        started.append(task.id)
        try:
            await gate.wait()
        except asyncio.CancelledError:
            cancelled.append(task.id)
            raise
        return {}

    host = _host(
        RecordingTaskSource(await h.make_source(), log),
        RecordingSummaryStore(h.summaries, log),
        run_task=run_task,
        max_concurrent_tasks=2,
        should_stop_claiming=lambda: stop,
    )
    serve = asyncio.ensure_future(host.serve())
    try:

        async def two_started() -> bool:
            return len(started) == 2

        await wait_until(two_started, "two active tasks", serving=serve)
        stop = True
        done, _ = await asyncio.wait({serve}, timeout=0.1)
        _expect(not done, "serve() returned while tasks were still active")
        gate.set()
        await asyncio.wait_for(serve, WAIT_TIMEOUT_S)
    finally:
        if not serve.done():
            serve.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await serve
    _expect(not cancelled, f"stopping claims cancelled active tasks {cancelled} (D3)")
    _expect(len(log.claimed()) == 2, f"{len(log.claimed())} claims after claiming stopped")
    for task_id in started:
        await _expect_status(h, task_id, "completed", "an active task finishes during a drain")
    rest = [task_id for task_id in ids if task_id not in started]
    _expect(len(rest) == 1, f"expected one unclaimed task, saw {rest}")
    left = rest[0]
    await _expect_status(h, left, "queued", "no claim after should_stop_claiming()")

    log = CallLog()
    gate = asyncio.Event()
    started.clear()
    host = _host(
        RecordingTaskSource(await h.make_source(), log),
        RecordingSummaryStore(h.summaries, log),
        run_task=run_task,
        max_concurrent_tasks=2,
    )
    async with _serving(host) as serve:

        async def one_started() -> bool:
            return started == [left]

        await wait_until(one_started, "the remaining task to start", serving=serve)
        drain = asyncio.ensure_future(host.drain())
        done, _ = await asyncio.wait({drain}, timeout=0.1)
        _expect(not done, "drain() returned while a task was still active")
        gate.set()
        await asyncio.wait_for(drain, WAIT_TIMEOUT_S)
        # no polling: drain() returns only after the acknowledgement settled (D3)
        await _expect_status(h, left, "completed", "drain() awaited the acknowledgement")
    _expect(not cancelled, f"drain() cancelled active tasks {cancelled} (D3)")
