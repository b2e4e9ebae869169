"""ResidentEngineHost (ADR-0037 D3-D5): the serve loop and its slots — claiming, idle waits and
their wake-ups, shutdown and drain. What one job does with its task (the precheck, the run under
the watchdog, the summary before the completion, the one-step finish, the failure report) is
``host/job.py``'s ``HostJobs``, this class's base; its names are re-exported here.

Rules enforced here:
- never more than ``max_concurrent_tasks`` leases held, and no prefetch (D3): a claim is made
  only for a free slot (a source with ``claim_many(n)`` is asked for at most the free slots),
  and a finishing step leases at most one task for the slot it frees, none once claiming
  stopped (``_may_claim_next``), which the same job then runs (``_job``);
- a store that is away (``StoreUnavailable``) fails no task: claims back off and retry;
- a host shutdown (``serve`` cancelled) stops claiming and cancels the jobs still running their
  task, never one acknowledging it (``HostJobs._settling``); each reports a retryable failure;
- ``should_stop_claiming`` stops new claims without cancelling active tasks; ``drain()``
  returns once every active job's acknowledgement path has settled (D3, D5);
- with a source that renews leases (``RenewsLeases``, protocol version two, R25), every held
  lease is renewed every ``renew_every_s`` while ``serve`` runs, drain included; a renewal that
  loses means another may run the task: its run is stopped (``_lease_lost``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from taskward.host.job import _FAILURE_CODES as _FAILURE_CODES  # importable here, as before
from taskward.host.job import (
    CWD_CHECK_CACHE,
    CWD_CHECK_TTL_S,
    HostJobs,
    HostStats,
    RunTask,
    Summarize,
    manifest_ref_for,
    session_key_for,
)
from taskward.host.models import Task, TaskAck
from taskward.host.ports import RenewsLeases, SummaryStore, TaskSource
from taskward.loops import raise_if_cancelling
from taskward.store.retry import STORE_BACKOFF, Streak

log = logging.getLogger("taskward.host")  # the host's logger, shared with ``job``

DEFAULT_IDLE_WAIT_S = 0.5
SHUTDOWN_GRACE_S = 10.0
# How long a run whose lease was lost (R25) may take to stop on its own (a source may stop it
# cooperatively: LocalTaskSource cancels its token) before the host cancels its job: longer than
# the process adapter's SIGTERM -> SIGKILL grace (5 s), as the watchdog's grace is.
LEASE_LOST_GRACE_S = 7.0


def _resolve(wake: asyncio.Future[Any], _: object = None) -> None:
    if not wake.done():
        wake.set_result(None)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark an abandoned wait's outcome as seen: a source's error there is not a host error
    (the next claim meets the store as it is), and must not be logged as never retrieved."""
    if not task.cancelled():
        task.exception()


