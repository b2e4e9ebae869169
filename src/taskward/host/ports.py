"""ADR-0037 D1 ports: what the resident host needs from a queue and a summary store."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from taskward.host.models import SessionSummary, Task, TaskAck, TaskFailure, TaskResult


@runtime_checkable
class TaskSource(Protocol):
    async def claim(self) -> Task | None:
        """Atomically dequeue and lease one task; None when nothing is available (never means
        shutdown)."""
        ...

    async def complete(self, task_id: str, lease_id: str, result: TaskResult) -> TaskAck: ...

    async def fail(self, task_id: str, lease_id: str, failure: TaskFailure) -> TaskAck: ...


@runtime_checkable
class SummaryStore(Protocol):
    async def write(self, session_key: str, summary: SessionSummary) -> None:
        """Idempotent by session key; a different summary for a completed key raises."""
        ...

    async def mark_pending(self, session_key: str, reason: str) -> None:
        """Idempotent; never turns a complete summary back into pending."""
        ...
