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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from taskward.claims import CLAIM_CAP, Claimed, WorkerSpec, claim_pass, pass_calls, pass_claimed
from taskward.host.models import TaskAck
from taskward.models import TransitionResult
from taskward.store.port import Tx
from taskward.transitions import Built
from taskward.transitions.finish import together


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
