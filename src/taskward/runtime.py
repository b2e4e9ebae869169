"""The ``taskward worker`` runtime: a ResidentEngineHost over LocalTaskSource whose runner
dispatches through the adapter registry, plus heartbeats, reapers and cancellation forwarding;
with ``renew`` the host renews the leases it holds (R25: the source's ``lease_ttl / 3``).

One worker runtime with bounded concurrency (DESIGN.md "One system, not three"). Signals: the
first SIGTERM/SIGINT drains (stop claiming, finish active tasks, exit 0); a second one cancels
the active tasks cooperatively (each reports a retryable failure, R10). Memory pressure stops
claiming, drains and exits with ``EXIT_MEMORY_PRESSURE`` for the supervisor to restart.

A store that is away (``StoreUnavailable``) stops nothing: every loop here (heartbeat, reapers,
cancellation forwarding, outbox, scheduler, burst watch) backs off exponentially with jitter and
carries on, and the host retries claims, summaries and acknowledgements until the store is back
(``taskward.store.retry``). No task fails because the store was away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from taskward.cancellation import watch_cancellations
from taskward.claims import (
    DEFAULT_HEARTBEAT_TTL_SECONDS,
    DEFAULT_LEASE_SLACK_SECONDS,
    DEFAULT_LEASE_TTL_SECONDS,
    DEFAULT_TASK_TIMEOUT_SECONDS,
    WorkerSpec,
    new_worker_id,
)
from taskward.execution import RetryPolicy
from taskward.heartbeat import mark_worker_stopped, register_heartbeat
from taskward.host.engine_host import ResidentEngineHost
from taskward.host.models import Task
from taskward.host.runner import AdapterRunner, TaskSession
from taskward.host.source import LocalTaskSource
from taskward.host.summaries import LocalSummaryStore
from taskward.loops import raise_if_cancelling
from taskward.maintenance import (
    DEFAULT_DEADLINE_GRACE_SECONDS,
    DeadlineReaper,
    LeaseReaper,
    Maintenance,
)
from taskward.metrics import TaskMetrics
from taskward.outbox import OutboxConfig, OutboxDeliverer
from taskward.registry import TaskAdapterRegistry
from taskward.schedules import Scheduler
from taskward.store.port import StateDB
from taskward.store.retry import STORE_BACKOFF, Streak, loop_backoff, retry_while_unavailable

log = logging.getLogger("taskward.runtime")

EXIT_OK: Final = 0
EXIT_MEMORY_PRESSURE: Final = 75  # EX_TEMPFAIL: restart me


def resident_memory_mb() -> float:
    """Current resident set size of this process (Linux /proc), in MiB."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)
    except (OSError, ValueError, IndexError):
        return 0.0


# The maintenance loop's wake-up after a due time (a lease expires strictly after its
# lease_expires_at, R6), and the least it waits between passes (the CLI's --reap-interval floor):
# a pass that left due rows behind (REAP_BATCH a pass) runs again this soon, never in a spin.
DUE_MARGIN_S: Final = 0.01
MIN_MAINTENANCE_WAIT_S: Final = 0.05


def maintenance_wait(interval_s: float, due_in: float | None) -> float:
    """Seconds until the next maintenance pass: ``interval_s``, or sooner when the next lease
    expiry or retry (``due_in`` seconds away, ``Maintenance.next_due``) comes first; never
    less than ``MIN_MAINTENANCE_WAIT_S`` (nor more than ``interval_s``)."""
    if due_in is None:
        return interval_s
    return min(interval_s, max(MIN_MAINTENANCE_WAIT_S, due_in + DUE_MARGIN_S))


@dataclass
class WorkerConfig:
    concurrency: int = 8
    capabilities: tuple[str, ...] = ()
    execution_targets: tuple[str, ...] = ("host",)
    worker_id: str = field(default_factory=new_worker_id)
    lease_ttl: float = DEFAULT_LEASE_TTL_SECONDS
    heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL_SECONDS
    heartbeat_interval_s: float = 10.0
    reap_interval_s: float = 1.0
    default_timeout_s: float = DEFAULT_TASK_TIMEOUT_SECONDS
    lease_slack_s: float = DEFAULT_LEASE_SLACK_SECONDS
    # R25: renew held leases (every lease_ttl / 3), so a claim grants lease_ttl alone and a
    # crashed worker's task is recovered within about lease_ttl, however long the task runs.
    renew: bool = False
    deadline_grace_s: float = DEFAULT_DEADLINE_GRACE_SECONDS
    idle_wait_s: float = 0.5
    cancel_poll_s: float = 1.0
    memory_limit_mb: float | None = None
    # The backoff of retries whose kind sets none of its own (R18: a kind's wins).
    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)
    cwd: Path | None = None
    exit_when_idle: bool = False  # drain and exit once no claimable work is left (--burst)
    run_scheduler: bool = True  # evaluate due schedules and admit their fires (R13)
    scheduler_interval_s: float = 1.0
    deliver_outbox: bool = True  # run an outbox deliverer (ADR-0072 D6) in this worker
    outbox: OutboxConfig | None = None  # None: targets from the environment (docs/outbox.md)


