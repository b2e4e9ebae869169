"""One host job's work with the task it holds (ADR-0037 D3-D5): the precheck, a fresh session,
the run under the watchdog, the summary then the completion (or the one-step finish), and the
failure report. ``HostJobs`` is the base of ``ResidentEngineHost`` (``engine_host``), which owns
the serve loop and its slots and supplies the three hooks at the end of the class.

Invariant kept here: a task gets one acknowledgement at most (``complete`` or ``fail``, retried
while the store is away), and never a completion without its summary (D4). On every path:
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
- a store that is away (``StoreUnavailable``) fails no task: a summary or acknowledgement is
  retried until the store answers (it is idempotent: the acknowledgement is judged by the
  lease, R4);
- an acknowledgement under way is never cut in half by a shutdown (``_settling``);
- a run whose lease was lost (a renewal answered ``stale_lease``, R25) is stopped: the host
  cancels it if it is still running after a grace (``_runs``), and its report says so.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
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
from taskward.store.retry import retry_while_unavailable

log = logging.getLogger("taskward.host")

RunTask = Callable[[Task, Any], Awaitable[dict[str, Any]]]
Summarize = Callable[[Task, Any, dict[str, Any]], Awaitable[str | None]]

CWD_CHECK_TTL_S = 1.0  # how long a task directory found to exist is not checked again
CWD_CHECK_CACHE = 256  # directories remembered at once


def session_key_for(task: Task) -> str:
    """The summary session key is the run id, ``<task-id>:<attempt>`` (R10, D4)."""
    return f"{task.id}:{task.attempt}"


def manifest_ref_for(task: Task) -> str:
    """A reference that resolves to the run's row and its transition facts."""
    return manifest_ref(task.id, task.attempt)


class _Settling:
    """``HostJobs._settling``'s context: the current job is in ``jobs`` while it is entered (a
    class rather than a generator: every task's acknowledgement enters one)."""

    __slots__ = ("_job", "_jobs")

    def __init__(self, jobs: set[asyncio.Task[Any]]) -> None:
        self._jobs = jobs
        self._job: asyncio.Task[Any] | None = None

    def __enter__(self) -> None:
        job = self._job = asyncio.current_task()
        if job is not None:
            self._jobs.add(job)

    def __exit__(self, *exc_info: object) -> None:
        if self._job is not None:
            self._jobs.discard(self._job)


@dataclass
class HostStats:
    """The host's counts: leases taken, acknowledgements applied or rejected, renewals applied
    and refused, the last 100 errors kept (``_keep_error``) and why claiming stopped."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    ack_rejected: int = 0
    renewed: int = 0  # leases renewed (R25)
    leases_lost: int = 0  # renewals refused: the lease was another's, its run stopped
    errors: list[str] = field(default_factory=list)
    stop_reason: str | None = None


class HostJobs(abc.ABC):
    """What a host job does with its task, from ``_run_one`` to the acknowledgement. The
    constructor's settings below are set by ``ResidentEngineHost.__init__`` (replaceable, like
    ``source`` and ``summaries``: each use reads them afresh); ``__init__`` makes this side's
    own state."""

    source: TaskSource
    summaries: SummaryStore
    session_factory: Callable[[], Any]
    run_task: RunTask
    summarize: Summarize | None
    should_stop_claiming: Callable[[], bool]
    clock: Callable[[], datetime]
    on_event: Callable[[str, Task, dict[str, Any]], None] | None

    def __init__(self) -> None:
        self.stats = HostStats()
        # Jobs acknowledging their task (``_settling``): a shutdown never cancels them
        self._settling_jobs: set[asyncio.Task[Any]] = set()
        # Jobs running their task's ``run_task`` right now, and the task (``_run_one``)
        self._runs: dict[asyncio.Task[Any], Task] = {}
        # Jobs whose task's lease a renewal found lost (R25), and that task
        self._lost_runs: dict[asyncio.Task[Any], Task] = {}
        self._one_step_judged: tuple[TaskSource, SummaryStore, bool] | None = None
        # cwd -> monotonic time until which it is known to be a directory (``_cwd_exists``)
        self._cwd_seen: dict[Path, float] = {}

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
            await self._report_flow_failed(task, key, f"session setup failed: {exc!r}")
            return None
        budget = (task.deadline - self.clock()).total_seconds()
        watchdog = asyncio.timeout(budget)
        try:
            async with watchdog:
                output = await self._run(task, session)
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
            await self._report_shutdown(task, key)
            raise
        except Exception as exc:
            await self._report_flow_failed(task, key, f"{type(exc).__name__}: {exc}")
            return None
        return await self._complete(task, key, session, output, started, started_mono)

    async def _run(self, task: Task, session: Any) -> dict[str, Any]:
        """``run_task``, the job known to be running it meanwhile (``_runs``): only then may a
        lost lease stop it (``ResidentEngineHost._stop_lost_run``), never while it reports."""
        job = asyncio.current_task()
        if job is None:
            return await self.run_task(task, session)
        self._runs[job] = task
        try:
            return await self.run_task(task, session)
        finally:
            del self._runs[job]

    # -- summary, then completion (D4) -----------------------------------------------------

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
        except asyncio.CancelledError:
            # A shutdown while the summary is written (its narrative, or the two-step write;
            # the one-step finish is never interrupted) hands the task back as during the run,
            # instead of leaving it to lease expiry.
            await self._report_shutdown(task, key)
            raise
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

    def _settling(self) -> _Settling:
        """The current job is acknowledging its task: a shutdown lets it finish (it cancels
        only the jobs still running tasks), so the acknowledgement is never cut in half and
        needs no task or shield of its own."""
        return _Settling(self._settling_jobs)

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

    # -- failure (D4) ----------------------------------------------------------------------

    async def _report_shutdown(self, task: Task, key: str) -> None:
        """R10: a host shutdown is a retryable failure, never a cancelled task; the report is
        shielded, so the cancellation that stops the job does not stop its report. A run the
        host stopped because its lease was lost (R25) is reported the same way, saying so:
        the source refuses it (the lease is another's) and keeps it only as evidence."""
        job = asyncio.current_task()
        lost = job is not None and self._lost_runs.get(job) is task
        detail = "lease lost: the run was stopped" if lost else "host shutdown"
        failure = TaskFailure(code="cancelled", retryable=True, detail=detail)
        await asyncio.shield(self._report_failure(task, key, failure))

    async def _report_flow_failed(self, task: Task, key: str, detail: str) -> None:
        """A retryable ``flow_failed`` (D4 classification): the run, or its set-up, raised."""
        await self._report_failure(
            task, key, TaskFailure(code="flow_failed", retryable=True, detail=detail)
        )

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

    # -- supplied by the serve loop (``ResidentEngineHost``) -------------------------------

    @abc.abstractmethod
    def stop_claiming(self, reason: str = "stop requested") -> None:
        """Stop new claims; active tasks continue (D3)."""

    @abc.abstractmethod
    def _may_claim_next(self) -> int:
        """How many tasks a finishing step may lease for the slot it frees (D3)."""

    @abc.abstractmethod
    def _shutting_down(self) -> bool:
        """Whether a host shutdown began."""


_FAILURE_CODES = frozenset(
    {"invalid_task", "flow_failed", "cancelled", "deadline", "summary_failed", "escalation_give_up"}
)
