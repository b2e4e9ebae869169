"""The local source's one-step finish (``host.ports.FinishesInOneStep``): a successful task's
summary, its completion and the claim for the slot it frees in one transaction, shared (the
group commit's combine, ``finish_together``) with the other tasks finishing at the same moment.

ADR-0037 D4 holds inside the transaction: the summary rows are written first and the
completions commit only with them; D3 too: the claim passes run after the completions they
follow and ask for at most what each finished task's ``claim_next`` said. Anything unusual (a
summary already there, a replay, an error) rolls the batch back, and the source takes the
two-step path for each finish.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from taskward.claims import (
    CLAIM_CAP,
    Claimed,
    WorkerSpec,
    claim_pass,
    claim_rows,
    pass_calls,
    pass_claimed,
)
from taskward.errors import StoreUnavailable
from taskward.execution import Outcome, completion_result, finish_build
from taskward.host.acks import (
    ClaimedRun,
    evidence,
    host_outcome,
    keep_stale,
    parse_lease_id,
    recorded,
    result_payload,
    system_actor,
)
from taskward.host.models import SessionSummary, Task, TaskAck, TaskFailure, TaskResult
from taskward.host.ports import SummaryNotWritten, SummaryStore
from taskward.models import TransitionResult
from taskward.store.port import Tx
from taskward.transitions import Built
from taskward.transitions.finish import together

if TYPE_CHECKING:
    from taskward.execution import RetryPolicy
    from taskward.groupcommit import GroupCommit
    from taskward.host.summaries import LocalSummaryStore
    from taskward.store.port import StateDB


@dataclass
class Finish:
    """One task's summary, completion and next claim, for ``complete_with_summary``."""

    summary: dict[str, Any]
    build: Callable[[float], Built]
    claim_next: Callable[[], int]


@dataclass
class Finished:
    """What the one step did: the completion's transition (or, on the two-step path, its
    acknowledgement already settled) and the runs leased for the freed slot."""

    claimed: list[Claimed]
    transition: TransitionResult | None = None
    ack: TaskAck | None = None


class SummaryExists(Exception):
    """A batch of one-step finishes wrote fewer summaries than it has finishes: the batch rolls
    back and each finish takes the two-step path, which judges the row already there."""


async def finish_together(tx: Tx, items: list[Finish], *, spec: WorkerSpec) -> list[Finished]:
    """GroupCommit's combine for ``complete_with_summary``: every summary (one multi-row
    insert), then every completion (one set-based compare-and-swap), then claim passes of at
    most 20 for the slots those completions freed; in one round trip where the store runs the
    three as statements (``transitions.finish.together``), and a pass it did not finish (or did
    not run) continues as the paged pass.

    A session that already has a summary row (pending, or complete: a replay or a conflict)
    fails the insert (``summary_insert_many``), which rolls the batch back: each finish then
    takes the two-step path, which judges that row as ``summary_write`` does."""
    summaries = ("summary_insert_many", [item.summary for item in items])
    # Asked before the completions are written, as one decision for the whole step (D3).
    wanted = [max(0, item.claim_next()) for item in items]
    passes = pass_calls(spec, sum(wanted), tx.now)
    [count], transitions, answers = await together(
        tx,
        [summaries],
        [item.build for item in items],
        [(call.template, call.params, call.limit) for call in passes],
    )
    if count != len(items):
        raise SummaryExists
    claimed: list[Claimed] = []
    more = not passes
    for call, batch in zip(passes, answers, strict=True):
        if batch is None:  # not run with the step: the paged passes claim
            more = True
            continue
        got, left = pass_claimed(spec, tx.now, call, batch)
        claimed += got
        more = more or (left and len(got) < call.limit)
    claimed = await claim_passes(tx, spec, sum(wanted), claimed, more=more)
    finished = []
    for transition, count in zip(transitions, wanted, strict=True):
        finished.append(Finished(claimed=claimed[:count], transition=transition))
        del claimed[:count]
    return finished


async def claim_passes(
    tx: Tx, spec: WorkerSpec, wanted: int, claimed: list[Claimed], *, more: bool
) -> list[Claimed]:
    """Claim passes of at most 20 until ``wanted`` leases are held or the queue has no more for
    this worker (a pass came back short); ``more`` False: it already said so."""
    while more and len(claimed) < wanted:
        ask = min(CLAIM_CAP, wanted - len(claimed))
        got = await claim_pass(tx, spec, ask)
        claimed += got
        more = len(got) == ask
    return claimed


