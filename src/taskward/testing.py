"""The ADR-0037 D6 conformance suite: ten cases any TaskSource / SummaryStore pair can run.

An implementation provides a :class:`ConformanceHarness` (enqueue work, make claimers, let a
lease lapse, set the attempt ceiling, observe queue and summary state); each case drives the
ports through :class:`~taskward.host.ResidentEngineHost` or calls them directly, and raises
:class:`ConformanceFailure` naming the broken rule. Cases use only the ports and the harness,
never an implementation's internals, and never sleep to wait for state: they poll a condition
with a timeout. Known limit: ``expire_lease`` may lapse other short leases too, so the cases call
it only while the task it names is the one leased task.

Usage from a test suite::

    @pytest.mark.parametrize("case", CONFORMANCE_CASES, ids=str)
    async def test_my_ports_conform(case, my_harness):
        await case.run(my_harness)

or ``await run_conformance(my_harness_factory)`` for all ten at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal

from taskward.host.engine_host import ResidentEngineHost, session_key_for
from taskward.host.models import SessionSummary, Task, TaskAck, TaskFailure, TaskResult
from taskward.host.ports import SummaryStore, TaskSource

__all__ = [
    "CONFORMANCE_CASES",
    "CallLog",
    "CaseReport",
    "ConformanceCase",
    "ConformanceFailure",
    "ConformanceHarness",
    "ConformanceSession",
    "PortCall",
    "QueueState",
    "RecordingSummaryStore",
    "RecordingTaskSource",
    "SummaryOutage",
    "SummaryState",
    "run_conformance",
    "wait_until",
]

QueueState = Literal["queued", "leased", "completed", "terminal_failed", "dead_letter", "cancelled"]
SummaryState = Literal["complete", "pending"]

WAIT_TIMEOUT_S: Final = 5.0
POLL_INTERVAL_S: Final = 0.01
HOST_IDLE_WAIT_S: Final = 0.02
WATCHDOG_TIMEOUT_S: Final = 0.3
ACCEPTED: Final = TaskAck(applied=True, rejection=None)
STALE: Final = TaskAck(applied=False, rejection="stale_lease")
MISSING: Final = TaskAck(applied=False, rejection="missing_holder")
AT_CEILING: Final = TaskAck(applied=True, rejection="attempt_ceiling")


class ConformanceFailure(AssertionError):
    """An implementation broke a rule of ADR-0037; the message names the rule."""


class SummaryOutage(RuntimeError):
    """Raised by a RecordingSummaryStore that simulates a summary storage outage."""


class ConformanceHarness(ABC):
    """What an implementation provides so the cases can drive and observe it.

    ``enqueue`` admits one task; a task enqueued without ``cwd`` must get an existing directory
    as its cwd, and one without ``timeout_s`` a deadline at least ten seconds away so the cases'
    own work never trips its watchdog. ``status`` reports
    the queue's view in ADR-0037 terms: ``queued`` (claimable now, or after ``release_retries``),
    ``leased``, ``completed``, ``terminal_failed`` (a non-retryable failure), ``dead_letter``
    (the attempt ceiling was reached), ``cancelled``. Each case gets a fresh harness whose queue
    is empty and whose attempt ceiling is at least three.
    """

    @property
    @abstractmethod
    def summaries(self) -> SummaryStore:
        """The SummaryStore under test."""

    @abstractmethod
    async def enqueue(
        self,
        *,
        objective: str | None = None,
        cwd: Path | None = None,
        timeout_s: float | None = None,
    ) -> str:
        """Admit one task and return its id; ``objective`` and ``cwd`` reach the claimed Task,
        ``timeout_s`` sets its deadline relative to the claim."""

    @abstractmethod
    async def make_source(self) -> TaskSource:
        """A new claimer of the same queue (another host); several may exist at once."""

    @abstractmethod
    async def expire_lease(self, task_id: str) -> None:
        """Crash-style recovery without sleeping: act as if the task's current lease expired
        with no acknowledgement and run the queue's own recovery, so the task is claimable
        again with its attempt incremented (or dead-lettered at the ceiling)."""

    @abstractmethod
    async def release_retries(self) -> None:
        """Make every task waiting out a retry backoff claimable now (no-op without backoff)."""

    @abstractmethod
    async def set_ceiling(self, attempts: int) -> None:
        """Set the queue's global attempt ceiling (D2)."""

    @abstractmethod
    async def status(self, task_id: str) -> QueueState:
        """The queue's current view of the task."""

    @abstractmethod
    async def history(self, task_id: str) -> Sequence[str]:
        """The state changes the queue recorded for the task, oldest first (used to prove that
        a replayed acknowledgement recorded nothing)."""

    @abstractmethod
    async def summary_state(self, session_key: str) -> SummaryState | None:
        """``complete``, ``pending`` or None (no record) for a session key."""


