"""The ADR-0071 D4 worker functions: heartbeat, reap, claim-and-execute, tick.

These keep the records' signatures (plus ``registry=``) for callers that drive a worker one
tick at a time. ``claim_and_execute`` runs its claims one after another, as the record says;
the ``taskward worker`` process is the resident host instead (``taskward.host``), which claims
through the same ``claims.claim_runs`` and finishes through the same ``execution.settle_lease``.
Like the host, a completed run writes its summary (``LocalSummaryStore``, session key
``<task-id>:<attempt>``) before its completion is acknowledged (ADR-0037 D4).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
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
    Lease,
    WorkerSpec,
    claim_runs,
    new_worker_id,
)
from taskward.execution import RetryPolicy, execute_lease, settle_lease
from taskward.heartbeat import register_heartbeat
from taskward.host.models import SessionSummary, manifest_ref, summary_facts
from taskward.host.summaries import LocalSummaryStore
from taskward.maintenance.reaper import reap_expired_leases
from taskward.registry import CancellationToken, TaskAdapterRegistry, TaskExecutionResult
from taskward.settings import get_max_attempts
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
    with ``now``, so a summary written under injected time is stamped with it."""

    def __init__(self, db: StateDB, now: float) -> None:
        self._db = db
        self._now = now

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def transaction(self, *, now: float | None = None) -> AbstractAsyncContextManager[Tx]:
        return self._db.transaction(now=self._now if now is None else now)

    async def execute(self, name: str, params: Mapping[str, Any] | None = None) -> int:
        return await self._db.execute(name, {"now": self._now, **(params or {})})

    async def fetchone(self, name: str, params: Mapping[str, Any] | None = None) -> Row | None:
        return await self._db.fetchone(name, {"now": self._now, **(params or {})})

    async def fetchall(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        return await self._db.fetchall(name, {"now": self._now, **(params or {})})


async def write_summary(
    db: StateDB,
    lease: Lease,
    result: TaskExecutionResult,
    *,
    started_at: float,
    started_mono: float,
    now: float | None = None,
) -> TaskExecutionResult:
    """Write the complete summary of a completed run before its completion (ADR-0037 D4).

    Returns the result to acknowledge: the adapter's, citing the summary, or -- when the summary
    could not be written -- a retryable failure, never a completion without one (D4).
    """
    key = f"{lease.task_id}:{lease.attempt}"  # the run id (R10), as the host's session key
    facts = summary_facts(
        lease.task_id,
        lease.attempt,
        datetime.fromtimestamp(started_at, UTC),
        datetime.fromtimestamp(time.time(), UTC),
        (time.monotonic() - started_mono) * 1000,
        {
            "operation_statuses": {lease.action_kind: result.status},
            "artifact_refs": result.evidence_refs,
        },
    )
    summary = SessionSummary(
        facts=facts, narrative=None, manifest_ref=manifest_ref(lease.task_id, lease.attempt)
    )
    try:
        store = db if now is None else cast(StateDB, _AtTime(db, now))
        await LocalSummaryStore(store).write(key, summary)
    except Exception as exc:
        log.warning("task %s: summary %s not written: %r", lease.task_id, key, exc)
        return TaskExecutionResult(
            status="failed",
            retryable=True,
            exit_code=result.exit_code,
            error_detail=f"summary_failed: summary not written: {exc!r}",
            invocation_id=result.invocation_id,
            evidence_refs=list(result.evidence_refs),
        )
    return dataclasses.replace(
        result,
        evidence_refs=[*result.evidence_refs, {"kind": "summary", "session_key": key}],
    )


async def run_lease(
    db: StateDB,
    spec: WorkerSpec,
    lease: Lease,
    registry: TaskAdapterRegistry,
    *,
    token: CancellationToken,
    max_attempts: int,
    policy: RetryPolicy,
    now: float | None = None,
) -> str:
    """Execute one lease and settle it; returns the status the row ended in. A completed run
    writes its summary first (ADR-0037 D4)."""
    row = await db.fetchone("run_get", {"id": lease.task_id})
    assert row is not None
    started_at, started_mono = time.time(), time.monotonic()
    result = await execute_lease(registry, row, lease, cancellation=token)
    if result.status == "completed":
        result = await write_summary(
            db, lease, result, started_at=started_at, started_mono=started_mono, now=now
        )
    transition = await settle_lease(
        db, lease, result, actor=spec.actor, max_attempts=max_attempts, policy=policy, now=now
    )
    return transition.current_state


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
    run dispatches through ``registry`` (default: the built-in adapters).
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
    leases = await claim_runs(db, spec, limit=limit, now=now)
    if not leases:
        return 0
    max_attempts = await get_max_attempts(db)
    policy = retry_policy or RetryPolicy()
    tokens: dict[str, CancellationToken] = {}
    watcher = asyncio.create_task(watch_cancellations(db, lambda: tokens))
    try:
        for lease in leases:
            tokens[lease.task_id] = token = CancellationToken()
            status = await run_lease(
                db,
                spec,
                lease,
                registry,
                token=token,
                max_attempts=max_attempts,
                policy=policy,
                now=now,
            )
            tokens.pop(lease.task_id, None)
            log.info("task %s attempt %d -> %s", lease.task_id, lease.attempt, status)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    return len(leases)


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
    reaped = await reap_expired_leases(db, now=now, retry_policy=retry_policy)
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