class OneStepFinish:
    """``LocalTaskSource``'s side of ``host.ports.FinishesInOneStep``: ``complete_with_summary``
    and its two-step fallback. A base of ``LocalTaskSource`` only (its state and its
    acknowledgement path, named below for the type checker, are the source's own), kept here
    beside ``finish_together``, the combine it hands the group commit."""

    if TYPE_CHECKING:
        db: StateDB
        spec: WorkerSpec
        policy: RetryPolicy
        _summaries: LocalSummaryStore | None
        _claims: dict[str, ClaimedRun]
        _acks: OrderedDict[tuple[str, str], tuple[str, TaskAck]]
        _group: GroupCommit

        def _settle(
            self,
            task_id: str,
            lease_id: str,
            digest: str,
            transition: TransitionResult,
            resolved: list[Outcome],
            action_kind: str,
        ) -> TaskAck: ...

        async def _acknowledge(
            self,
            task_id: str,
            lease_id: str,
            payload: dict[str, Any],
            *,
            completed: TaskResult | None = None,
            failure: TaskFailure | None = None,
            alone: bool = False,
        ) -> TaskAck: ...

        async def _register_all(self, claimed: list[Claimed]) -> list[Task]: ...

    @property
    def summary_store(self) -> LocalSummaryStore | None:
        """The summary store this source writes into when it finishes a task in one step."""
        return self._summaries

    def writes_summaries_to(self, store: SummaryStore) -> bool:
        return self._summaries is not None and store is self._summaries

    async def complete_with_summary(
        self,
        task_id: str,
        lease_id: str,
        result: TaskResult,
        summary: SessionSummary,
        *,
        claim_next: Callable[[], int],
    ) -> tuple[TaskAck, list[Task]]:
        """The summary, the completion and the next claim for the freed slot in one transaction
        — shared, like every unit of the group commit, with the other tasks finishing at the
        same moment — instead of three commits one after the other.

        D4 holds inside the transaction: the summary row is written first and the completion
        commits only with it; D3 holds too: the claim pass runs after the completions it follows
        and asks for at most ``claim_next()`` per finished task. Anything unusual (a summary
        already there, a replay, an error) rolls the batch back and each finish takes the
        two-step path: ``write``, then ``complete``, then ``claim_many``, each on its own.
        """
        if self._summaries is None:
            raise RuntimeError("this LocalTaskSource was built without a summary store")
        _, digest = result_payload(result)
        claim = self._claims.get(task_id)
        parsed = parse_lease_id(lease_id)

        async def two_steps() -> Finished:
            return await self._finish_in_steps(task_id, lease_id, result, summary, claim_next)

        if (
            claim is None
            or claim.lease.lease_id != lease_id
            or parsed is None
            or (task_id, lease_id) in self._acks
        ):
            finished = await two_steps()
            return await self._finished(finished, task_id, lease_id, digest, [])
        outcome, resolved = recorded(
            lambda now: host_outcome(
                claim.row,
                claim.lease,
                claim.result,
                result,
                None,
                max_attempts=0,
                now=now,
                policy=self.policy,
            )
        )
        item = Finish(
            summary=self._summaries.params(result.summary_ref, summary),
            build=finish_build(
                claim.lease,
                outcome,
                actor=system_actor(parsed[0]),
                evidence_refs=evidence(claim.result, result),
                key_suffix="ack",
                result=completion_result(claim.result),  # R22: stored with the completion
            ),
            claim_next=claim_next,
        )
        finished = await self._group.run_many(
            "host_finish", item, partial(finish_together, spec=self.spec), fallback=two_steps
        )
        if finished.transition is not None and not finished.transition.applied:
            await keep_stale(self.db, claim.lease, finished.transition, claim.result, result, None)
        return await self._finished(finished, task_id, lease_id, digest, resolved, claim)

    async def _finished(
        self,
        finished: Finished,
        task_id: str,
        lease_id: str,
        digest: str,
        resolved: list[Outcome],
        claim: ClaimedRun | None = None,
    ) -> tuple[TaskAck, list[Task]]:
        if finished.ack is not None:
            ack = finished.ack
        else:
            assert finished.transition is not None and claim is not None
            ack = self._settle(
                task_id, lease_id, digest, finished.transition, resolved, claim.lease.action_kind
            )
        return ack, await self._register_all(finished.claimed)

    async def _finish_in_steps(
        self,
        task_id: str,
        lease_id: str,
        result: TaskResult,
        summary: SessionSummary,
        claim_next: Callable[[], int],
    ) -> Finished:
        """The two-step path, each step in a transaction of its own (never the group's)."""
        assert self._summaries is not None
        try:
            await self._summaries.write(result.summary_ref, summary, alone=True)
        except StoreUnavailable:
            raise  # the host retries the whole finish: every step of it is idempotent
        except Exception as exc:
            raise SummaryNotWritten(f"summary not written: {exc!r}") from exc
        ack = await self._acknowledge(
            task_id, lease_id, result.model_dump(mode="json"), completed=result, alone=True
        )
        count = claim_next()
        claimed = await claim_rows(self.db, self.spec, limit=count) if count > 0 else []
        return Finished(claimed=claimed, ack=ack)
