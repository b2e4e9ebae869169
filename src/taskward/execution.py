"""Run a leased task through its adapter and write its one guarded terminal transition.

Shared by the ADR-0071 worker functions and the resident host's local task source. Adapters
never change status: they return a TaskExecutionResult, and ``finish_run`` turns it into one
transition guarded by the lease (ADR-0072 D4). When the guard loses, the result is kept only as
a ``stale_result`` event — diagnostic evidence, never a fact.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, Literal

from taskward.canonical import dumps
from taskward.capabilities import serialization_tokens
from taskward.claims import Lease
from taskward.groupcommit import GroupCommit
from taskward.ids import new_id
from taskward.models import Actor, TransitionResult
from taskward.oslocks import LockTimeout, machine_locks
from taskward.registry import (
    ADAPTER_FAILURE_CODES,
    Backoff,
    CancellationToken,
    TaskAdapterRegistry,
    TaskExecutionResult,
)
from taskward.results import dependency_results
from taskward.store.port import Row, StateDB
from taskward.transitions import TerminalBuild, finished, transition_at

log = logging.getLogger("taskward.execution")

MAX_ERROR_DETAIL: Final = 4000
# Longer than the process adapter's own SIGTERM->SIGKILL grace (5 s), so a watchdog stop lets
# the adapter finish killing its process group before the job itself is cancelled.
DEADLINE_CANCEL_GRACE_S: Final = 7.0


# The worker's backoff for retry_wait (ADR-0072 D5) under its earlier name: ``registry.Backoff``
# (``taskward.Backoff``), also what a kind may set of its own (R18).
RetryPolicy = Backoff


@dataclass(frozen=True)
class Outcome:
    """The transition a result maps to."""

    to_state: str
    reason_code: str
    summary: str
    patch: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)


def _detail(text: str | None) -> str | None:
    if text is None:
        return None
    return text if len(text) <= MAX_ERROR_DETAIL else "..." + text[-MAX_ERROR_DETAIL:]


# The host's failure codes (ADR-0037 D5) whose retry keeps the code as its reason.
_OWN_RETRY_REASONS: Final = frozenset({"summary_failed", "invalid_task"})


@dataclass(frozen=True)
class Report:
    """How an attempt ended, whoever says so: the adapter's own ``TaskExecutionResult`` or the
    resident host's ``TaskFailure`` (``cause``: its code, ADR-0037 D5; None for an adapter's
    result). The one input of the one outcome table, ``outcome_for``."""

    status: Literal["completed", "failed", "timed_out", "cancelled"]
    retryable: bool = False
    exit_code: int | None = None
    detail: str | None = None
    invocation_id: str | None = None
    cause: str | None = None
    # The adapter's own reason for a failure (``ADAPTER_FAILURE_CODES``, R22), else None.
    failure_code: str | None = None

    @classmethod
    def of(cls, result: TaskExecutionResult) -> Report:
        return cls(
            result.status,
            result.retryable,
            result.exit_code,
            result.error_detail,
            result.invocation_id,
            None,
            _failure_code(result),
        )

    @classmethod
    def of_failure(
        cls, code: str, detail: str, retryable: bool, execution: TaskExecutionResult | None
    ) -> Report:
        """The host's failure ``code`` (what the adapter reported, if it ran, supplies the exit
        code and invocation id): a ``deadline`` is a timeout, ``cancelled`` a cancellation (a
        host shutdown when retryable, R10), anything else a failure."""
        status: Literal["failed", "timed_out", "cancelled"] = (
            "timed_out" if code == "deadline" else "cancelled" if code == "cancelled" else "failed"
        )
        return cls(
            status,
            retryable,
            execution.exit_code if execution else None,
            detail,
            execution.invocation_id if execution else None,
            code,
            _failure_code(execution) if execution and execution.status == "failed" else None,
        )


def _failure_code(result: TaskExecutionResult) -> str | None:
    code = result.failure_code
    return code if code is not None and code in ADAPTER_FAILURE_CODES else None


def outcome_for(
    result: TaskExecutionResult | Report,
    lease: Lease,
    *,
    max_attempts: int,
    cancel_requested: bool,
    now: float,
    policy: RetryPolicy,
) -> Outcome:
    """The one table from how an attempt ended to its transition (ADR-0072 D4/D5, R5, R10),
    for the ADR-0071 worker functions and the resident host alike.

    | ended                                  | transition                                     |
    |----------------------------------------|------------------------------------------------|
    | completed                              | completed (completed)                          |
    | cancelled, request recorded            | cancelled (cancel_acknowledged)                |
    | cancelled, no request                  | failed (execution_failed)                      |
    | host shutdown (cancelled, retryable)   | retry_wait due now (host_shutdown), R10        |
    | retryable, attempts remain             | retry_wait after backoff (deadline_exceeded    |
    |                                        | for a timeout, else the host's summary_failed/ |
    |                                        | invalid_task, else retryable_failure)          |
    | retryable, at the ceiling              | timed_out / failed (attempt_ceiling), R5       |
    | timed out, not retryable               | timed_out (deadline_exceeded)                  |
    | failed, not retryable                  | failed (invalid_task, the adapter's own code:  |
    |                                        | result_not_serializable, R22; else             |
    |                                        | execution_failed)                              |

    Only the watchdog's deadline is retryable by rule (R5: it reports ``retryable=True``); an
    adapter's own ``timed_out`` is terminal unless the adapter marks it retryable (D4), as an
    ``@taskward.task`` kind does for the exceptions of its ``retry_on`` (R18). ``policy``: the
    backoff of the task's kind when it sets one (R18), else the worker's."""
    report = result if isinstance(result, Report) else Report.of(result)
    # What the fact's summary says: the host's code before its detail.
    said = f"{report.cause}: {report.detail}" if report.cause else report.detail
    terminal_patch: dict[str, Any] = {  # transitions.finish.FINISH_PATCH's order
        "ended_at": now,
        "exit_code": report.exit_code,
        "error_detail": _detail(said if report.retryable else report.detail),
        "invocation_id": report.invocation_id,
    }
    if report.status == "completed":
        return Outcome("completed", "completed", "adapter completed", terminal_patch)
    # An adapter's own ``cancelled`` is never retried, whatever it says (ADR-0072 D5: it answers
    # a cancellation request); only the host's retryable ``cancelled`` (a shutdown) is.
    if report.retryable and (report.status != "cancelled" or report.cause == "cancelled"):
        if report.cause == "cancelled" and lease.attempt < max_attempts:
            # R10: a host shutdown is retryable and the retry is due at once.
            return Outcome(
                "retry_wait",
                "host_shutdown",
                report.detail or "host shutdown",
                {
                    "retry_at": now,
                    "leased_by": None,
                    "lease_expires_at": None,
                    "exit_code": report.exit_code,
                    "error_detail": _detail(report.detail),
                },
            )
        code = "deadline_exceeded" if report.status == "timed_out" else "retryable_failure"
        if lease.attempt < max_attempts:
            reason = report.cause if report.cause in _OWN_RETRY_REASONS else code
            return Outcome(
                "retry_wait",
                str(reason),
                f"attempt {lease.attempt} of {max_attempts}: {said or code}",
                {
                    "retry_at": now + policy.delay(lease.attempt),
                    "leased_by": None,
                    "lease_expires_at": None,
                    "exit_code": report.exit_code,
                    "error_detail": _detail(said),
                },
            )
        # At the ceiling: terminal, with the ceiling recorded (R5).
        return Outcome(
            "timed_out" if report.status == "timed_out" else "failed",
            "attempt_ceiling",
            f"{code} on attempt {lease.attempt} of {max_attempts}",
            terminal_patch,
            {"attempt_ceiling": max_attempts, "cause": code},
        )
    if report.status == "cancelled":
        if cancel_requested:
            return Outcome(
                "cancelled",
                "cancel_acknowledged",
                "adapter acknowledged cancellation",
                terminal_patch,
            )
        return Outcome(
            "failed",
            "execution_failed",
            "adapter reported cancelled without a cancellation request",
            terminal_patch,
        )
    if report.status == "timed_out":
        return Outcome("timed_out", "deadline_exceeded", said or "timed out", terminal_patch)
    reason = (
        "invalid_task"
        if report.cause == "invalid_task"
        else report.failure_code or "execution_failed"
    )
    return Outcome("failed", reason, said or "adapter failed", terminal_patch)


async def record_stale_result(
    db: StateDB,
    lease: Lease,
    result: TaskExecutionResult,
    observed: str,
    *,
    now: float | None = None,
) -> None:
    """Keep a lost owner's result as a diagnostic event (never a fact, never a status)."""
    async with db.transaction(now=now) as tx:
        await tx.execute(
            "event_insert",
            {
                "id": new_id(),
                "task_id": lease.task_id,
                "kind": "stale_result",
                "transition_id": None,
                "status": observed,
                "payload": dumps(
                    {
                        "lease_id": lease.lease_id,
                        "status": result.status,
                        "exit_code": result.exit_code,
                        "error_detail": _detail(result.error_detail),
                        "evidence_refs": result.evidence_refs,
                    }
                ),
            },
        )
    log.warning(
        "task %s: stale owner %s lost its lease (row is %s); result kept as evidence",
        lease.task_id,
        lease.lease_id,
        observed,
    )


