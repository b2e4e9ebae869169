"""ResidentEngineHost (ADR-0037 D3-D5): many tasks at once, each in its own session, with the
summary written before completion.

Rules enforced here:
- never more than ``max_concurrent_tasks`` leases held, and no prefetch (D3): a claim is made
  only for a free slot (a source with ``claim_many(n)`` is asked for at most the free slots);
- ``session_factory`` is called exactly once per valid task; nothing mutable is shared (D3);
- ``cwd`` must exist and be a directory; the host never calls ``os.chdir`` (D3);
- a reached deadline fails with ``deadline`` before a session exists; a lease that cannot cover
  the deadline is ``invalid_task``; a watchdog cancels the run at the deadline (D3, D5);
- success: facts, best-effort narrative, ``SummaryStore.write``, then ``complete`` (D4); a
  source that ``FinishesInOneStep`` into this host's summary store does both in one atomic step,
  summary first, and may lease the next task for the slot that step frees (D3: a lease only for
  a free slot, never more than ``max_concurrent_tasks``), which the same job then runs;
- failure: best-effort ``mark_pending`` then ``fail``; errors of both are kept and logged (D4);
- a host shutdown reports a retryable failure, never a cancelled task (R10);
- a store that is away (``StoreUnavailable``) fails no task: claims back off and retry, and a
  summary or acknowledgement is retried until the store answers (it is idempotent: the
  acknowledgement is judged by the lease, R4);
- ``should_stop_claiming`` stops new claims without cancelling active tasks; ``drain()``
  returns once every active job's acknowledgement path has settled (D3, D5).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from taskward.host.models import (
    SessionSummary,
    Task,
    TaskAck,
    TaskFailure,
    TaskResult,
    manifest_ref,
    summary_facts,
)
from taskward.host.ports import (
    FinishesInOneStep,
    SummaryNotWritten,
    SummaryStore,
    TaskRunFailure,
    TaskSource,
)
from taskward.loops import raise_if_cancelling
from taskward.store.retry import STORE_BACKOFF, Streak, retry_while_unavailable

log = logging.getLogger("taskward.host")

RunTask = Callable[[Task, Any], Awaitable[dict[str, Any]]]
Summarize = Callable[[Task, Any, dict[str, Any]], Awaitable[str | None]]

DEFAULT_IDLE_WAIT_S = 0.5
SHUTDOWN_GRACE_S = 10.0
CWD_CHECK_TTL_S = 1.0  # how long a task directory found to exist is not checked again
CWD_CHECK_CACHE = 256  # directories remembered at once


class _HostShutdown(Exception):
    pass


def _resolve(wake: asyncio.Future[Any], _: object = None) -> None:
    if not wake.done():
        wake.set_result(None)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark an abandoned wait's outcome as seen: a source's error there is not a host error
    (the next claim meets the store as it is), and must not be logged as never retrieved."""
    if not task.cancelled():
        task.exception()


def session_key_for(task: Task) -> str:
    """The summary session key is the run id, ``<task-id>:<attempt>`` (R10, D4)."""
    return f"{task.id}:{task.attempt}"


def manifest_ref_for(task: Task) -> str:
    """A reference that resolves to the run's row and its transition facts."""
    return manifest_ref(task.id, task.attempt)


@dataclass
class HostStats:
    claimed: int = 0
    completed: int = 0
    failed: int = 0
    ack_rejected: int = 0
    errors: list[str] = field(default_factory=list)
    stop_reason: str | None = None


