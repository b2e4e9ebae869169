"""ADR-0037 D1 ports: what the resident host needs from a queue and a summary store."""

from __future__ import annotations

from collections.abc import Callable
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

    # Optional, looked up by name: ``wait_for_work(wait_s) -> Awaitable``, which ends when new
    # work may have arrived since the last claim or after ``wait_s``; the host then claims
    # again. Without it an idle host polls every ``idle_wait_s``. A plain future (not a task or
    # a coroutine) is awaited as it is, the quickest wake-up (``ResidentEngineHost._idle``).
    #
    # Optional, protocol version two (R25): ``renew(task_id, lease_id) -> TaskAck``, the
    # ``RenewsLeases`` port below. A source without it still conforms (version one: its leases
    # cover their deadlines).


@runtime_checkable
class RenewsLeases(Protocol):
    """Optional, ADR-0037 protocol version two (DESIGN.md R25): a source whose leases the host
    renews while it holds them, so a short lease recovers a crashed host's task within about a
    lease's length while the task itself may run for hours.

    ``renew`` is a compare-and-swap on the lease id, like ``complete`` and ``fail`` (D2): the
    held lease answers ``TaskAck(applied=True)`` and is extended (never past the task's deadline
    plus the source's slack); a lease that is no longer the task's (it lapsed and was reclaimed,
    the task ended) answers ``stale_lease`` and changes nothing, an unknown or never-leased task
    ``missing_holder``. A renewal that loses means the run must stop: the host cancels it, and
    its acknowledgement is refused like any stale one. A renewal changes no state the queue
    records (no transition). Renewing a lease that already covers its deadline (version one's)
    is accepted and leaves it as it is.

    Optional, looked up by name: ``renew_every_s``, how often the host should renew this
    source's leases (a fraction of their length, so one late or lost renewal is survived), None
    when they need none; a host given no interval of its own takes it (``LocalTaskSource``:
    ``lease_ttl / 3`` for a renewing worker). A host with neither renews nothing.
    """

    async def renew(self, task_id: str, lease_id: str) -> TaskAck: ...


@runtime_checkable
class SummaryStore(Protocol):
    async def write(self, session_key: str, summary: SessionSummary) -> None:
        """Idempotent by session key; a different summary for a completed key raises."""
        ...

    async def mark_pending(self, session_key: str, reason: str) -> None:
        """Idempotent; never turns a complete summary back into pending."""
        ...


class TaskRunFailure(Exception):
    """Raised by a runner to report a classified failure (code and retryability)."""

    def __init__(self, code: str, detail: str, *, retryable: bool) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.retryable = retryable


class SummaryNotWritten(Exception):
    """Raised by ``FinishesInOneStep.complete_with_summary`` when the summary could not be
    written (a conflict, a bad value): nothing was completed, and the host reports the task's
    failure as ``summary_failed`` exactly as after a failed ``SummaryStore.write`` (D4)."""


@runtime_checkable
class FinishesInOneStep(Protocol):
    """Optional: a source that completes a task together with its summary, in one atomic step
    of its store, and may lease the next task for the slot that frees in that same step.

    D4's order still holds: the summary is written first and the completion only with it (a
    summary that cannot be written raises ``SummaryNotWritten`` and completes nothing); a run
    is never seen completed without its summary. D3 still holds: the next task is leased only
    for the slot the completion frees, in the step that frees it (no prefetch, never more leases
    than slots). The host uses this only when ``writes_summaries_to(its summary store)``.
    """

    def writes_summaries_to(self, store: SummaryStore) -> bool: ...

    async def complete_with_summary(
        self,
        task_id: str,
        lease_id: str,
        result: TaskResult,
        summary: SessionSummary,
        *,
        claim_next: Callable[[], int],
    ) -> tuple[TaskAck, list[Task]]:
        """Write ``summary`` under ``result.summary_ref``, then complete; then lease at most
        ``claim_next()`` tasks (evaluated inside the step, so a host that stopped claiming
        meanwhile gets none). Idempotent like ``write`` and ``complete`` each."""
        ...
