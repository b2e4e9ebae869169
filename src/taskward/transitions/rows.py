"""The one builder of what a transition writes: its compare-and-swap, its fact, its event and
(for a terminal state) its outbox notification (ADR-0072 D3, D6).

A ``Move`` is one row's transition fully prepared, however it was built: from a request
(``move_of``) or from a template without a request per row (``templates``). ``audit_rows``
builds the three rows every writer stores; the PostgreSQL one-statement forms
(``run_claim_batch``, ``run_finish_batch`` in its queries.sql) write the same rows in SQL, and
``tests/integration/test_worker.py`` compares them column by column with these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from taskward.canonical import dumps, json_string
from taskward.ids import new_id
from taskward.lifecycle import is_terminal
from taskward.models import TransitionRequest
from taskward.store.port import RunUpdate
from taskward.transitions.requests import lease_id

# A terminal notification's delivery bounds (ADR-0072 D6, R12): how many attempts, and how long
# it may wait before it expires. The only copy: every writer passes them (run_finish_batch as
# parameters), and the outbox statements' defaults are for other callers.
OUTBOX_MAX_ATTEMPTS: Final = 10
OUTBOX_TTL_S: Final = 604800.0


@dataclass(slots=True)
class Move:
    """One run's transition, ready to write: the compare-and-swap (``update``: id, from state,
    the values it sets, its guard) and what its fact records. ``lease``: the lease under which
    the write happens when the guard presents one (None: the fact records the row's new lease).
    ``payload``: the event's, when a group's writer built it once. ``result``: a completion's
    return value as JSON text (R22), written with the fact when the move applies."""

    update: RunUpdate
    entity_type: str
    to_state: str
    reason_code: str
    reason_summary: str
    evidence_refs: str
    source: str
    actor: str
    metadata: str
    key: str
    digest: str
    lease: str | None
    payload: str | None = None
    result: str | None = None

    @property
    def entity_id(self) -> str:
        return self.update[0]

    @property
    def from_state(self) -> str:
        return self.update[1]


def guarded_lease_id(guard: Mapping[str, Any]) -> str | None:
    """The lease under which a write happens when the caller presented one (terminal writes,
    reaper moves); None when it did not, and the fact records the row's new lease instead."""
    if guard.get("leased_by") is not None and "lease_attempts" in guard:
        return lease_id(guard["leased_by"], guard["lease_attempts"])
    return None


def values(
    to_state: str, reason_code: str, summary: str, evidence_refs: str, now: float
) -> dict[str, Any]:
    """What every compare-and-swap sets besides the caller's patch: the status and its
    projection (``store.port.RUN_PROJECTION_COLUMNS``)."""
    return {
        "status": to_state,
        "updated_at": now,
        "status_reason_code": reason_code,
        "status_reason_summary": summary,
        "status_evidence_refs": evidence_refs,
    }


def move_of(
    request: TransitionRequest,
    guard: Mapping[str, Any],
    patch: Mapping[str, Any],
    digest: str,
    now: float,
) -> Move:
    """The move of a checked request (``requests.prepared``) at ``now``."""
    reason = request.reason
    evidence = dumps(reason.evidence_refs)
    sets = values(request.to_state, reason.code, reason.summary, evidence, now)
    sets.update(patch)
    return Move(
        update=(request.entity_id, request.from_state, sets, guard),
        entity_type=request.entity_type,
        to_state=request.to_state,
        reason_code=reason.code,
        reason_summary=reason.summary,
        evidence_refs=evidence,
        source=request.actor.type,
        actor=request.actor.label(),
        metadata=dumps(reason.metadata),
        key=request.idempotency_key,
        digest=digest,
        lease=guarded_lease_id(guard),
    )


def templated(
    template: Mapping[str, Any],
    *,
    entity_id: str,
    summary: str,
    evidence_refs: str,
    guard: Mapping[str, Any],
    patch: Mapping[str, Any],
    key: str,
    digest: str,
    now: float,
) -> Move:
    """The move of one row of a template's group (``claim.claim_template``,
    ``finish.finish_template``): the edge, reason, actor, metadata and event payload are the
    template's, the rest the row's (its summary, evidence, guard, patch, key and hash, spliced
    by the caller into the template's text)."""
    to_state, reason_code = template["to_state"], template["reason_code"]
    sets = values(to_state, reason_code, summary, evidence_refs, now)
    sets.update(patch)
    return Move(
        update=(entity_id, template["from_state"], sets, guard),
        entity_type=template["entity_type"],
        to_state=to_state,
        reason_code=reason_code,
        reason_summary=summary,
        evidence_refs=evidence_refs,
        source=template["source"],
        actor=template["actor"],
        metadata=template["metadata"],
        key=key,
        digest=digest,
        lease=guarded_lease_id(guard),
        payload=template["payload"],
    )


def event_payload(from_state: str, to_state: str, reason_code: str, actor: str) -> str:
    """dumps({"from": ..., "to": ..., "reason_code": ..., "actor": ...}), spliced."""
    return (
        f'{{"from":{json_string(from_state)},"to":{json_string(to_state)},'
        f'"reason_code":{json_string(reason_code)},"actor":{json_string(actor)}}}'
    )


def result_row(move: Move, attempt: int) -> dict[str, Any] | None:
    """The ``task_results`` row of an applied ``move`` (R22): its result, when it moved to
    ``completed`` with one, under the attempt that completed; else None."""
    if move.result is None or move.to_state != "completed":
        return None
    return {"task_id": move.update[0], "attempt": attempt, "result": move.result}


def audit_rows(
    move: Move, transition_id: str, event_id: str, row_lease: str | None
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """The fact, its event and (for a terminal state; else None) its notification of ``move``,
    as the ``<name>_many`` statements' rows; ``row_lease``: the updated row's lease id, recorded
    when the guard presented none."""
    entity_id, from_state = move.update[0], move.update[1]
    fact = {
        "id": transition_id,
        "entity_type": move.entity_type,
        "entity_id": entity_id,
        "previous_status": from_state,
        "status": move.to_state,
        "reason_code": move.reason_code,
        "reason_summary": move.reason_summary,
        "evidence_refs": move.evidence_refs,
        "source": move.source,
        "actor": move.actor,
        "metadata": move.metadata,
        "idempotency_key": move.key,
        "request_hash": move.digest,
        "event_id": event_id,
        "lease_id": move.lease or row_lease,
    }
    event = {
        "id": event_id,
        "task_id": entity_id,
        "kind": "transition",
        "transition_id": transition_id,
        "status": move.to_state,
        "payload": move.payload
        or event_payload(from_state, move.to_state, move.reason_code, move.actor),
    }
    # -- outbox (ADR-0072 D6, R12) ----------------------------------------------------------
    # A terminal transition enqueues exactly one notification in this same transaction, keyed
    # by the transition id (ON CONFLICT DO NOTHING). Delivery (taskward.outbox) only ever
    # changes dispatch_outbox, never this task.
    if not is_terminal(move.to_state):
        return fact, event, None
    notification = {
        "id": new_id(),
        "kind": "task_terminal",
        "dedup_key": f"task-terminal:{transition_id}",
        "schedule_run_id": entity_id,
        "transition_id": transition_id,
        # dumps({"status": ..., "reason": {"code": ..., "summary": ...},
        #        "evidence_refs": ...}), spliced around the stored evidence text.
        "body": f'{{"status":{json_string(move.to_state)},'
        f'"reason":{{"code":{json_string(move.reason_code)},'
        f'"summary":{json_string(move.reason_summary)}}},"evidence_refs":{move.evidence_refs}}}',
        "max_attempts": OUTBOX_MAX_ATTEMPTS,
        "ttl_s": OUTBOX_TTL_S,
    }
    return fact, event, notification
