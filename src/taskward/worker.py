"""The ADR-0071 D4 worker functions: heartbeat, reap, claim-and-execute, tick.

Thin wrappers over the one runtime: ``claim_and_execute`` claims through ``LocalTaskSource``
(the claim the ``taskward worker`` process makes) and runs what it claimed, one task after
another, through the resident host (``ResidentEngineHost`` with one slot over the same
``AdapterRunner``): the host's watchdog, its summary before completion (ADR-0037 D4) and its
acknowledgements judged by database state (R4, the one outcome table). What differs from the
``taskward worker`` process is only the schedule: these keep the records' signatures (plus
``registry=``) for callers that drive a worker one tick at a time, and claim once per call.
An injected ``now`` (R9) is the time of every statement of the call and the host's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Any, cast

from taskward.adapters import build_registry
from taskward.cancellation import CANCEL_POLL_SECONDS, watch_cancellations
from taskward.claims import (
    CLAIM_CAP,
    DEFAULT_HEARTBEAT_TTL_SECONDS,
    DEFAULT_LEASE_TTL_SECONDS,
    WorkerSpec,
    new_worker_id,
)
from taskward.execution import RetryPolicy
from taskward.heartbeat import register_heartbeat
from taskward.host.engine_host import ResidentEngineHost
from taskward.host.models import Task, TaskAck, TaskFailure, TaskResult
from taskward.host.runner import AdapterRunner, TaskSession
from taskward.host.source import LocalTaskSource
from taskward.host.summaries import LocalSummaryStore
from taskward.maintenance import reap_expired_leases
from taskward.registry import CancellationToken, TaskAdapterRegistry, TaskExecutionResult
from taskward.store.port import Row, StateDB, Tx

__all__ = [
    "CANCEL_POLL_SECONDS",
    "DEFAULT_HEARTBEAT_TTL_SECONDS",
    "DEFAULT_LEASE_TTL_SECONDS",
    "ExecuteFn",
    "claim_and_execute",
    "new_worker_id",
    "reap_expired_leases",
    "register_heartbeat",
    "worker_tick",
]

log = logging.getLogger("taskward.worker")

ExecuteFn = Callable[[dict[str, Any]], Awaitable[tuple[int, str]]]


class _LegacyExecuteAdapter:
    """Wraps an ADR-0071 ``ExecuteFn`` (row -> (exit code, output)) as an adapter."""

    def __init__(self, kind: str, execute: ExecuteFn) -> None:
        self.action_kind = kind
        self._execute = execute

    def validate_args(self, args: dict[str, Any]) -> None:
        return None

    async def execute(
        self, task: dict[str, Any], *, cancellation: CancellationToken
    ) -> TaskExecutionResult:
        try:
            code, output = await self._execute(task)
        except Exception as exc:  # build/resolve errors become (1, error) (ADR-0071 D4)
            code, output = 1, f"{type(exc).__name__}: {exc}"
        if code == 0:
            return TaskExecutionResult(status="completed", exit_code=0)
        return TaskExecutionResult(status="failed", exit_code=code, error_detail=output)


class _AtTime:
    """The store as seen at one injected time (R9): every transaction and single statement runs
    with ``now``, so whatever the call writes is stamped with it."""

    def __init__(self, db: StateDB, now: float) -> None:
        self._db = db
        self._now = now

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def transaction(self, *, now: float | None = None) -> AbstractAsyncContextManager[Tx]:
        return self._db.transaction(now=self._now if now is None else now)

    async def now(self) -> float:
        return self._now

    async def execute(self, name: str, params: Mapping[str, Any] | None = None) -> int:
        return await self._db.execute(name, {"now": self._now, **(params or {})})

    async def fetchone(self, name: str, params: Mapping[str, Any] | None = None) -> Row | None:
        return await self._db.fetchone(name, {"now": self._now, **(params or {})})

    async def fetchall(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        return await self._db.fetchall(name, {"now": self._now, **(params or {})})


class _Claimed:
    """The tasks one call claimed, handed to the host one per free slot; then none, and the
    host stops claiming (no second claim in one call). Acknowledgements go to the source (the
    two-step finish: summary, then completion, with no next claim for the freed slot)."""

    def __init__(self, source: LocalTaskSource, tasks: list[Task]) -> None:
        self._source = source
        self._tasks = tasks
        self.host: ResidentEngineHost | None = None

    async def claim_many(self, limit: int) -> list[Task]:
        handed, self._tasks = self._tasks[:limit], self._tasks[limit:]
        if not handed and self.host is not None:
            self.host.stop_claiming("claimed tasks done")
        return handed

    async def claim(self) -> Task | None:
        tasks = await self.claim_many(1)
        return tasks[0] if tasks else None

    async def complete(self, task_id: str, lease_id: str, result: TaskResult) -> TaskAck:
        return await self._source.complete(task_id, lease_id, result)

    async def fail(self, task_id: str, lease_id: str, failure: TaskFailure) -> TaskAck:
        return await self._source.fail(task_id, lease_id, failure)


async def claim_and_execute(
    db: StateDB,
    *,
    worker_id: str,
    execute: ExecuteFn | None = None,
    now: float | None = None,
    lease_ttl: float = DEFAULT_LEASE_TTL_SECONDS,
    limit: int = CLAIM_CAP,
    advertised_capabilities: list[str] | None = None,
    execution_targets: list[str] | None = None,
    heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL_SECONDS,
    registry: TaskAdapterRegistry | None = None,
    retry_policy: RetryPolicy | None = None,
) -> int:
    """Claim up to ``limit`` runs and execute them one after another; returns how many ran.

    With ``execute`` (the ADR-0071 form) every claimed kind runs through it; otherwise each
    run dispatches through ``registry`` (default: the built-in adapters). A completed run's
    summary (session key ``<task-id>:<attempt>``) is written before its completion is
    acknowledged (ADR-0037 D4).
    """
    registry = registry if registry is not None else build_registry()
    if execute is not None:
        legacy = TaskAdapterRegistry()
        for kind in registry.kinds():
            legacy.register(_LegacyExecuteAdapter(kind, execute))
        registry = legacy
    spec = WorkerSpec(
        worker_id=worker_id,
        kinds=registry.kinds(),
        execution_targets=execution_targets or ["host"],
        capabilities=advertised_capabilities or [],
        lease_ttl=lease_ttl,
        heartbeat_ttl=heartbeat_ttl,
    )
    store = db if now is None else cast(StateDB, _AtTime(db, now))
    source = LocalTaskSource(store, spec, retry_policy=retry_policy, registry=registry)
    tasks = await source.claim_many(limit)
    if not tasks:
        return 0
    claimed = _Claimed(source, tasks)
    host = ResidentEngineHost(
        source=claimed,
        summaries=LocalSummaryStore(store),
        max_concurrent_tasks=1,
        session_factory=TaskSession,
        run_task=AdapterRunner(registry, source),
        clock=(lambda: datetime.now(UTC))
        if now is None
        else (lambda: datetime.fromtimestamp(now, UTC)),
        on_event=_log_end,
    )
    claimed.host = host
    watcher = asyncio.create_task(watch_cancellations(db, lambda: source.tokens))
    try:
        await host.serve()
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    return len(tasks)


def _log_end(kind: str, task: Task, data: dict[str, Any]) -> None:
    if kind == "end":
        log.info("task %s attempt %d -> %s", task.id, task.attempt, data.get("outcome"))


async def worker_tick(
    db: StateDB,
    *,
    worker_id: str,
    execute: ExecuteFn | None = None,
    now: float | None = None,
    lease_ttl: float = DEFAULT_LEASE_TTL_SECONDS,
    limit: int = CLAIM_CAP,
    advertised_capabilities: list[str] | None = None,
    execution_targets: list[str] | None = None,
    heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL_SECONDS,
    registry: TaskAdapterRegistry | None = None,
    retry_policy: RetryPolicy | None = None,
) -> dict[str, int]:
    """Heartbeat first, reap expired leases second, claim and execute third (ADR-0071 D4)."""
    registry = registry if registry is not None else build_registry()
    await register_heartbeat(
        db,
        worker_id=worker_id,
        advertised_capabilities=advertised_capabilities,
        execution_targets=execution_targets,
        now=now,
        served_kinds=registry.kinds(),
    )
    reaped = await reap_expired_leases(db, now=now, retry_policy=retry_policy, registry=registry)
    executed = await claim_and_execute(
        db,
        worker_id=worker_id,
        execute=execute,
        now=now,
        lease_ttl=lease_ttl,
        limit=limit,
        advertised_capabilities=advertised_capabilities,
        execution_targets=execution_targets,
        heartbeat_ttl=heartbeat_ttl,
        registry=registry,
        retry_policy=retry_policy,
    )
    return {
        "reaped": reaped["expired"],
        "requeued": reaped["queued"],
        "failed": reaped["failed"],
        "executed": executed,
    }