class ResidentEngineHost:
    def __init__(
        self,
        *,
        source: TaskSource,
        summaries: SummaryStore,
        max_concurrent_tasks: int,
        session_factory: Callable[[], Any],
        run_task: RunTask,
        summarize: Summarize | None = None,
        should_stop_claiming: Callable[[], bool] | None = None,
        idle_wait_s: float = DEFAULT_IDLE_WAIT_S,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_event: Callable[[str, Task, dict[str, Any]], None] | None = None,
    ) -> None:
        if isinstance(max_concurrent_tasks, bool) or not isinstance(max_concurrent_tasks, int):
            raise TypeError("max_concurrent_tasks must be an int")
        if max_concurrent_tasks < 1:
            raise ValueError("max_concurrent_tasks must be at least 1")
        self.source = source
        self.summaries = summaries
        self.max_concurrent_tasks = max_concurrent_tasks
        self.session_factory = session_factory
        self.run_task = run_task
        self.summarize = summarize
        self.should_stop_claiming = should_stop_claiming or (lambda: False)
        self.idle_wait_s = idle_wait_s
        self.clock = clock
        self.on_event = on_event
        self.stats = HostStats()
        self._active: dict[asyncio.Task[None], Task] = {}
        # Jobs acknowledging their task (``_settling``): a shutdown never cancels them
        self._settling_jobs: set[asyncio.Task[Any]] = set()
        self._serving: asyncio.Task[Any] | None = None  # the task running ``serve``
        self._stopping = False
        # What the serve loop awaits while it waits (``_idle``, ``_wait_for_slot``), resolved by
        # whatever ends that wait: a stop; a freed slot (only a wait for a slot: an idle host
        # does not claim again because a job ended); the source's wake-up or the idle bound.
        self._serve_wake: asyncio.Future[Any] | None = None
        self._waiting_for_slot = False
        self._claims_settled = asyncio.Event()
        self._claims_settled.set()
        self._shutdown = False
        self._claim_streak = Streak(STORE_BACKOFF, what="claim", logger=None)
        self._one_step_judged: tuple[TaskSource, SummaryStore, bool] | None = None
        # cwd -> monotonic time until which it is known to be a directory (``_cwd_exists``)
        self._cwd_seen: dict[Path, float] = {}

    # -- public ----------------------------------------------------------------------------

    @property
    def finishes_in_one_step(self) -> bool:
        """Whether a successful task's summary, completion and next lease are one step of the
        source (``FinishesInOneStep``) rather than ``write``, ``complete`` and a claim."""
        return self._one_step() is not None

    def _one_step(self) -> FinishesInOneStep | None:
        """The source, when it writes into this host's summary store (judged again whenever
        ``source`` or ``summaries`` is replaced, so each finish takes the path that fits)."""
        source, summaries = self.source, self.summaries
        cached = self._one_step_judged
        if cached is None or cached[0] is not source or cached[1] is not summaries:
            fits = isinstance(source, FinishesInOneStep) and source.writes_summaries_to(summaries)
            cached = self._one_step_judged = (source, summaries, fits)
        return source if cached[2] else None  # type: ignore[return-value]

    @property
    def active_count(self) -> int:
        return len(self._active)

    @property
    def active_tasks(self) -> list[Task]:
        return list(self._active.values())

    def stop_claiming(self, reason: str = "stop requested") -> None:
        """Stop new claims; active tasks continue (D3)."""
        if not self._stopping:
            self._stopping = True
            self.stats.stop_reason = self.stats.stop_reason or reason
        self._wake_serve()

    async def drain(self) -> None:
        """Stop claiming and return once every active job has settled its acknowledgement."""
        self.stop_claiming("drain")
        # A claim already in flight may still hand this host leased tasks: they are active
        # jobs too, so wait for the claim to settle before waiting for the jobs (D3).
        await self._claims_settled.wait()
        while self._active:
            await asyncio.gather(*list(self._active), return_exceptions=True)

    async def serve(self) -> None:
        """Claim and run tasks until claiming stops, then drain; cancelling this coroutine stops
        claiming and cooperatively cancels active jobs, which report a retryable failure."""
        self._serving = asyncio.current_task()
        try:
            while not self._stopping:
                raise_if_cancelling()
                if self.should_stop_claiming():
                    self.stop_claiming("should_stop_claiming")
                    break
                free = self.max_concurrent_tasks - len(self._active)
                if free <= 0:
                    await self._wait_for_slot()
                    continue
                self._claims_settled.clear()
                try:
                    tasks = await self._claim(free)
                    for task in tasks:
                        self._start(task)
                finally:
                    self._claims_settled.set()
                if not tasks:
                    await self._idle()
                    continue
            await self.drain()
        except asyncio.CancelledError:
            self._stopping = True
            self._shutdown = True
            jobs = list(self._active)
            for job in jobs:
                if job not in self._settling_jobs:  # an acknowledgement runs to its end
                    job.cancel()
            if jobs:
                await asyncio.wait(jobs, timeout=SHUTDOWN_GRACE_S)
            raise

    # -- claiming --------------------------------------------------------------------------

    async def _claim(self, free: int) -> list[Task]:
        claim_many = getattr(self.source, "claim_many", None)
        while True:
            try:
                if claim_many is not None:
                    tasks: list[Task] = list(await claim_many(free))
                else:
                    task = await self.source.claim()
                    tasks = [task] if task is not None else []
                break
            except Exception as exc:  # a store hiccup must not kill the host: back off, retry
                self._keep_error(f"claim failed: {exc!r}")
                await asyncio.sleep(self._claim_streak.failed(exc))
                if self._stopping:
                    return []
        self._claim_streak.succeeded()
        if len(tasks) > free:  # a misbehaving source must not make us exceed the bound
            raise RuntimeError(f"source returned {len(tasks)} tasks for {free} free slots")
        self.stats.claimed += len(tasks)
        return tasks

    # -- waiting -------------------------------------------------------------------------

    def _wake_serve(self) -> None:
        """End the serve loop's current wait, if it is waiting."""
        if self._serve_wake is not None:
            _resolve(self._serve_wake)

    def _new_wake(self, *, for_slot: bool) -> asyncio.Future[None]:
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._serve_wake = wake
        self._waiting_for_slot = for_slot
        return wake

    async def _idle(self) -> None:
        """Wait until the source says work may have arrived (``wait_for_work``), ``idle_wait_s``
        passes, or claiming stops.

        One future ends the wait, whichever of the three comes first. A source whose
        ``wait_for_work`` returns a plain future (``LocalTaskSource``: its store's signal)
        has that very future awaited, and a stop or the bound resolves it too; a coroutine runs
        as one task whose end resolves a future of the host's; without ``wait_for_work`` only
        the bound and a stop end it. An idle worker's pickup latency
        is this path (a notification, then the next claim): an ``asyncio.wait`` over a task
        for the stop event and a task for the source's wait, cancelled and gathered afterwards,
        took three more loop turns (measured:
        docs/benchmarks.md#figures-that-justified-design-choices).
        """
        if self._stopping:
            return
        wait_for_work = getattr(self.source, "wait_for_work", None)
        waiting = wait_for_work(self.idle_wait_s) if wait_for_work is not None else None
        task: asyncio.Future[Any] | None = None
        if asyncio.isfuture(waiting) and not isinstance(waiting, asyncio.Task):
            wake: asyncio.Future[Any] = waiting
            self._serve_wake, self._waiting_for_slot = wake, False
        else:
            wake = self._new_wake(for_slot=False)
            if waiting is not None:
                task = asyncio.ensure_future(waiting)
                task.add_done_callback(functools.partial(_resolve, wake))  # this wait's, only
        # The bound (a source without a wait polls at it), which holds even if a source's
        # wait ignores its own timeout.
        timer = asyncio.get_running_loop().call_later(self.idle_wait_s, _resolve, wake)
        try:
            await wake
        finally:
            self._serve_wake = None
            timer.cancel()
            if task is not None:
                if not task.done():
                    task.cancel()  # it ends on its own at the next loop turn; nobody awaits it
                task.add_done_callback(_retrieve)

    async def _wait_for_slot(self) -> None:
        """Wait until a job ends (``_job_done``) or claiming stops."""
        wake = self._new_wake(for_slot=True)
        try:
            if len(self._active) < self.max_concurrent_tasks or self._stopping:
                return
            await wake
        finally:
            self._serve_wake = None

    def _start(self, task: Task) -> None:
        job = asyncio.ensure_future(self._job(task))
        self._active[job] = task
        job.add_done_callback(self._job_done)

    def _job_done(self, job: asyncio.Task[None]) -> None:
        self._active.pop(job, None)
        if self._waiting_for_slot:
            self._wake_serve()
        if not job.cancelled() and job.exception() is not None:
            self._keep_error(f"host job crashed: {job.exception()!r}")

    # -- one task --------------------------------------------------------------------------

    def _emit(self, kind: str, task: Task, **data: Any) -> None:
        if self.on_event is not None:
            with contextlib.suppress(Exception):
                self.on_event(kind, task, data)

    def _keep_error(self, message: str) -> None:
        self.stats.errors.append(message)
        del self.stats.errors[:-100]
        log.error(message)

    def _precheck(self, task: Task) -> TaskFailure | None:
        now = self.clock()
        if task.lease_expires_at <= now:
            return TaskFailure(
                code="invalid_task",
                retryable=True,
                detail="lease already expired when the host received it",
            )
        if task.deadline > task.lease_expires_at:
            return TaskFailure(
                code="invalid_task",
                retryable=False,
                detail="lease cannot cover the task's deadline",
            )
        if now >= task.deadline:
            return TaskFailure(
                code="deadline", retryable=True, detail="deadline reached before the task started"
            )
        if not self._cwd_exists(task.cwd):
            return TaskFailure(
                code="invalid_task",
                retryable=False,
                detail=f"cwd {str(task.cwd)!r} is not an existing directory",
            )
        return None

    def _cwd_exists(self, cwd: Path, *, now: float | None = None) -> bool:
        """``cwd.is_dir()`` (False for a missing path too: one stat, not two), a positive
        answer remembered for CWD_CHECK_TTL_S: the tasks of a host mostly share one directory,
        and a stat per task showed in a no-op task's time (measured:
        docs/benchmarks.md#figures-that-justified-design-choices). A directory removed meanwhile is
        noticed at most that much later, by the task's own first use of it otherwise. ``now``:
        a ``time.monotonic()`` reading (tests inject it)."""
        now = time.monotonic() if now is None else now
        if self._cwd_seen.get(cwd, 0.0) > now:
            return True
        if not cwd.is_dir():
            self._cwd_seen.pop(cwd, None)
            return False
        if len(self._cwd_seen) >= CWD_CHECK_CACHE:
            self._cwd_seen.clear()
        self._cwd_seen[cwd] = now + CWD_CHECK_TTL_S
        return True

    async def _job(self, task: Task) -> None:
        """Run ``task``; then, while its finish leased the next task for this slot, run that."""
        job = asyncio.current_task()
        next_task: Task | None = task
        while next_task is not None:
            if job is not None and job in self._active:
                self._active[job] = next_task
            next_task = await self._run_one(next_task)

    def _may_claim_next(self) -> int:
        """Evaluated inside the finishing step: one lease for the slot it frees, unless this
        host stopped claiming meanwhile (D3)."""
        return 0 if self._stopping else 1

    async def _run_one(self, task: Task) -> Task | None:
        key = session_key_for(task)
        started = self.clock()
        started_mono = time.monotonic()
        self._emit("start", task)
        failure = self._precheck(task)
        if failure is not None:
            await self._report_failure(task, key, failure)
            return None
        try:
            session = self.session_factory()
        except Exception as exc:
            await self._report_failure(
                task,
                key,
                TaskFailure(
                    code="flow_failed", retryable=True, detail=f"session setup failed: {exc!r}"
                ),
            )
            return None
        budget = (task.deadline - self.clock()).total_seconds()
        watchdog = asyncio.timeout(budget)
        try:
            async with watchdog:
                output = await self.run_task(task, session)
        except TimeoutError as exc:
            # Only the watchdog's own expiry is a deadline; a TimeoutError the flow raised
            # before the deadline is a flow failure (D4 classification, D5 watchdog).
            failure = (
                TaskFailure(code="deadline", retryable=True, detail="watchdog: deadline reached")
                if watchdog.expired()
                else TaskFailure(code="flow_failed", retryable=True, detail=f"TimeoutError: {exc}")
            )
            await self._report_failure(task, key, failure)
            return None
        except TaskRunFailure as exc:
            code = exc.code if exc.code in _FAILURE_CODES else "flow_failed"
            await self._report_failure(
                task, key, TaskFailure(code=code, retryable=exc.retryable, detail=exc.detail)
            )
            return None
        except asyncio.CancelledError:
            # R10: a host shutdown is a retryable failure, never a cancelled task.
            await asyncio.shield(
                self._report_failure(
                    task, key, TaskFailure(code="cancelled", retryable=True, detail="host shutdown")
                )
            )
            raise
        except Exception as exc:
            await self._report_failure(
                task,
                key,
                TaskFailure(
                    code="flow_failed", retryable=True, detail=f"{type(exc).__name__}: {exc}"
                ),
            )
            return None
        return await self._complete(task, key, session, output, started, started_mono)

    async def _complete(
        self,
        task: Task,
        key: str,
        session: Any,
        output: dict[str, Any],
        started: datetime,
        started_mono: float,
    ) -> Task | None:
        """D4 success: summary, then completion. Returns the task the finish leased for this
        slot, if any (one-step sources only)."""
        try:
            summary = await self._summary(task, key, session, output, started, started_mono)
            one_step = self._one_step()
            if one_step is not None:
                return await self._finish_in_one_step(one_step, task, key, summary)
            await retry_while_unavailable(
                lambda: self.summaries.write(key, summary), what=f"task {task.id}: summary"
            )
        except Exception as exc:  # the summary was not written: never complete (D4)
            cause = exc.__cause__ if isinstance(exc, SummaryNotWritten) else exc
            await self._report_failure(
                task,
                key,
                TaskFailure(
                    code="summary_failed", retryable=True, detail=f"summary not written: {cause!r}"
                ),
            )
            return None
        try:
            with self._settling():
                ack = await retry_while_unavailable(
                    lambda: self.source.complete(
                        task.id,
                        task.lease_id,
                        TaskResult(run_id=key, status="completed", summary_ref=key),
                    ),
                    what=f"task {task.id}: complete",
                )
        except Exception as exc:
            self._keep_error(f"task {task.id}: complete failed: {exc!r}")
            return None
        self._note_ack(task, ack, "completed")
        return None

    async def _summary(
        self,
        task: Task,
        key: str,
        session: Any,
        output: dict[str, Any],
        started: datetime,
        started_mono: float,
    ) -> SessionSummary:
        """The host-authored facts, the best-effort narrative and the manifest (D4)."""
        elapsed_ms = (time.monotonic() - started_mono) * 1000
        facts = summary_facts(task.id, task.attempt, started, self.clock(), elapsed_ms, output)
        narrative: str | None = None
        if self.summarize is not None:
            try:  # best-effort: facts and manifest are authoritative (D4)
                narrative = await self.summarize(task, session, output)
            except Exception as exc:
                log.warning("task %s: narrative failed: %r", task.id, exc)
        return SessionSummary(facts=facts, narrative=narrative, manifest_ref=manifest_ref_for(task))

    @contextlib.contextmanager
    def _settling(self) -> Iterator[None]:
        """The current job is acknowledging its task: a shutdown lets it finish (it cancels
        only the jobs still running tasks), so the acknowledgement is never cut in half and
        needs no task or shield of its own."""
        job = asyncio.current_task()
        if job is not None:
            self._settling_jobs.add(job)
        try:
            yield
        finally:
            if job is not None:
                self._settling_jobs.discard(job)

    def _shutting_down(self) -> bool:
        """A shutdown began: ``serve`` was cancelled, even if its handler has not run yet."""
        serving = self._serving
        return self._shutdown or (serving is not None and serving.cancelling() > 0)

    async def _finish_in_one_step(
        self, one_step: FinishesInOneStep, task: Task, key: str, summary: SessionSummary
    ) -> Task | None:
        """Summary, completion and the next lease for this slot in one step of the source.

        Never interrupted, like ``complete`` (``_settling``): the step ends as it would have. A
        task it leased while the host began to shut down is handed back at once as a
        host-shutdown retry (R10), so no lease is left to expire.
        """
        if self.should_stop_claiming():
            self.stop_claiming("should_stop_claiming")
        with self._settling():
            try:
                ack, leased = await retry_while_unavailable(
                    lambda: one_step.complete_with_summary(
                        task.id,
                        task.lease_id,
                        TaskResult(run_id=key, status="completed", summary_ref=key),
                        summary,
                        claim_next=self._may_claim_next,
                    ),
                    what=f"task {task.id}: finish",
                )
            except SummaryNotWritten:
                raise
            except Exception as exc:
                self._keep_error(f"task {task.id}: complete failed: {exc!r}")
                return None
            if self._shutting_down():  # still uninterruptible while it hands leases back
                self._note_ack(task, ack, "completed")
                for orphan in leased:
                    await self._report_failure(
                        orphan,
                        session_key_for(orphan),
                        TaskFailure(code="cancelled", retryable=True, detail="host shutdown"),
                    )
                return None
        self._note_ack(task, ack, "completed")
        self.stats.claimed += len(leased)
        for extra in leased[1:]:  # a misbehaving source must not make us exceed the bound (D3)
            self._keep_error(f"source leased {len(leased)} tasks for one freed slot")
            await self._report_failure(
                extra,
                session_key_for(extra),
                TaskFailure(
                    code="invalid_task", retryable=True, detail="leased beyond the free slots"
                ),
            )
        return leased[0] if leased else None

    async def _report_failure(self, task: Task, key: str, failure: TaskFailure) -> None:
        try:
            await self.summaries.mark_pending(key, f"{failure.code}: {failure.detail}")
        except Exception as exc:
            self._keep_error(f"task {task.id}: mark_pending failed: {exc!r}")
        try:
            ack = await retry_while_unavailable(
                lambda: self.source.fail(task.id, task.lease_id, failure),
                what=f"task {task.id}: fail",
            )
        except Exception as exc:
            self._keep_error(f"task {task.id}: fail acknowledgement failed: {exc!r}")
            return
        self._note_ack(task, ack, "failed", failure=failure)

    def _note_ack(
        self, task: Task, ack: TaskAck, outcome: str, failure: TaskFailure | None = None
    ) -> None:
        if not ack.applied:
            # An ownership loss, not a host success (D4 step 7).
            self.stats.ack_rejected += 1
            log.warning("task %s: acknowledgement rejected (%s)", task.id, ack.rejection)
        elif outcome == "completed":
            self.stats.completed += 1
        else:
            self.stats.failed += 1
        self._emit("end", task, outcome=outcome, ack=ack, failure=failure)


_FAILURE_CODES = frozenset(
    {"invalid_task", "flow_failed", "cancelled", "deadline", "summary_failed", "escalation_give_up"}
)
