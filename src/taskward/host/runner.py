"""``run_task`` for the resident host over the local source: a claimed run dispatched through
the adapter registry, in a fresh per-task session (ADR-0037 D3, D5).
"""

from __future__ import annotations

from typing import Any

from taskward.execution import execute_lease
from taskward.host.models import Task
from taskward.host.ports import TaskRunFailure
from taskward.host.source import LocalTaskSource
from taskward.registry import TaskAdapterRegistry
from taskward.tracing import running, start_run


class TaskSession:
    """A fresh, per-task session: the mutable state one run may touch (D3 isolation)."""

    def __init__(self) -> None:
        self.operation_statuses: dict[str, str] = {}
        self.artifact_refs: list[dict[str, Any]] = []
        self.usage: dict[str, Any] = {}


class AdapterRunner:
    """``run_task`` for the host: dispatch the claimed run through the adapter registry."""

    def __init__(self, registry: TaskAdapterRegistry, source: LocalTaskSource) -> None:
        self.registry = registry
        self.source = source

    async def __call__(self, task: Task, session: Any) -> dict[str, Any]:
        claim = self.source.claimed(task.id)
        # The run's span continues admission's trace (None when not tracing); the source ends
        # it with the terminal transition (``LocalTaskSource._forget``).
        claim.span = start_run(claim.row, task.attempt, task.lease_id, self.source.spec.worker_id)
        with running(claim.span):
            # The host's watchdog bounds the run (D5): no second one inside.
            result = await execute_lease(
                self.registry,
                claim.row,
                claim.lease,
                cancellation=claim.token,
                watchdog=False,
                db=self.source.db,  # a TaskContext reads its dependencies' results here (R22)
            )
        self.source.record_result(task.id, result)
        kind = claim.lease.action_kind
        if isinstance(session, TaskSession):
            session.operation_statuses[kind] = result.status
            session.artifact_refs.extend(result.evidence_refs)
        if result.status == "completed":
            return {
                "operation_statuses": {kind: "completed"},
                "artifact_refs": list(result.evidence_refs),
                "usage": {},
                "exit_code": result.exit_code,
            }
        if result.status == "cancelled":
            raise TaskRunFailure("cancelled", result.error_detail or "cancelled", retryable=False)
        if result.status == "timed_out":
            # The adapter's own deadline: retryable only when the adapter says so (ADR-0072 D4;
            # the host's watchdog, which fires first, reports its own retryable ``deadline``).
            raise TaskRunFailure(
                "deadline", result.error_detail or "timed out", retryable=result.retryable
            )
        raise TaskRunFailure(
            "flow_failed", result.error_detail or "failed", retryable=result.retryable
        )


__all__ = ["AdapterRunner", "TaskSession"]
