"""The ADR-0037 D6 conformance harness: what an implementation provides (``ConformanceHarness``),
the recording wrappers the cases observe the ports through, and the cases' shared helpers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

from taskward.host.engine_host import LEASE_LOST_GRACE_S, ResidentEngineHost, session_key_for
from taskward.host.models import SessionSummary, Task, TaskAck, TaskFailure, TaskResult
from taskward.host.ports import RenewsLeases, SummaryStore, TaskSource

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

    async def make_renewing_source(self) -> TaskSource:
        """Optional (protocol version two, R25): a new claimer whose leases are renewed
        (``RenewsLeases``), for ``OPTIONAL_CASES``. The default says the implementation has
        none; the ten required cases never ask for one."""
        raise NotImplementedError(
            f"{type(self).__name__} makes no renewing source: lease renewal is optional"
        )

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
        """Set the queue's global attempt ceiling (D2) for the tasks enqueued after this call.
        The cases set it only before they enqueue, so an implementation may apply it at
        admission (taskward stores it on each task, DESIGN.md R18) or at every claim."""

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


class RecordingRenewingSource(RecordingTaskSource):
    """A ``RecordingTaskSource`` over a source that renews leases (``RenewsLeases``), its
    renewals recorded too (as ``renew`` calls)."""

    def __init__(
        self,
        inner: TaskSource,
        log: CallLog,
        *,
        transform: Callable[[Task], Task] | None = None,
    ) -> None:
        if not isinstance(inner, RenewsLeases):
            raise TypeError(f"{type(inner).__name__} has no renew(task_id, lease_id)")
        super().__init__(inner, log, transform=transform)
        self._renews: RenewsLeases = inner

    async def renew(self, task_id: str, lease_id: str) -> TaskAck:
        call = self.log.start("source", "renew", task_id, None, lease_id)
        try:
            ack = await self._renews.renew(task_id, lease_id)
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
    renew_every_s: float | None = None,
    lease_lost_grace_s: float = LEASE_LOST_GRACE_S,
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
        renew_every_s=renew_every_s,
        lease_lost_grace_s=lease_lost_grace_s,
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