def finish_build(
    lease: Lease,
    outcome: Outcome | Callable[[float], Outcome],
    *,
    actor: Actor,
    evidence_refs: list[dict[str, Any]] | None = None,
    key_suffix: str = "finish",
    result: str | None = None,
) -> TerminalBuild:
    """The guarded transition out of ``running`` under ``lease``, built at the operation's
    time (``transitions.transition_at`` and ``transitions.apply_built`` take it). ``result``:
    the return value's JSON text, stored with a completion (R22)."""
    return finished(
        entity_id=lease.task_id,
        guard=lease.guard(),
        lease_id=lease.lease_id,
        outcome=outcome,
        actor=actor,
        evidence_refs=evidence_refs or [],
        key_suffix=key_suffix,
        result=result,
    )


def completion_result(execution: TaskExecutionResult | None) -> str | None:
    """What a completion of ``execution`` stores (R22): its return value's JSON text when the
    adapter completed with one, else None."""
    if execution is None or execution.status != "completed":
        return None
    return execution.result


async def finish_run(
    db: StateDB,
    lease: Lease,
    outcome: Outcome | Callable[[float], Outcome],
    *,
    actor: Actor,
    evidence_refs: list[dict[str, Any]] | None = None,
    now: float | None = None,
    key_suffix: str = "finish",
    group: GroupCommit | None = None,
    result: str | None = None,
) -> TransitionResult:
    """One guarded transition out of ``running`` under ``lease`` (R4: state decides, not time).

    ``outcome`` may be a function of the operation's time, evaluated inside the transaction.
    ``result``: stored with it when it completes (R22).
    """
    build = finish_build(
        lease,
        outcome,
        actor=actor,
        evidence_refs=evidence_refs,
        key_suffix=key_suffix,
        result=result,
    )
    return await transition_at(db, build, now=now, group=group)


