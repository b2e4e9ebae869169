"""The closed nine-state task lifecycle: states, the 14 declared edges and reason codes.

Pure data and checks, no I/O. ``transitions.transition_task`` is the only writer of a status and
calls :func:`check_edge` before touching the store (ADR-0072 D3, DESIGN.md R2).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final

from taskward.errors import InvalidTransition


class Status(StrEnum):
    QUEUED = "queued"
    WAITING_DEPENDENCY = "waiting_dependency"
    RUNNING = "running"
    RETRY_WAIT = "retry_wait"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


S = Status

# R2: exactly these 14 edges. There is no running -> queued: every requeue (lease expiry, a
# retryable failure, a host shutdown) goes running -> retry_wait -> queued.
EDGES: Final[Mapping[Status, frozenset[Status]]] = {
    S.QUEUED: frozenset({S.RUNNING, S.WAITING_DEPENDENCY, S.SKIPPED, S.CANCELLED}),
    S.WAITING_DEPENDENCY: frozenset({S.QUEUED, S.SKIPPED, S.CANCELLED}),
    S.RUNNING: frozenset({S.COMPLETED, S.FAILED, S.TIMED_OUT, S.RETRY_WAIT, S.CANCELLED}),
    S.RETRY_WAIT: frozenset({S.QUEUED, S.CANCELLED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.TIMED_OUT: frozenset(),
    S.SKIPPED: frozenset(),
    S.CANCELLED: frozenset(),
}

TERMINAL: Final[frozenset[Status]] = frozenset(s for s, out in EDGES.items() if not out)
ACTIVE: Final[frozenset[Status]] = frozenset(Status) - TERMINAL

ENTITY_TYPES: Final[frozenset[str]] = frozenset({"schedule_run"})

# The closed list of reason codes a transition may carry (R3). A new code is a reviewed change.
REASON_CODES: Final[frozenset[str]] = frozenset(
    {
        "claimed",  # queued -> running: a worker took the lease
        "completed",  # running -> completed: adapter reported success
        "execution_failed",  # running -> failed: adapter failed, not retryable
        "adapter_missing",  # the kind's adapter is not registered on the claiming worker
        "invalid_task",  # the task's own data cannot run (bad cwd, lease < deadline)
        "retryable_failure",  # running -> retry_wait: a failure the policy retries
        "deadline_exceeded",  # the owner's watchdog or the deadline reaper fired
        "attempt_ceiling",  # a retryable failure at the configured attempt ceiling
        "lease_expired",  # reaper: running -> retry_wait after lease expiry
        "attempts_exhausted",  # reaper: running -> failed, expiry at the ceiling
        "retry_ready",  # retry_wait -> queued: retry_at is due
        "host_shutdown",  # running -> retry_wait: the host stopped before the task ended
        "summary_failed",  # the durable summary could not be written before complete
        "cancelled",  # queued/waiting/retry_wait -> cancelled on request
        "cancel_acknowledged",  # running -> cancelled: adapter acknowledged the request
        "dependencies_pending",  # R21: queued -> waiting_dependency at admission
        "dependencies_met",  # R21: waiting_dependency -> queued, every dependency completed
        "dependency_failed",  # R21: -> skipped, a dependency ended other than completed
        "result_not_serializable",  # R22: running -> failed, the return value is not JSON
        "skipped",  # -> skipped
        "operator",  # an audited operator action
    }
)


def is_terminal(status: str) -> bool:
    return status in TERMINAL


def parse_status(value: str, *, field: str = "status") -> Status:
    """Return the Status named by ``value`` or raise a validation error listing all nine."""
    try:
        return Status(value)
    except ValueError:
        raise InvalidTransition(field, value, [s.value for s in Status]) from None


def check_edge(src: str, dst: str) -> None:
    """Raise InvalidTransition unless ``src -> dst`` is one of the 14 declared edges (R2)."""
    source = parse_status(src, field="from_state")
    target = parse_status(dst, field="to_state")
    allowed = EDGES[source]
    if target not in allowed:
        allowed_text = ", ".join(sorted(allowed)) if allowed else f"none: {src} is terminal"
        raise InvalidTransition(
            "to_state",
            dst,
            allowed_text,
            message=f"undeclared edge {src} -> {dst}; {src} may move to: {allowed_text}",
        )


def check_reason_code(code: str) -> None:
    if code not in REASON_CODES:
        raise InvalidTransition("reason.code", code, sorted(REASON_CODES))