# -- recording wrappers ---------------------------------------------------------------------


@dataclass
class PortCall:
    """One call through a recording wrapper; ``seq``/``ended_seq`` order starts and returns."""

    seq: int
    port: Literal["source", "summaries"]
    method: str
    key: str
    payload: Any
    lease_id: str | None = None
    outcome: Any = None
    error: BaseException | None = None
    ended_seq: int | None = None


@dataclass
class CallLog:
    """The shared, ordered record of calls through the recording wrappers."""

    calls: list[PortCall] = field(default_factory=list)
    _counter: itertools.count[int] = field(default_factory=itertools.count)

    def start(
        self,
        port: Literal["source", "summaries"],
        method: str,
        key: str,
        payload: Any,
        lease_id: str | None = None,
    ) -> PortCall:
        call = PortCall(next(self._counter), port, method, key, payload, lease_id)
        self.calls.append(call)
        return call

    def end(self, call: PortCall, outcome: Any = None, error: BaseException | None = None) -> None:
        call.outcome, call.error, call.ended_seq = outcome, error, next(self._counter)

    def of(self, method: str, key: str | None = None) -> list[PortCall]:
        return [c for c in self.calls if c.method == method and (key is None or c.key == key)]

    def claimed(self) -> list[Task]:
        return [c.payload for c in self.of("claim")]


class RecordingTaskSource:
    """A TaskSource that records every call; ``transform`` may rewrite a claimed Task (to play a
    misbehaving source) without touching the wrapped one."""

    def __init__(
        self,
        inner: TaskSource,
        log: CallLog,
        *,
        transform: Callable[[Task], Task] | None = None,
    ) -> None:
        self.inner = inner
        self.log = log
        self.transform = transform

    async def claim(self) -> Task | None:
        task = await self.inner.claim()
        if task is None:
            return None
        call = self.log.start("source", "claim", task.id, task, task.lease_id)
        self.log.end(call, task)
        return self.transform(task) if self.transform is not None else task

    async def complete(self, task_id: str, lease_id: str, result: TaskResult) -> TaskAck:
        call = self.log.start("source", "complete", task_id, result, lease_id)
        try:
            ack = await self.inner.complete(task_id, lease_id, result)
        except Exception as exc:
            self.log.end(call, error=exc)
            raise
        self.log.end(call, ack)
        return ack

    async def fail(self, task_id: str, lease_id: str, failure: TaskFailure) -> TaskAck:
        call = self.log.start("source", "fail", task_id, failure, lease_id)
        try:
            ack = await self.inner.fail(task_id, lease_id, failure)
        except Exception as exc:
            self.log.end(call, error=exc)
            raise
        self.log.end(call, ack)
        return ack