def task_payload(row: Row, lease: Lease, db: StateDB | None = None) -> dict[str, Any]:
    """What an adapter receives: the immutable application, the attempt, the lease id; with
    ``db``, ``dependency_results``: a coroutine function reading the task's dependencies'
    results (R22), called only by a function that declares a ``TaskContext``."""
    payload = {
        "id": row["id"],
        "action_kind": row["action_kind"],
        "action_args": row["action_args"],
        "execution_target": row["execution_target"],
        "required_capabilities": row["required_capabilities"],
        "library_ref": row["library_ref"],
        "library_content_hash": row["library_content_hash"],
        "attempt": lease.attempt,
        "lease_id": lease.lease_id,
        "deadline_at": lease.deadline_at,
        "schedule_id": row["schedule_id"],
    }
    if db is not None:
        payload["dependency_results"] = partial(dependency_results, db, row["id"])
    return payload


async def execute_lease(
    registry: TaskAdapterRegistry,
    row: Row,
    lease: Lease,
    *,
    cancellation: CancellationToken,
    lock_timeout_s: float | None = None,
    watchdog: bool = True,
    db: StateDB | None = None,
) -> TaskExecutionResult:
    """Run the adapter under the deadline watchdog; never raises for adapter failures.

    Adapter lookup happens again here, after the claim: a kind whose adapter disappeared is a
    typed failure, never a dispatch as another kind (ADR-0072 D4).

    ``watchdog=False``: the caller bounds the run itself and cancels it at the deadline (the
    resident host's own watchdog, ADR-0037 D5, which fires first: it counts from the deadline,
    this one from the claim); the adapter then runs in the caller's task, with no task and no
    wait of its own. ``db``: where a ``TaskContext`` reads the dependencies' results (R22).
    """
    adapter = registry.get(lease.action_kind)
    if adapter is None:
        return TaskExecutionResult(
            status="failed",
            error_detail=f"no adapter registered for action_kind {lease.action_kind!r} on this "
            f"worker; registered: {', '.join(registry.kinds())}",
        )
    started = time.monotonic()
    budget = max(0.0, lease.deadline_at - lease.claimed_at)
    tokens = serialization_tokens(row.get("required_capabilities"))

    async def run() -> TaskExecutionResult:
        """The adapter's result; a lock not had in time or an adapter's raise is a failure."""
        try:
            if tokens:
                remaining = max(0.0, budget - (time.monotonic() - started))
                async with machine_locks(tokens, timeout_s=lock_timeout_s or remaining):
                    return await adapter.execute(
                        task_payload(row, lease, db), cancellation=cancellation
                    )
            return await adapter.execute(task_payload(row, lease, db), cancellation=cancellation)
        except LockTimeout as exc:
            return TaskExecutionResult(status="failed", retryable=True, error_detail=str(exc))
        except Exception as exc:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            return TaskExecutionResult(status="failed", error_detail=f"adapter raised: {detail}")

    if not watchdog:
        return await run()
    job = asyncio.ensure_future(run())
    try:
        done, _ = await asyncio.wait({job}, timeout=budget)
        if job not in done:
            # Watchdog: ask the adapter to stop, give it a grace period, then cancel it.
            cancellation.cancel("deadline reached")
            done, _ = await asyncio.wait({job}, timeout=DEADLINE_CANCEL_GRACE_S)
            evidence: list[dict[str, Any]] = []
            if job in done and not job.cancelled() and job.exception() is None:
                evidence = list(job.result().evidence_refs)  # keep what the adapter saw
            elif job not in done:
                job.cancel()
                with contextlib.suppress(BaseException):
                    await job
            return TaskExecutionResult(
                status="timed_out",
                retryable=True,
                evidence_refs=evidence,
                error_detail=f"deadline reached after {budget:.3f}s",
            )
        return job.result()
    except asyncio.CancelledError:
        job.cancel()
        with contextlib.suppress(BaseException):
            await job
        raise


async def settle_lease(
    db: StateDB,
    lease: Lease,
    result: TaskExecutionResult,
    *,
    actor: Actor,
    max_attempts: int,
    policy: RetryPolicy,
    now: float | None = None,
) -> TransitionResult:
    """Write the terminal (or retry) transition for ``result``; keep it as evidence if stale."""
    cancel_requested = False
    if result.status == "cancelled":
        # running -> cancelled requires a recorded cancellation request (R2).
        row = await db.fetchone("run_get", {"id": lease.task_id})
        cancel_requested = bool(row and row["cancel_requested_at"] is not None)

    def outcome(at: float) -> Outcome:
        return outcome_for(
            result,
            lease,
            max_attempts=max_attempts,
            cancel_requested=cancel_requested,
            now=at,
            policy=policy,
        )

    transition = await finish_run(
        db,
        lease,
        outcome,
        actor=actor,
        evidence_refs=result.evidence_refs,
        now=now,
        result=completion_result(result),
    )
    if not transition.applied:
        await record_stale_result(db, lease, result, transition.current_state, now=now)
    return transition
