"""Conformance cases one to five (ADR-0037 D1-D3): claiming, session isolation,
acknowledgement replays, stale leases and the host's pre-run checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from taskward.host.conformance.harness import (
    ACCEPTED,
    MISSING,
    STALE,
    WAIT_TIMEOUT_S,
    CallLog,
    ConformanceFailure,
    ConformanceHarness,
    ConformanceSession,
    RecordingSummaryStore,
    RecordingTaskSource,
    _ack_calls_settled,
    _check_claimed,
    _expect,
    _expect_status,
    _host,
    _one,
    _result,
    _serving,
    _stop_after,
    _summary,
    wait_until,
)
from taskward.host.engine_host import session_key_for
from taskward.host.models import Task, TaskFailure, TaskResult

# -- the ten cases ----------------------------------------------------------------------------


async def concurrent_claimers_yield_one_lease_winner(h: ConformanceHarness) -> None:
    """D2: claim() is an atomic dequeue-and-lease with exactly one winner per attempt."""
    task_id = await h.enqueue(objective="contended")
    sources = [await h.make_source() for _ in range(4)]
    claims = await asyncio.gather(*(s.claim() for s in sources))
    winners = [t for t in claims if t is not None]
    _expect(len(winners) == 1, f"{len(winners)} concurrent claimers won one task (D2)")
    task = _check_claimed(winners[0], "source")
    _expect(task.id == task_id and task.attempt == 1, f"unexpected first claim {task!r}")
    await _expect_status(h, task_id, "leased", "the winner holds the lease")
    again = await asyncio.gather(*(s.claim() for s in sources))
    _expect(all(t is None for t in again), "a leased task was returned again by claim() (D2)")

    batch = {await h.enqueue(objective=f"batch {i}") for i in range(6)}
    seen: list[Task] = []
    for _ in range(len(batch) + 4):
        round_ = [t for t in await asyncio.gather(*(s.claim() for s in sources)) if t]
        seen.extend(_check_claimed(t, "source") for t in round_)
        if not round_ and len(seen) >= len(batch):
            break
    ids = [t.id for t in seen]
    _expect(len(ids) == len(set(ids)), f"a task was leased to two claimers: {sorted(ids)} (D2)")
    _expect(set(ids) == batch, f"claimed {sorted(ids)}, expected each of {sorted(batch)} once")


async def fresh_session_per_concurrent_task(h: ConformanceHarness) -> None:
    """D3: session_factory() once per claimed Task; concurrent Tasks share no Session."""
    ids = [await h.enqueue(objective=f"isolated {i}") for i in range(3)]
    log = CallLog()
    sessions: list[ConformanceSession] = []
    problems: list[str] = []
    started: list[str] = []
    all_started = asyncio.Event()

    def session_factory() -> ConformanceSession:
        session = ConformanceSession()
        sessions.append(session)
        return session

    async def run_task(task: Task, session: Any) -> dict[str, Any]:
        if not isinstance(session, ConformanceSession) or session.owner is not None:
            problems.append(f"task {task.id} received a used session {session!r}")
            return {}
        session.owner = task.id
        session.touched_by.append(task.id)
        started.append(task.id)
        if len(started) == len(ids):
            all_started.set()
        await asyncio.wait_for(all_started.wait(), WAIT_TIMEOUT_S)
        await asyncio.sleep(0)  # let the other tasks interleave before checking
        if session.owner != task.id or session.touched_by != [task.id]:
            problems.append(f"task {task.id} saw another task's session state")
        return {"operation_statuses": {"step": "completed"}}

    source = RecordingTaskSource(await h.make_source(), log)
    summaries = RecordingSummaryStore(h.summaries, log)
    host = _host(
        source,
        summaries,
        run_task=run_task,
        max_concurrent_tasks=len(ids),
        session_factory=session_factory,
        should_stop_claiming=_stop_after(log, len(ids)),
    )
    async with _serving(host) as serve:
        await wait_until(
            lambda: _ack_calls_settled(log, ids), "all tasks to be acknowledged", serving=serve
        )
    _expect(not problems, "; ".join(problems))
    _expect(all_started.is_set(), "the host did not run the tasks concurrently")
    _expect(
        len(sessions) == len(ids),
        f"session_factory called {len(sessions)} times for {len(ids)} tasks (D3)",
    )
    _expect(len({id(s) for s in sessions}) == len(ids), "a Session object was reused (D3)")
    _expect({s.owner for s in sessions} == set(ids), "a session did not belong to one task")
    for task_id in ids:
        await _expect_status(h, task_id, "completed", "each isolated task completes")


async def identical_acknowledgement_retries_are_idempotent(h: ConformanceHarness) -> None:
    """D2/D4: an exact replay returns the same ack without repeating effects; a different
    payload after a terminal ack is stale_lease."""
    done_id = await h.enqueue(objective="complete twice")
    fail_id = await h.enqueue(objective="fail twice")
    source = await h.make_source()
    claimed = {t.id: t for t in [await source.claim(), await source.claim()] if t is not None}
    _expect(set(claimed) == {done_id, fail_id}, f"claimed {sorted(claimed)}")

    done = claimed[done_id]
    key = session_key_for(done)
    await h.summaries.write(key, _summary(done))
    await h.summaries.write(key, _summary(done))  # a replayed write succeeds (D4)
    first = await source.complete(done.id, done.lease_id, _result(done))
    _expect(first == ACCEPTED, f"first complete() returned {first!r}")
    recorded = list(await h.history(done_id))
    replay = await source.complete(done.id, done.lease_id, _result(done))
    _expect(replay == first, f"replayed complete() returned {replay!r}, first was {first!r}")
    restarted = await h.make_source()  # the response was lost and the host restarted
    replay = await restarted.complete(done.id, done.lease_id, _result(done))
    _expect(replay == first, f"complete() replayed by a new source returned {replay!r}")
    _expect(list(await h.history(done_id)) == recorded, "a replayed complete() recorded again (D2)")
    changed = TaskResult(run_id=_result(done).run_id, status="completed", summary_ref="other")
    other = await source.complete(done.id, done.lease_id, changed)
    _expect(other == STALE, f"a different completion after a terminal ack returned {other!r}")
    failure = TaskFailure(code="flow_failed", detail="late", retryable=False)
    other = await source.fail(done.id, done.lease_id, failure)
    _expect(other == STALE, f"a failure after a terminal completion returned {other!r}")
    await _expect_status(h, done_id, "completed", "replays change nothing")
    _expect(await h.summary_state(key) == "complete", "the completed summary is not complete")

    failed = claimed[fail_id]
    fkey = session_key_for(failed)
    failure = TaskFailure(code="flow_failed", detail="deterministic", retryable=False)
    await h.summaries.mark_pending(fkey, "flow_failed: deterministic")
    await h.summaries.mark_pending(fkey, "flow_failed: deterministic")  # idempotent (D4)
    first = await source.fail(failed.id, failed.lease_id, failure)
    _expect(first == ACCEPTED, f"first fail() returned {first!r}")
    recorded = list(await h.history(fail_id))
    replay = await source.fail(failed.id, failed.lease_id, failure)
    _expect(replay == first, f"replayed fail() returned {replay!r}, first was {first!r}")
    replay = await restarted.fail(failed.id, failed.lease_id, failure)
    _expect(replay == first, f"fail() replayed by a new source returned {replay!r}")
    _expect(list(await h.history(fail_id)) == recorded, "a replayed fail() recorded again (D2)")
    other = await source.complete(failed.id, failed.lease_id, _result(failed))
    _expect(other == STALE, f"a completion after a terminal failure returned {other!r}")
    await _expect_status(h, fail_id, "terminal_failed", "a non-retryable failure is terminal")
    _expect(await h.summary_state(fkey) == "pending", "a failed run's summary is not pending")


async def stale_lease_rejected_after_reclaim(h: ConformanceHarness) -> None:
    """D2/D5: once a lease lapses and the task is reclaimed, the old holder's acks are
    stale_lease; an unknown or never-leased task is missing_holder."""
    task_id = await h.enqueue(objective="reclaimed")
    old_host, new_host = await h.make_source(), await h.make_source()
    old = _check_claimed(await old_host.claim(), "old source")
    _expect(old.id == task_id, f"claimed {old.id}, expected {task_id}")
    await h.expire_lease(task_id)
    await _expect_status(h, task_id, "queued", "an expired lease below the ceiling is reclaimable")
    new = _check_claimed(await new_host.claim(), "new source")
    _expect(new.id == task_id, f"reclaimed {new.id}, expected {task_id}")
    _expect(new.attempt == old.attempt + 1, f"reclaim attempt {new.attempt} after {old.attempt}")
    _expect(new.lease_id != old.lease_id, "a reclaim reused the expired lease id (D2)")

    late = await old_host.complete(task_id, old.lease_id, _result(old))
    _expect(late == STALE, f"complete() under the expired lease returned {late!r}")
    failure = TaskFailure(code="flow_failed", detail="late", retryable=True)
    late = await old_host.fail(task_id, old.lease_id, failure)
    _expect(late == STALE, f"fail() under the expired lease returned {late!r}")
    bogus = await new_host.complete(task_id, f"{new.lease_id}-forged", _result(new))
    _expect(bogus == STALE, f"complete() under a mismatched lease id returned {bogus!r}")
    await _expect_status(h, task_id, "leased", "stale acknowledgements change nothing")

    unknown = await new_host.complete(f"no-such-task-{uuid.uuid4()}", new.lease_id, _result(new))
    _expect(unknown == MISSING, f"complete() of an unknown task returned {unknown!r}")
    never = await h.enqueue(objective="never leased")
    unheld = await new_host.fail(never, new.lease_id, failure)
    _expect(unheld == MISSING, f"fail() of a never-leased task returned {unheld!r}")
    await _expect_status(h, never, "queued", "an ack for a never-leased task changes nothing")

    ok = await new_host.complete(task_id, new.lease_id, _result(new))
    _expect(ok == ACCEPTED, f"complete() under the current lease returned {ok!r}")
    await _expect_status(h, task_id, "completed", "the current holder completes")


async def invalid_cwd_and_short_lease_rejected(h: ConformanceHarness) -> None:
    """D1/D3: a missing or non-directory cwd and a lease that cannot cover the deadline are
    invalid_task before any Session exists; the model itself refuses such a lease."""
    now = datetime.now(UTC)
    try:
        Task(
            id="t",
            objective="o",
            cwd=Path("."),
            lease_id="l",
            lease_expires_at=now + timedelta(minutes=1),
            attempt=1,
            deadline=now + timedelta(minutes=2),
        )
    except ValueError:
        pass
    else:
        raise ConformanceFailure("Task accepted a deadline after lease_expires_at (D1)")

    missing = Path(tempfile.gettempdir()) / f"taskward-conformance-missing-{uuid.uuid4().hex}"
    handle, name = tempfile.mkstemp(prefix="taskward-conformance-")
    os.close(handle)
    not_a_dir = Path(name)
    try:
        missing_id = await h.enqueue(objective="missing cwd", cwd=missing)
        file_id = await h.enqueue(objective="cwd is a file", cwd=not_a_dir)
        short_id = await h.enqueue(objective="short lease")
        ids = [missing_id, file_id, short_id]

        def stretch(task: Task) -> Task:  # a misbehaving source: deadline past the lease
            if task.id != short_id:
                return task
            return task.model_copy(update={"deadline": task.lease_expires_at + timedelta(hours=1)})

        log = CallLog()
        sessions: list[object] = []
        runs: list[str] = []

        def session_factory() -> object:
            sessions.append(object())
            return sessions[-1]

        async def run_task(task: Task, session: Any) -> dict[str, Any]:
            runs.append(task.id)
            return {}

        source = RecordingTaskSource(await h.make_source(), log, transform=stretch)
        host = _host(
            source,
            RecordingSummaryStore(h.summaries, log),
            run_task=run_task,
            max_concurrent_tasks=3,
            session_factory=session_factory,
            should_stop_claiming=_stop_after(log, len(ids)),
        )
        async with _serving(host) as serve:
            await wait_until(
                lambda: _ack_calls_settled(log, ids), "the invalid tasks to fail", serving=serve
            )
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
    _expect(not sessions, f"session_factory ran {len(sessions)} times for invalid tasks (D3)")
    _expect(not runs, f"invalid tasks were run: {runs} (D3)")
    _expect(not log.of("complete") and not log.of("write"), "an invalid task was completed")
    claims = {t.id: t for t in log.claimed()}
    for task_id in ids:
        fail = _one(log.of("fail", task_id), f"fail of {task_id}")
        failure = fail.payload
        _expect(
            failure.code == "invalid_task" and not failure.retryable,
            f"task {task_id}: failed with {failure!r}, expected non-retryable invalid_task",
        )
        _expect(fail.outcome == ACCEPTED, f"task {task_id}: fail() returned {fail.outcome!r}")
        key = session_key_for(claims[task_id])
        _expect(await h.summary_state(key) == "pending", f"task {task_id}: summary not pending")
        await _expect_status(h, task_id, "terminal_failed", "invalid tasks are not retried")