class ResidentEngineHost(HostJobs):
    """Claims only for free slots and runs each claimed task in a job of its own (what the job
    does is ``HostJobs``); ``serve`` until claiming stops, then ``drain`` (D3, D5)."""

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
        renew_every_s: float | None = None,
        lease_lost_grace_s: float = LEASE_LOST_GRACE_S,
    ) -> None:
        if isinstance(max_concurrent_tasks, bool) or not isinstance(max_concurrent_tasks, int):
            raise TypeError("max_concurrent_tasks must be an int")
        if max_concurrent_tasks < 1:
            raise ValueError("max_concurrent_tasks must be at least 1")
        if renew_every_s is not None and not renew_every_s > 0:
            raise ValueError(f"renew_every_s must be above 0, not {renew_every_s!r}")
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
        # R25: None takes the source's own interval (``RenewsLeases``), if it has one.
        self.renew_every_s = renew_every_s
        self.lease_lost_grace_s = lease_lost_grace_s
        super().__init__()  # the jobs' own state: ``stats``, the settling jobs, the cwd cache
        self._active: dict[asyncio.Task[None], Task] = {}
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

    # -- public ----------------------------------------------------------------------------

    @property
    def active_count(self) -> int:
        return len(self._active)

    @property
    def claim_settled(self) -> bool:
        """No claim pass is in flight (one in flight may still hand this host tasks)."""
        return self._claims_settled.is_set()

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
        claiming and cooperatively cancels active jobs, which report a retryable failure. Held
        leases are renewed meanwhile when the source renews them (R25)."""
        self._serving = asyncio.current_task()
        renewing = self._start_renewing()
        try:
            await self._serve()
        finally:
            if renewing is not None:
                renewing.cancel()
                await asyncio.wait({renewing})

    async def _serve(self) -> None:
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

    # -- renewal (protocol version two, R25) ------------------------------------------------

    def _renewal_interval(self) -> float | None:
        if not isinstance(self.source, RenewsLeases):
            return None
        if self.renew_every_s is not None:
            return self.renew_every_s
        every = getattr(self.source, "renew_every_s", None)
        return float(every) if isinstance(every, int | float) and every > 0 else None

    def _start_renewing(self) -> asyncio.Task[None] | None:
        every = self._renewal_interval()
        if every is None:
            return None
        return asyncio.create_task(self._renew_every(every))

    async def _renew_every(self, every_s: float) -> None:
        """``renew_leases`` every ``every_s`` until cancelled (``serve``'s end). The passes
        keep their cadence: a slow pass (a slow store) shortens the wait after it, never
        lengthens the gap between renewals."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            due = max(due + every_s, loop.time())
            await asyncio.sleep(due - loop.time())
            try:
                await self.renew_leases()
            except Exception as exc:  # never ends the loop: the next pass tries again
                self._keep_error(f"lease renewal pass failed: {exc!r}")

    async def renew_leases(self) -> int:
        """One renewal pass (R25): the lease of every task a job holds, renewed at once.
        Returns the leases renewed.

        A renewal that fails (the store is away) is kept as an error and tried at the next
        pass: renewals come a fraction of a lease apart. One answered ``stale_lease`` or
        ``missing_holder`` means the lease is no longer this host's (it lapsed and was reaped or
        reclaimed): its run is stopped (``_lease_lost``), its acknowledgement will be refused.
        An answer about a task its job no longer holds, or is acknowledging (it may have been
        acknowledged meanwhile), counts for nothing.
        """
        source = self.source
        if not isinstance(source, RenewsLeases):
            return 0
        # A job that is summarizing or acknowledging is left out: its acknowledgement may
        # commit first, and a renewal after it would read as a lost lease for a finished run.
        # So is a run whose lease was already found lost: it is stopping (_lease_lost), and
        # asking again would count and log the one loss once a pass until it stops.
        held = [
            (job, task)
            for job, task in self._active.items()
            if not job.done() and job not in self._settling_jobs and job not in self._lost_runs
        ]
        if not held:
            return 0
        answers = await asyncio.gather(
            *(source.renew(task.id, task.lease_id) for _, task in held), return_exceptions=True
        )
        renewed = 0
        for (job, task), answer in zip(held, answers, strict=True):
            if isinstance(answer, BaseException):
                self._keep_error(f"task {task.id}: lease renewal failed: {answer!r}")
            elif answer.applied:
                renewed += 1
            elif (
                self._active.get(job) is task and not job.done() and job not in self._settling_jobs
            ):
                self._lease_lost(job, task, answer)
        self.stats.renewed += renewed
        return renewed

    def _lease_lost(self, job: asyncio.Task[None], task: Task, ack: TaskAck) -> None:
        """A renewal found ``task``'s lease lost: whatever its run does now is refused (R4).
        The run gets ``lease_lost_grace_s`` to stop on its own (a source may stop it
        cooperatively); then the host cancels its job if the run is still under way (never a
        job that is summarizing or acknowledging: the row judges that acknowledgement)."""
        self.stats.leases_lost += 1
        log.warning(
            "task %s: lease %s lost (%s): stopping it", task.id, task.lease_id, ack.rejection
        )
        self._emit("lease_lost", task, ack=ack)
        self._lost_runs[job] = task
        asyncio.get_running_loop().call_later(
            self.lease_lost_grace_s, self._stop_lost_run, job, task
        )

    def _stop_lost_run(self, job: asyncio.Task[None], task: Task) -> None:
        if self._runs.get(job) is task and not job.done():
            job.cancel()

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

    # -- slots: one job per claimed task ---------------------------------------------------

    def _start(self, task: Task) -> None:
        job = asyncio.ensure_future(self._job(task))
        self._active[job] = task
        job.add_done_callback(self._job_done)

    def _job_done(self, job: asyncio.Task[None]) -> None:
        self._active.pop(job, None)
        self._lost_runs.pop(job, None)
        if self._waiting_for_slot:
            self._wake_serve()
        if not job.cancelled() and job.exception() is not None:
            self._keep_error(f"host job crashed: {job.exception()!r}")

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

    def _shutting_down(self) -> bool:
        """A shutdown began: ``serve`` was cancelled, even if its handler has not run yet."""
        serving = self._serving
        return self._shutdown or (serving is not None and serving.cancelling() > 0)


__all__ = [
    "CWD_CHECK_CACHE",
    "CWD_CHECK_TTL_S",
    "DEFAULT_IDLE_WAIT_S",
    "LEASE_LOST_GRACE_S",
    "SHUTDOWN_GRACE_S",
    "HostStats",
    "ResidentEngineHost",
    "RunTask",
    "Summarize",
    "manifest_ref_for",
    "session_key_for",
]
