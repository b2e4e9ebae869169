"""How ``LocalTaskSource`` judges an acknowledgement (ADR-0037 D4, DESIGN.md R4): what it
remembers of a lease (``ClaimedRun``, the side channel, R10), the lease a caller presents as the
database sees it, the host's answer through the one outcome table (``execution.outcome_for``),
the few possible answers, and a refused result kept as evidence (ADR-0072 D4).

Pure judgment and values, besides ``keep_stale``'s one diagnostic write: the source owns the
claims, the transactions and the cache of answers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Final

from taskward.canonical import canonical_json, json_string
from taskward.claims import Lease
from taskward.errors import StoreError
from taskward.execution import Outcome, Report, RetryPolicy, outcome_for, record_stale_result
from taskward.host.models import TaskAck, TaskFailure, TaskResult
from taskward.models import Actor, TransitionResult
from taskward.registry import CancellationToken, TaskExecutionResult
from taskward.store.port import Row, StateDB

log = logging.getLogger("taskward.host.source")


@dataclass
class ClaimedRun:
    """What the source remembers about a task it leased (the side channel)."""

    row: Row
    lease: Lease
    token: CancellationToken = field(default_factory=CancellationToken)
    result: TaskExecutionResult | None = None
    claimed_mono: float = 0.0  # time.monotonic() at its registration: the run time's start
    # The run's OpenTelemetry span (``tracing.start_run``), ended with the terminal transition
    # when the source forgets the lease; None when not tracing.
    span: Any = None


# Acknowledgements are frozen models: the few possible answers are built once.
APPLIED: Final = TaskAck(applied=True)
APPLIED_AT_CEILING: Final = TaskAck(applied=True, rejection="attempt_ceiling")
STALE: Final = TaskAck(applied=False, rejection="stale_lease")
MISSING_HOLDER: Final = TaskAck(applied=False, rejection="missing_holder")


def parse_lease_id(value: str) -> tuple[str, int] | None:
    """``<holder>/<attempt>`` (R4) as its parts; None when it is not one."""
    holder, sep, attempt = value.rpartition("/")
    if not sep or not holder or not attempt.isdigit():
        return None
    return holder, int(attempt)


def presented_lease(row: Row, holder: str, attempt: int, claim: ClaimedRun | None) -> Lease:
    """The lease an acknowledgement presents, as its guard will compare it: this source's own
    when it holds it, else built from the row, its expiry the row's only when the row still
    names this holder and attempt (judged by database state, R4)."""
    if claim is not None and claim.lease.leased_by == holder and claim.lease.attempt == attempt:
        return claim.lease
    expires = (
        row["lease_expires_at"]
        if (row["leased_by"], row["lease_attempts"]) == (holder, attempt)
        else -1.0
    )
    return Lease(
        task_id=row["id"],
        leased_by=holder,
        attempt=attempt,
        lease_expires_at=expires if expires is not None else -1.0,
        deadline_at=row["deadline_at"] or 0.0,
        claimed_at=0.0,
        action_kind=row["action_kind"],
    )


def host_outcome(
    row: Row,
    lease: Lease,
    execution: TaskExecutionResult | None,
    completed: TaskResult | None,
    failure: TaskFailure | None,
    *,
    max_attempts: int,
    now: float,
    policy: RetryPolicy,
) -> Outcome:
    """The host's acknowledgement through the one outcome table (``execution.outcome_for``):
    a completion is the adapter's own completed result when it ran, a failure the host's
    code over what the adapter reported."""
    if completed is not None:
        ran = execution is not None and execution.status == "completed"
        report = Report.of(execution) if ran and execution else Report("completed", exit_code=0)
    else:
        assert failure is not None
        report = Report.of_failure(failure.code, failure.detail, failure.retryable, execution)
    return outcome_for(
        report,
        lease,
        max_attempts=max_attempts,
        cancel_requested=row["cancel_requested_at"] is not None,
        now=now,
        policy=policy,
    )


def recorded(
    outcome_at: Callable[[float], Outcome],
) -> tuple[Callable[[float], Outcome], list[Outcome]]:
    """``outcome_at`` (a function of the operation's time), and where its result is kept once
    resolved (the acknowledgement reports a reached ceiling)."""
    resolved: list[Outcome] = []

    def outcome(now: float) -> Outcome:
        resolved.append(outcome_at(now))
        return resolved[-1]

    return outcome, resolved


def answer(transition: TransitionResult, resolved: list[Outcome]) -> TaskAck:
    """The acknowledgement of a committed (or refused) terminal transition."""
    if not transition.applied:
        return STALE
    if resolved and resolved[-1].reason_code == "attempt_ceiling":
        return APPLIED_AT_CEILING
    return APPLIED


def evidence(
    execution: TaskExecutionResult | None, completed: TaskResult | None
) -> list[dict[str, Any]]:
    """The terminal fact's evidence: what the adapter reported, and the summary it cites."""
    refs = list(execution.evidence_refs) if execution else []
    if completed is not None:
        refs.append({"kind": "summary", "session_key": completed.summary_ref})
    return refs


@lru_cache(maxsize=64)
def system_actor(holder: str) -> Actor:
    """The lease holder as the actor of its acknowledgements (a frozen model: one per holder)."""
    return Actor(type="system", id=holder)


def result_payload(result: TaskResult) -> tuple[dict[str, Any], str]:
    """``result.model_dump(mode="json")`` and its canonical JSON (the acknowledgement's replay
    digest); a TaskResult's three strings are spliced (a unit test holds them equal)."""
    if type(result) is not TaskResult:
        payload = result.model_dump(mode="json")
        return payload, canonical_json(payload)
    payload = {"run_id": result.run_id, "status": result.status, "summary_ref": result.summary_ref}
    return payload, (
        f'{{"run_id":{json_string(result.run_id)},"status":{json_string(result.status)},'
        f'"summary_ref":{json_string(result.summary_ref)}}}'
    )


async def keep_stale(
    db: StateDB,
    lease: Lease,
    transition: TransitionResult,
    execution: TaskExecutionResult | None,
    completed: TaskResult | None,
    failure: TaskFailure | None,
) -> None:
    """ADR-0072 D4: "If the terminal guard loses, the adapter result is retained only as
    diagnostic evidence" -- a ``stale_result`` event (never a fact, never a status). The
    adapter's own result where this worker ran it, else what the host acknowledged."""
    if execution is None:
        execution = (
            TaskExecutionResult(status="completed", exit_code=0)
            if completed is not None
            else TaskExecutionResult(
                status="timed_out"
                if failure is not None and failure.code == "deadline"
                else "failed",
                error_detail=f"{failure.code}: {failure.detail}" if failure else None,
            )
        )
    try:
        await record_stale_result(db, lease, execution, transition.current_state)
    except StoreError as exc:  # diagnostic only: the acknowledgement's answer stands
        log.warning("task %s: stale result of %s not kept: %s", lease.task_id, lease.lease_id, exc)
