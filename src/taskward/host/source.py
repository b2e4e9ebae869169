"""The in-tree TaskSource (ADR-0037 D6) over taskward's own store.

``LocalTaskSource.claim()`` is the same guarded ``queued -> running`` lease claim the worker
functions use (``claims.claim_runs``), and acknowledgements are guarded terminal transitions
judged by database state (R4). The adapter's ``TaskExecutionResult`` reaches the terminal
transition through a side channel of this source (``record_result``), never through extra model
fields (R10). With a renewing ``WorkerSpec`` it speaks protocol version two (R25): ``renew``
extends a held lease, and a renewal that loses cancels the run's token.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from taskward.canonical import canonical_json
from taskward.claims import Claimed, Lease, WorkerSpec, claim_rows, renew_lease
from taskward.errors import StoreError, TransitionIdempotencyConflict
from taskward.execution import (
    Outcome,
    RetryPolicy,
    completion_result,
    finish_run,
)
from taskward.groupcommit import GroupCommit
from taskward.host.acks import (
    APPLIED,
    MISSING_HOLDER,
    STALE,
    ClaimedRun,
    answer,
    evidence,
    host_outcome,
    keep_stale,
    parse_lease_id,
    presented_lease,
    recorded,
    system_actor,
)
from taskward.host.models import (
    Task,
    TaskAck,
    TaskFailure,
    TaskResult,
    checked_task,
)
from taskward.host.onestep import OneStepFinish
from taskward.host.summaries import LocalSummaryStore
from taskward.models import TransitionResult
from taskward.registry import CancellationToken, TaskAdapterRegistry, TaskExecutionResult
from taskward.store.port import Row, StateDB
from taskward.tracing import end_run

# How far past a delayed row's due time an idle source wakes for it (R16), and the shortest
# wait it ever asks for.
DUE_MARGIN_S: Final = 0.002

log = logging.getLogger("taskward.host.source")

# Recent acknowledgements kept for exact in-process replays (a lost reply is retried at once);
# older replays are judged by the database. Bounded so a long-lived worker does not grow.
ACK_CACHE_SIZE: Final = 1024


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class LocalTaskSource(OneStepFinish):
    """A TaskSource over ``schedule_runs``; the attempt ceiling is the stored queue setting.

    A retry is due after the backoff of the task's kind when ``registry`` gives it one (R18),
    else after ``retry_policy`` (the worker's default)."""

    def __init__(
        self,
        db: StateDB,
        spec: WorkerSpec,
        *,
        retry_policy: RetryPolicy | None = None,
        cwd: Path | None = None,
        group: GroupCommit | None = None,
        summaries: LocalSummaryStore | None = None,
        registry: TaskAdapterRegistry | None = None,
    ) -> None:
        self.db = db
        self.spec = spec
        self.policy = retry_policy or RetryPolicy()
        self.registry = registry
        self.cwd = cwd or Path(os.getcwd())
        self._claims: dict[str, ClaimedRun] = {}
        # Claimed rows the Task model refused, not yet failed (task id -> lease id, failure).
        self._invalid: dict[str, tuple[str, TaskFailure]] = {}
        self._acks: OrderedDict[tuple[str, str], tuple[str, TaskAck]] = OrderedDict()
        # With a summary store, this source completes a task and writes its summary in one
        # step (``complete_with_summary``): both must then share one group commit.
        self._summaries = summaries
        if group is None:
            group = summaries.group if summaries is not None else GroupCommit(db)
        elif summaries is not None and summaries.group is not group:
            raise ValueError("the summary store must share this source's group commit")
        self._group = group
        self._signal = db.signal("queued")
        self._seen = self._signal.seq
        # R16: when (the event loop's clock) the earliest delayed row falls due, as the last
        # claim pass that came back short found it; None: nothing is waiting for its time.
        self._next_due_at: float | None = None

    # -- side channel ----------------------------------------------------------------------

    def claimed(self, task_id: str) -> ClaimedRun:
        return self._claims[task_id]

    @property
    def tokens(self) -> dict[str, CancellationToken]:
        return {task_id: claim.token for task_id, claim in self._claims.items()}

    def policy_for(self, action_kind: str) -> RetryPolicy:
        """The backoff of a retry of ``action_kind``: the kind's own (R18), else the worker's."""
        backoff = self.registry.backoff_for(action_kind) if self.registry is not None else None
        return backoff if backoff is not None else self.policy

    def record_result(self, task_id: str, result: TaskExecutionResult) -> None:
        claim = self._claims.get(task_id)
        if claim is not None:
            claim.result = result

    # -- claiming --------------------------------------------------------------------------

    def _task_for(self, row: Row, lease: Lease) -> Task:
        args = row.get("action_args") or {}
        objective = args.get("objective")
        if not isinstance(objective, str) or not objective.strip():
            objective = f"{row['action_kind']} {row['id']}"
        cwd = args.get("cwd")
        return checked_task(
            id=row["id"],
            objective=objective,
            cwd=Path(cwd) if isinstance(cwd, str) and cwd else self.cwd,
            lease_id=lease.lease_id,
            lease_expires_at=_utc(self._held_until(lease)),
            attempt=lease.attempt,
            deadline=_utc(lease.deadline_at),
        )

    def _held_until(self, lease: Lease) -> float:
        """The end of the lease the host holds, as ``Task.lease_expires_at`` says it.

        Version one: the row's expiry, which covers the deadline (R5, D1). A renewing worker
        (R25): the end its renewals hold the lease to, the deadline + slack -- the row's own
        expiry stays at most ``lease_ttl`` ahead, so that a crashed host's task comes back
        soon, and the ADR-0037 model (kept as recorded, R10) requires a lease that covers the
        deadline. The host keeps that promise true by renewing (``renew``); a renewal that
        loses stops the run."""
        if not self.spec.renews:
            return lease.lease_expires_at
        return max(lease.lease_expires_at, lease.deadline_at + self.spec.lease_slack_s)

    async def claim_many(self, limit: int) -> list[Task]:
        """Claim at most ``limit`` tasks (the host passes its free slots: no prefetch)."""
        self._seen = self._signal.seq
        if self._invalid:
            await self._fail_invalid()
        # The claim pass shares commits with this source's acknowledgements and summaries.
        claimed = await claim_rows(self.db, self.spec, limit=limit, group=self._group)
        tasks = await self._register_all(claimed)
        self._next_due_at = None
        if len(claimed) < limit:
            await self._note_next_due()
        return tasks

    async def _note_next_due(self) -> None:
        """After a pass that came back short: when the earliest delayed row falls due (R16),
        so that ``wait_for_work`` wakes then rather than at the host's next poll. Best effort:
        a store error leaves the poll as it was (the claims are already registered)."""
        try:
            row = await self.db.fetchone("run_next_due", {})
        except StoreError as exc:
            log.warning("next due time not read: %s", exc)
            return
        if row is not None:
            self._next_due_at = asyncio.get_running_loop().time() + float(row["due_in"])

    async def _register_all(self, claimed: list[Claimed]) -> list[Task]:
        """Remember each lease in the side channel and hand the host its Task.

        A claimed row that cannot become a ``Task`` (its data fails the model: a cwd or
        objective of the wrong shape, a deadline out of datetime's range) is never handed to
        the host and never left ``running``: it is failed at once, terminal, with
        ``invalid_task`` naming what the model refused (a row admitted before today's bounds,
        or written around admission)."""
        tasks = []
        metrics = self.db.metrics
        started = time.monotonic()
        for item in claimed:
            lease = item.lease
            self._claims[lease.task_id] = ClaimedRun(
                row=item.row, lease=lease, claimed_mono=started
            )
            if metrics is not None:  # the one place claims are counted: each committed here
                row = item.row
                queued_at = max(row["queued_at"] or 0.0, row.get("run_after") or 0.0)
                metrics.claimed(lease.action_kind, lease.claimed_at - queued_at)
            try:
                tasks.append(self._task_for(item.row, lease))
            except (ValueError, TypeError, OverflowError) as exc:
                detail = "the claimed row is not a valid task: " + " ".join(str(exc).split())[:1000]
                log.warning("task %s: %s", lease.task_id, detail)
                failure = TaskFailure(code="invalid_task", retryable=False, detail=detail)
                self._invalid[lease.task_id] = (lease.lease_id, failure)
        # After every valid task is built: a store error failing one invalid row must not
        # strand the batch (the host gets its tasks; the row is failed at a later claim).
        await self._fail_invalid()
        return tasks

    async def _fail_invalid(self) -> None:
        """Fail the claimed rows the model refused (``_register_all``); one the store could
        not take now stays remembered and is tried again at the next claim."""
        for task_id, (lease_id, failure) in list(self._invalid.items()):
            try:
                await self._acknowledge(
                    task_id, lease_id, failure.model_dump(mode="json"), failure=failure, alone=True
                )
            except StoreError as exc:
                log.warning("task %s: invalid_task not written yet: %s", task_id, exc)
                continue
            del self._invalid[task_id]

    async def claim(self) -> Task | None:
        """One task or None; never blocks waiting for work."""
        tasks = await self.claim_many(1)
        return tasks[0] if tasks else None

    def wait_for_work(self, wait_s: float) -> asyncio.Future[bool]:
        """A future that resolves when new work may have arrived since the last claim (True),
        or after ``wait_s`` (False). A future, not a coroutine: the host awaits it directly
        (``ResidentEngineHost._idle``), so a wake-up reaches the next claim a turn sooner.

        The wait ends early, with False, when a delayed row falls due before ``wait_s`` (R16:
        its claim then comes within milliseconds of its ``run_after``, not at the next poll)."""
        if self._next_due_at is not None:
            due_in = self._next_due_at - asyncio.get_running_loop().time()
            # a little past the due time (the store's clock and the loop's), never a busy loop
            wait_s = min(wait_s, max(DUE_MARGIN_S, due_in + DUE_MARGIN_S))
        return self._signal.changed(self._seen, wait_s)

    # -- renewal (protocol version two, R25; host.ports.RenewsLeases) ---------------------

    @property
    def renew_every_s(self) -> float | None:
        """How often the host should renew this source's leases: ``lease_ttl / 3`` for a
        renewing worker, None otherwise (its leases cover their deadlines)."""
        return self.spec.renew_every_s

    async def renew(self, task_id: str, lease_id: str) -> TaskAck:
        """Extend the lease ``lease_id`` of ``task_id`` by compare-and-swap on the lease id
        (``claims.renew_lease``: ``lease_ttl`` from the store's now, never past the deadline +
        slack), sharing commits with this source's other writes.

        A renewal that loses -- the row is no longer ``running`` under that lease: it lapsed and
        was reaped or reclaimed, or the task ended -- changes nothing and answers
        ``stale_lease``; when the lease is one this source holds, the run is cancelled
        cooperatively (its token), and its acknowledgement will be refused and kept as a
        ``stale_result`` event, never a fact (ADR-0072 D4). An unknown or never-leased task is
        ``missing_holder``.
        """
        parsed = parse_lease_id(lease_id)
        if parsed is not None:
            holder, attempt = parsed
            expires_at = await renew_lease(
                self.db,
                task_id,
                holder,
                attempt,
                lease_ttl=self.spec.lease_ttl,
                lease_slack_s=self.spec.lease_slack_s,
                group=self._group,
            )
            if expires_at is not None:
                claim = self._claims.get(task_id)
                if claim is not None and claim.lease.lease_id == lease_id:
                    claim.lease = replace(claim.lease, lease_expires_at=expires_at)
                return APPLIED
        row = await self.db.fetchone("run_get", {"id": task_id})
        if row is None or (row["lease_attempts"] == 0 and row["leased_by"] is None):
            return MISSING_HOLDER
        claim = self._claims.get(task_id)
        if claim is not None and claim.lease.lease_id == lease_id:
            state = row["status"]
            if state == "running" and row["leased_by"] is not None:
                state = f"running under {row['leased_by']}/{row['lease_attempts']}"
            log.warning("task %s: lease %s lost (%s): cancelling its run", task_id, lease_id, state)
            claim.token.cancel(f"lease {lease_id} lost: the task is {state}")
        return STALE

    # -- acknowledgements ------------------------------------------------------------------

    async def complete(self, task_id: str, lease_id: str, result: TaskResult) -> TaskAck:
        return await self._acknowledge(
            task_id, lease_id, result.model_dump(mode="json"), completed=result
        )

    async def fail(self, task_id: str, lease_id: str, failure: TaskFailure) -> TaskAck:
        return await self._acknowledge(
            task_id, lease_id, failure.model_dump(mode="json"), failure=failure
        )

    async def _acknowledge(
        self,
        task_id: str,
        lease_id: str,
        payload: dict[str, Any],
        *,
        completed: TaskResult | None = None,
        failure: TaskFailure | None = None,
        alone: bool = False,
    ) -> TaskAck:
        """One acknowledgement, judged by database state (R4). ``alone``: in a transaction of
        its own, not the group commit (a group commit's fallbacks must not queue behind it)."""
        digest = canonical_json(payload)
        cached = self._acks.get((task_id, lease_id))
        if cached is not None:  # exact replay: same answer, no repeated effects
            return cached[1] if cached[0] == digest else STALE
        parsed = parse_lease_id(lease_id)
        claim = self._claims.get(task_id)
        ours = claim is not None and claim.lease.lease_id == lease_id
        needs_row = not ours or (failure is not None and failure.code == "cancelled")
        row = await self.db.fetchone("run_get", {"id": task_id}) if needs_row else None
        if not ours and (row is None or (row["lease_attempts"] == 0 and row["leased_by"] is None)):
            return MISSING_HOLDER
        if parsed is None:
            return STALE
        holder, attempt = parsed
        if row is None:
            assert claim is not None
            row = claim.row  # this source's own lease: the guard below judges ownership (R4)
        lease = presented_lease(row, holder, attempt, claim)
        # The ceiling only matters for a failure (retry or dead-letter): the row's own (R18).
        max_attempts = int(row["max_attempts"]) if failure is not None else 0
        execution = claim.result if claim is not None and ours else None
        outcome, resolved = recorded(
            lambda now: host_outcome(
                row,
                lease,
                execution,
                completed,
                failure,
                max_attempts=max_attempts,
                now=now,
                policy=self.policy_for(lease.action_kind),
            )
        )
        try:
            transition = await finish_run(
                self.db,
                lease,
                outcome,
                actor=system_actor(holder),
                evidence_refs=evidence(execution, completed),
                key_suffix="ack",
                group=None if alone else self._group,
                # R22: a completion stores the adapter's return value with its transition
                result=completion_result(execution) if completed is not None else None,
            )
        except TransitionIdempotencyConflict:
            self._forget(task_id, lease_id, applied=False)
            return STALE
        if not transition.applied:
            await keep_stale(self.db, lease, transition, execution, completed, failure)
        return self._settle(task_id, lease_id, digest, transition, resolved, lease.action_kind)

    def _settle(
        self,
        task_id: str,
        lease_id: str,
        digest: str,
        transition: TransitionResult,
        resolved: list[Outcome],
        action_kind: str,
    ) -> TaskAck:
        """The acknowledgement for a committed (or refused) terminal transition; the one place
        an acknowledged end is counted (``taskward.metrics``: its run time from the claim this
        source registered, none for a lease it does not hold)."""
        ack = answer(transition, resolved)
        metrics = self.db.metrics
        if metrics is not None and transition.applied:
            claim = self._claims.get(task_id)
            held = claim is not None and claim.lease.lease_id == lease_id
            metrics.ended(
                action_kind,
                transition.current_state,
                time.monotonic() - claim.claimed_mono if held and claim is not None else None,
            )
        outcome = resolved[-1] if resolved else None
        if not transition.applied:
            # The row moved on (reclaimed, reaped, cancelled): this lease can never be
            # acknowledged again, so the side channel need not remember it.
            self._forget(task_id, lease_id, transition.current_state, None, applied=False)
            return ack
        self._acks[(task_id, lease_id)] = (digest, ack)
        while len(self._acks) > ACK_CACHE_SIZE:
            self._acks.popitem(last=False)
        self._forget(task_id, lease_id, transition.current_state, outcome)
        return ack

    def _forget(
        self,
        task_id: str,
        lease_id: str,
        state: str | None = None,
        outcome: Outcome | None = None,
        *,
        applied: bool = True,
    ) -> None:
        """Drop the side channel's record of a settled lease; its run's span (when tracing)
        ends here with the terminal transition: ``state`` the task's status after it, the
        ``outcome`` written (None: refused, ``applied`` False)."""
        claim = self._claims.get(task_id)
        if claim is not None and claim.lease.lease_id == lease_id:
            del self._claims[task_id]
            if claim.span is not None:
                execution = claim.result
                end_run(
                    claim.span,
                    state=state,
                    reason=outcome.reason_code if outcome is not None else None,
                    summary=outcome.summary if outcome is not None else None,
                    applied=applied,
                    adapter_status=execution.status if execution is not None else None,
                    exit_code=execution.exit_code if execution is not None else None,
                )


__all__ = ["ClaimedRun", "LocalTaskSource"]
