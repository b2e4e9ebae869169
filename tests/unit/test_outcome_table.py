"""The one outcome table (``execution.outcome_for``): every way an attempt ends, from the
adapter's own result or the host's failure, to its transition (ADR-0072 D4/D5, R5, R10)."""

from __future__ import annotations

import pytest

from taskward.claims import Lease
from taskward.execution import MAX_ERROR_DETAIL, Outcome, Report, RetryPolicy, outcome_for
from taskward.registry import TaskExecutionResult

NOW = 1000.0
POLICY = RetryPolicy(base_s=10.0, factor=2.0, cap_s=100.0, jitter=0.0)


def lease(attempt: int) -> Lease:
    return Lease(
        task_id="t",
        leased_by="w",
        attempt=attempt,
        lease_expires_at=NOW + 300,
        deadline_at=NOW + 240,
        claimed_at=NOW - 1,
        action_kind="command",
    )


def outcome(
    ended: TaskExecutionResult | Report, *, attempt: int = 1, cancel_requested: bool = False
) -> Outcome:
    return outcome_for(
        ended,
        lease(attempt),
        max_attempts=3,
        cancel_requested=cancel_requested,
        now=NOW,
        policy=POLICY,
    )


def failure(code: str, *, retryable: bool, detail: str = "why") -> Report:
    return Report.of_failure(code, detail, retryable, TaskExecutionResult("failed", exit_code=4))


@pytest.mark.parametrize(
    ("ended", "attempt", "cancel_requested", "state", "reason"),
    [
        (TaskExecutionResult("completed", exit_code=0), 1, False, "completed", "completed"),
        (TaskExecutionResult("cancelled"), 1, True, "cancelled", "cancel_acknowledged"),
        (TaskExecutionResult("cancelled"), 1, False, "failed", "execution_failed"),
        # an adapter's own cancelled is never retried, even marked retryable
        (
            TaskExecutionResult("cancelled", retryable=True),
            1,
            True,
            "cancelled",
            "cancel_acknowledged",
        ),
        (TaskExecutionResult("cancelled", retryable=True), 1, False, "failed", "execution_failed"),
        (TaskExecutionResult("failed", exit_code=1), 1, False, "failed", "execution_failed"),
        (
            TaskExecutionResult("failed", retryable=True),
            1,
            False,
            "retry_wait",
            "retryable_failure",
        ),
        (TaskExecutionResult("failed", retryable=True), 3, False, "failed", "attempt_ceiling"),
        # an adapter's own timed_out is terminal; only a retryable one is retried (D4, R5)
        (TaskExecutionResult("timed_out"), 1, False, "timed_out", "deadline_exceeded"),
        (
            TaskExecutionResult("timed_out", retryable=True),
            1,
            False,
            "retry_wait",
            "deadline_exceeded",
        ),
        (
            TaskExecutionResult("timed_out", retryable=True),
            3,
            False,
            "timed_out",
            "attempt_ceiling",
        ),
        # the host's failures (ADR-0037 D5)
        (failure("cancelled", retryable=True), 1, False, "retry_wait", "host_shutdown"),
        (failure("cancelled", retryable=True), 3, False, "failed", "attempt_ceiling"),
        (failure("cancelled", retryable=False), 1, True, "cancelled", "cancel_acknowledged"),
        (failure("deadline", retryable=True), 1, False, "retry_wait", "deadline_exceeded"),
        (failure("deadline", retryable=False), 1, False, "timed_out", "deadline_exceeded"),
        (failure("summary_failed", retryable=True), 1, False, "retry_wait", "summary_failed"),
        (failure("invalid_task", retryable=True), 1, False, "retry_wait", "invalid_task"),
        (failure("invalid_task", retryable=False), 1, False, "failed", "invalid_task"),
        (failure("flow_failed", retryable=True), 1, False, "retry_wait", "retryable_failure"),
        (failure("flow_failed", retryable=False), 1, False, "failed", "execution_failed"),
    ],
)
def test_every_ending_maps_to_its_transition(
    ended: TaskExecutionResult | Report,
    attempt: int,
    cancel_requested: bool,
    state: str,
    reason: str,
) -> None:
    got = outcome(ended, attempt=attempt, cancel_requested=cancel_requested)
    assert (got.to_state, got.reason_code) == (state, reason)


def test_a_host_shutdown_is_due_at_once_and_a_retry_after_backoff() -> None:
    shutdown = outcome(failure("cancelled", retryable=True))
    assert shutdown.patch["retry_at"] == NOW and shutdown.patch["leased_by"] is None
    retry = outcome(failure("flow_failed", retryable=True), attempt=2)
    assert retry.patch["retry_at"] == NOW + 20.0  # base 10 s * 2^(2-1), no jitter
    assert retry.summary == "attempt 2 of 3: flow_failed: why"
    assert retry.patch["error_detail"] == "flow_failed: why"


def test_the_ceiling_is_recorded_and_terminal_patches_keep_their_shape() -> None:
    ceiling = outcome(TaskExecutionResult("timed_out", retryable=True), attempt=3)
    assert ceiling.metadata == {"attempt_ceiling": 3, "cause": "deadline_exceeded"}
    # transitions.finish.FINISH_PATCH: the one-statement finish matches this exact key order
    assert list(ceiling.patch) == ["ended_at", "exit_code", "error_detail", "invocation_id"]
    failed = outcome(failure("invalid_task", retryable=False, detail="cwd is missing"))
    assert failed.patch["error_detail"] == "cwd is missing"  # the host's code is in the summary
    assert failed.summary == "invalid_task: cwd is missing" and failed.patch["exit_code"] == 4


@pytest.mark.parametrize(
    "ended",
    [
        TaskExecutionResult("failed", error_detail="x" * 10_000),
        Report.of_failure("flow_failed", "x" * 10_000, False, None),
    ],
)
def test_one_bound_on_the_stored_detail_whoever_reports(
    ended: TaskExecutionResult | Report,
) -> None:
    detail = outcome(ended).patch["error_detail"]
    assert detail == "..." + "x" * MAX_ERROR_DETAIL