class WorkerRuntime:
    def __init__(
        self,
        db: StateDB,
        registry: TaskAdapterRegistry,
        config: WorkerConfig,
        *,
        on_event: Callable[[str, Task, dict[str, Any]], None] | None = None,
        metrics: TaskMetrics | None = None,
    ) -> None:
        self.db = db
        # This process's metrics (taskward.metrics), recorded through the store by the source,
        # the reaper, the deliverer and admission: ``metrics``, else the store's (a process
        # that already set one, e.g. ``taskward up``'s app), else a new registry of its own.
        if metrics is None:
            metrics = db.metrics if db.metrics is not None else TaskMetrics()
        db.metrics = self.metrics = metrics
        self.registry = registry
        self.config = config
        self.spec = WorkerSpec(
            worker_id=config.worker_id,
            kinds=registry.kinds(),
            execution_targets=config.execution_targets,
            capabilities=config.capabilities,
            lease_ttl=config.lease_ttl,
            heartbeat_ttl=config.heartbeat_ttl,
            default_timeout_s=config.default_timeout_s,
            lease_slack_s=config.lease_slack_s,
            renews=config.renew,
        )
        # One group commit for both: a task's summary, completion and the next claim for its
        # slot are one step (LocalTaskSource.complete_with_summary).
        self.summaries = LocalSummaryStore(db)
        self.source = LocalTaskSource(
            db,
            self.spec,
            retry_policy=config.retry_policy,
            cwd=config.cwd,
            summaries=self.summaries,
            registry=registry,
        )
        self.outbox = (
            OutboxDeliverer(db, config.outbox or OutboxConfig.from_env(), owner=config.worker_id)
            if config.deliver_outbox
            else None
        )
        self.maintenance = Maintenance(
            leases=LeaseReaper(retry_policy=config.retry_policy, registry=registry),
            deadlines=DeadlineReaper(
                grace_s=config.deadline_grace_s, heartbeat_ttl=config.heartbeat_ttl
            ),
        )
        self.exit_code = EXIT_OK
        self._idle_passes = 0
        self.host = ResidentEngineHost(
            source=self.source,
            summaries=self.summaries,
            max_concurrent_tasks=config.concurrency,
            session_factory=TaskSession,
            run_task=AdapterRunner(registry, self.source),
            should_stop_claiming=self._should_stop_claiming,
            idle_wait_s=config.idle_wait_s,
            on_event=on_event,
        )
        self._signals = 0
        self._draining = False
        self._cancelling = False
        self._serve: asyncio.Task[None] | None = None

    @property
    def worker_id(self) -> str:
        return self.config.worker_id

    def _should_stop_claiming(self) -> bool:
        limit = self.config.memory_limit_mb
        if limit is not None and resident_memory_mb() > limit:
            log.warning("resident memory above %.0f MiB: draining for a restart", limit)
            self.exit_code = EXIT_MEMORY_PRESSURE
            return True
        return False

    async def heartbeat(self) -> None:
        active = self.host.active_tasks
        await register_heartbeat(
            self.db,
            worker_id=self.worker_id,
            advertised_capabilities=list(self.config.capabilities),
            execution_targets=list(self.config.execution_targets),
            served_kinds=self.registry.kinds(),
            concurrency=self.config.concurrency,
            leased_run_id=active[0].id if active else None,
        )

    async def maintain_once(self) -> dict[str, int]:
        """One pass of every maintenance service (``taskward.maintenance``), in its order."""
        return await self.maintenance.run_once(self.db)

    async def _every(
        self,
        interval_s: float,
        action: Callable[[], Any],
        name: str,
        *,
        next_wait: Callable[[Any], float] | None = None,
    ) -> None:
        """Run ``action`` every ``interval_s`` (or, with ``next_wait``, after the wait it
        makes of the action's result); after a failure (the store may be away) wait longer
        each time, up to ``LOOP_CAP_S``, and carry on."""
        streak = Streak(loop_backoff(interval_s), what=name, logger=log)
        while True:
            raise_if_cancelling()
            try:
                result = await action()
            except Exception as exc:
                await asyncio.sleep(streak.failed(exc))
                continue
            streak.succeeded()
            await asyncio.sleep(interval_s if next_wait is None else next_wait(result))

    async def _maintain_once_timed(self) -> float | None:
        """A maintenance pass, then how long until the next lease expiry or retry is due
        (``Maintenance.next_due``). The reaper's loop waits ``maintenance_wait`` of it: an
        orphaned task is reaped as its lease expires (R6) and queued again as its backoff ends
        (R18), not up to an interval after each (issue 27's kill storm: recovery within lease +
        backoff, plus the store's latency)."""
        await self.maintain_once()
        due_in: float | None = await self.maintenance.next_due(self.db)
        return due_in

    async def _supervised(self, run: Callable[[], Any], name: str) -> None:
        """Keep a long-running loop alive: restart it, with backoff, if it ever raises."""
        streak = Streak(loop_backoff(self.config.idle_wait_s), what=name, logger=log)
        while True:
            raise_if_cancelling()
            try:
                await run()
            except Exception as exc:
                await asyncio.sleep(streak.failed(exc))

    async def _burst_watch(self) -> None:
        """With exit_when_idle: stop claiming once a claim pass finds nothing and no task runs.

        Invariant: the host was idle for the whole check -- no task active and no claim pass in
        flight before and after it, and no task claimed while it ran. A claim in flight holds
        its rows' locks (the check's read skips them) and has not yet made its task active, and
        the task it claims may queue work when it ends (a dependent, R21): a check it overlaps
        decides nothing."""
        host = self.host
        while True:
            raise_if_cancelling()
            await asyncio.sleep(self.config.idle_wait_s)
            if host.active_count or not host.claim_settled:
                continue
            claimed = host.stats.claimed
            if not await retry_while_unavailable(
                self._has_claimable, what="burst idle check", logger=log
            ) and (host.active_count == 0 and host.claim_settled and host.stats.claimed == claimed):
                host.stop_claiming("idle")
                return

    async def _has_claimable(self) -> bool:
        from taskward.claims import find_candidates

        # any retry_wait row will come back: burst mode waits for it, and for a task waiting
        # on a running dependency (R21: that dependency's end queues it, possibly in the
        # acknowledgement of a task this worker just ran); a delayed row (R16) not yet due does
        # not keep a burst worker (its queue is drained of what is due)
        due = await self.db.fetchall("run_due_retries", {"now": float("inf"), "limit": 1})
        if not due:
            due = await self.db.fetchall("run_waiting_on_running", {})
        return bool(due) or bool(
            await find_candidates(self.db, self.spec, limit=1, now=await self.db.now())
        )

    def drain(self, reason: str = "signal") -> None:
        """Stop claiming; active tasks run to their end and are acknowledged. Idempotent and
        never cancels: ``taskward up`` calls it when either of its halves ends, on top of the
        first signal, and only a second *signal* may cancel (``request_stop``)."""
        if not self._draining:
            self._draining = True
            log.info("draining %d active task(s)", self.host.active_count)
        self.host.stop_claiming(reason)

    def cancel_active(self) -> None:
        """Cancel the active tasks cooperatively: each reports a retryable failure (R10,
        ``host_shutdown``) and goes back to the queue. Idempotent."""
        if not self._cancelling:
            self._cancelling = True
            log.info("cancelling %d active task(s)", self.host.active_count)
        self.host.stop_claiming("signal")
        if self._serve is not None:
            self._serve.cancel()

    def request_stop(self) -> None:
        """A stop signal: the first drains (``drain``), a second cancels (``cancel_active``).

        Invariant: only signals are counted here; every other stop (the HTTP half of ``up``
        ending, memory pressure, --burst) drains through ``drain`` and never escalates."""
        self._signals += 1
        if self._signals == 1:
            self.drain("signal")
        else:
            self.cancel_active()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)

    async def run(self) -> int:
        """Serve until drained; returns the process exit code."""
        await retry_while_unavailable(
            self.heartbeat,
            what="first heartbeat",
            backoff=STORE_BACKOFF,
            budget_s=self.config.heartbeat_ttl,
            logger=log,
        )
        background = [
            asyncio.create_task(
                self._every(self.config.heartbeat_interval_s, self.heartbeat, "heartbeat")
            ),
            asyncio.create_task(
                self._every(
                    self.config.reap_interval_s,
                    self._maintain_once_timed,
                    "reaper",
                    next_wait=lambda due_in: maintenance_wait(self.config.reap_interval_s, due_in),
                )
            ),
            asyncio.create_task(
                self._supervised(
                    lambda: watch_cancellations(
                        self.db, lambda: self.source.tokens, poll_s=self.config.cancel_poll_s
                    ),
                    "cancellation forwarding",
                )
            ),
        ]
        if self.outbox is not None:
            background.append(
                asyncio.create_task(
                    self._every(self.outbox.config.poll_interval_s, self.outbox.run_once, "outbox")
                )
            )
        if self.config.run_scheduler:
            scheduler = Scheduler(self.db, self.registry)
            background.append(
                asyncio.create_task(
                    self._every(self.config.scheduler_interval_s, scheduler.run_once, "scheduler")
                )
            )
        if self.config.exit_when_idle:
            background.append(asyncio.create_task(self._burst_watch()))
        self._serve = asyncio.create_task(self.host.serve())
        if self._cancelling:  # cancelled before the host started serving
            self._serve.cancel()
        try:
            await self._serve
        except asyncio.CancelledError:
            if not self._cancelling:  # cancelled from outside, not by cancel_active
                raise
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            with contextlib.suppress(Exception):
                if self.outbox is not None:
                    await self.outbox.aclose()  # its HTTP connections
            with contextlib.suppress(Exception):
                # A clean stop, not a last heartbeat: the row says "stopped" at once (a --burst
                # worker no longer shows live for a heartbeat TTL after it exited), never
                # "stale", which is kept for a worker that vanished without this (issue 28).
                await mark_worker_stopped(self.db, worker_id=self.worker_id)
        return self.exit_code