class RecordingSummaryStore:
    """A SummaryStore that records every call; ``fail_writes`` simulates a storage outage."""

    def __init__(self, inner: SummaryStore, log: CallLog, *, fail_writes: bool = False) -> None:
        self.inner = inner
        self.log = log
        self.fail_writes = fail_writes

    async def write(self, session_key: str, summary: SessionSummary) -> None:
        call = self.log.start("summaries", "write", session_key, summary)
        try:
            if self.fail_writes:
                raise SummaryOutage(f"summary store unavailable for {session_key!r}")
            await self.inner.write(session_key, summary)
        except Exception as exc:
            self.log.end(call, error=exc)
            raise
        self.log.end(call)

    async def mark_pending(self, session_key: str, reason: str) -> None:
        call = self.log.start("summaries", "mark_pending", session_key, reason)
        try:
            await self.inner.mark_pending(session_key, reason)
        except Exception as exc:
            self.log.end(call, error=exc)
            raise
        self.log.end(call)


class ConformanceSession:
    """Stands in for an engine Session: mutable state one task may touch (D3)."""

    def __init__(self) -> None:
        self.owner: str | None = None
        self.touched_by: list[str] = []


# -- helpers --------------------------------------------------------------------------------


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise ConformanceFailure(message)


async def wait_until(
    condition: Callable[[], Awaitable[bool]],
    what: str,
    *,
    timeout_s: float = WAIT_TIMEOUT_S,
    serving: asyncio.Future[Any] | None = None,
) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout_s`` or when ``serving`` (a host's
    serve task) ended before the condition held."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        ended = serving is not None and serving.done()
        if await condition():
            return
        if ended:
            assert serving is not None
            error = None if serving.cancelled() else serving.exception()
            raise ConformanceFailure(f"the host stopped (error: {error!r}) before {what}")
        if loop.time() >= deadline:
            raise ConformanceFailure(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(POLL_INTERVAL_S)


def _host(
    source: TaskSource,
    summaries: SummaryStore,
    *,
    run_task: Callable[[Task, Any], Awaitable[dict[str, Any]]],
    max_concurrent_tasks: int = 2,
    session_factory: Callable[[], Any] = ConformanceSession,
    summarize: Callable[[Task, Any, dict[str, Any]], Awaitable[str | None]] | None = None,
    should_stop_claiming: Callable[[], bool] | None = None,
) -> ResidentEngineHost:
    return ResidentEngineHost(
        source=source,
        summaries=summaries,
        max_concurrent_tasks=max_concurrent_tasks,
        session_factory=session_factory,
        run_task=run_task,
        summarize=summarize,
        should_stop_claiming=should_stop_claiming,
        idle_wait_s=HOST_IDLE_WAIT_S,
    )


@contextlib.asynccontextmanager
async def _serving(host: ResidentEngineHost) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``host.serve()``; on a clean exit stop claiming and await the drain, on an error
    cancel it."""
    serve = asyncio.ensure_future(host.serve())
    clean = False
    try:
        yield serve
        clean = True
    finally:
        if clean:
            host.stop_claiming("conformance case finished")
            done, _ = await asyncio.wait({serve}, timeout=WAIT_TIMEOUT_S)
            if serve not in done:
                serve.cancel()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await serve
                raise ConformanceFailure("the host did not drain after claiming stopped")
            serve.result()  # re-raise a crash of the serve loop
        else:
            serve.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await serve


def _stop_after(log: CallLog, claims: int) -> Callable[[], bool]:
    """``should_stop_claiming`` that stops a host once it made ``claims`` claims."""
    return lambda: len(log.of("claim")) >= claims


def _check_claimed(task: Task | None, source_name: str) -> Task:
    _expect(isinstance(task, Task), f"{source_name}.claim() returned {task!r}, not a Task")
    assert isinstance(task, Task)
    _expect(
        task.deadline <= task.lease_expires_at,
        f"task {task.id}: a claim issued a lease ending before its deadline (D1)",
    )
    _expect(
        task.lease_expires_at > datetime.now(UTC),
        f"task {task.id}: a claim returned an already expired lease (D2)",
    )
    _expect(task.attempt >= 1, f"task {task.id}: attempt {task.attempt} < 1 (D1)")
    return task


def _result(task: Task) -> TaskResult:
    key = session_key_for(task)
    return TaskResult(run_id=key, status="completed", summary_ref=key)


def _summary(task: Task, narrative: str | None = None) -> SessionSummary:
    key = session_key_for(task)
    return SessionSummary(
        facts={"task_id": task.id, "attempt": task.attempt, "run_id": key},
        narrative=narrative,
        manifest_ref=f"conformance:{key}",
    )


async def _expect_status(
    h: ConformanceHarness, task_id: str, expected: QueueState, why: str
) -> None:
    actual = await h.status(task_id)
    _expect(actual == expected, f"task {task_id}: status {actual!r}, expected {expected!r}: {why}")


def _one(calls: list[PortCall], what: str) -> PortCall:
    _expect(len(calls) == 1, f"expected exactly one {what}, saw {len(calls)}: {calls!r}")
    return calls[0]


async def _ack_calls_settled(log: CallLog, task_ids: Sequence[str]) -> bool:
    settled = {
        c.key for c in log.calls if c.method in {"complete", "fail"} and c.ended_seq is not None
    }
    return all(task_id in settled for task_id in task_ids)


async def _run_forever(task: Task, session: Any) -> dict[str, Any]:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")  # pragma: no cover


async def _run_ok(task: Task, session: Any) -> dict[str, Any]:
    return {}


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

    lowered = await h.enqueue(objective="ceiling lowered")
    task = _check_claimed(await source.claim(), "source")
    failure = TaskFailure(code="flow_failed", detail="transient", retryable=True)
    ack = await source.fail(task.id, task.lease_id, failure)
    _expect(ack == ACCEPTED, f"a retryable failure below the ceiling returned {ack!r}")
    await h.set_ceiling(1)
    await h.release_retries()
    await _expect_status(h, lowered, "queued", "a retry waits")
    _expect(await source.claim() is None, "a task at the lowered ceiling was claimed (D2)")


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


# -- the suite ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConformanceCase:
    """One required case of ADR-0037 D6."""

    name: str
    run: Callable[[ConformanceHarness], Awaitable[None]]

    def __str__(self) -> str:
        return self.name


CONFORMANCE_CASES: Final[tuple[ConformanceCase, ...]] = tuple(
    ConformanceCase(fn.__name__, fn)
    for fn in (
        concurrent_claimers_yield_one_lease_winner,
        fresh_session_per_concurrent_task,
        identical_acknowledgement_retries_are_idempotent,
        stale_lease_rejected_after_reclaim,
        invalid_cwd_and_short_lease_rejected,
        summary_written_before_complete,
        summary_failure_is_pending_and_failed_never_completed,
        deadline_cancellation_and_crash_reclaim,
        attempt_ceiling_dead_letters_poison_work,
        stop_claiming_drains_without_cancelling,
    )
)


@dataclass(frozen=True)
class CaseReport:
    name: str
    passed: bool
    elapsed_s: float
    error: BaseException | None = None


async def run_conformance(
    harness_factory: Callable[[], AbstractAsyncContextManager[ConformanceHarness]],
    *,
    cases: Sequence[ConformanceCase] = CONFORMANCE_CASES,
    case_timeout_s: float = 30.0,
    raise_on_failure: bool = True,
) -> list[CaseReport]:
    """Run each case against a fresh harness from ``harness_factory``.

    Raises:
        ConformanceFailure: listing every failed case, unless ``raise_on_failure`` is False.
    """
    reports: list[CaseReport] = []
    for case in cases:
        started = time.monotonic()
        error: BaseException | None = None
        try:
            async with harness_factory() as harness:
                await asyncio.wait_for(case.run(harness), case_timeout_s)
        except Exception as exc:
            error = exc
        reports.append(CaseReport(case.name, error is None, time.monotonic() - started, error))
    failed = [r for r in reports if not r.passed]
    if failed and raise_on_failure:
        lines = "\n".join(f"- {r.name}: {r.error!r}" for r in failed)
        raise ConformanceFailure(f"{len(failed)} of {len(reports)} cases failed:\n{lines}")
    return reports
