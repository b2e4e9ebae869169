"""``transition_task``: the only code that changes a run's status (ADR-0072 D3).

Checks run in the order of DESIGN.md R3:
  1. static checks raise before any I/O: entity type, reason code (closed list), guard and
     patch columns (allowlist), declared edge (R2);
  2. a replayed transition idempotency key returns its original result (different content
     raises TransitionIdempotencyConflict);
  3. a missing row raises TaskNotFound;
  4. the compare-and-swap: a loss is a conflict value that writes nothing and does not consume
     the key.
Invariant: status, reason projection, patch, exactly one status_transitions fact and exactly one
task event commit in one transaction, or none of them do.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from taskward.canonical import content_hash, dumps
from taskward.errors import InvalidTransition, TaskNotFound, TransitionIdempotencyConflict
from taskward.lifecycle import ENTITY_TYPES, check_edge, check_reason_code
from taskward.models import TransitionRequest, TransitionResult
from taskward.store.port import (
    RUN_GUARD_COLUMNS,
    RUN_PATCH_COLUMNS,
    ConcurrencyKeyBusy,
    StateDB,
    Tx,
)


class _LostToConcurrencyKey(Exception):
    """Internal: leave the transaction (rolling it back) and report a conflict."""


def _check_static(
    request: TransitionRequest, guard: Mapping[str, Any], patch: Mapping[str, Any]
) -> None:
    if request.entity_type not in ENTITY_TYPES:
        raise InvalidTransition("entity_type", request.entity_type, sorted(ENTITY_TYPES))
    check_reason_code(request.reason.code)
    for column in guard:
        if column not in RUN_GUARD_COLUMNS:
            raise InvalidTransition("guard", column, sorted(RUN_GUARD_COLUMNS))
    for column in patch:
        if column not in RUN_PATCH_COLUMNS:
            raise InvalidTransition("patch", column, sorted(RUN_PATCH_COLUMNS))
    check_edge(request.from_state, request.to_state)


def request_hash(request: TransitionRequest) -> str:
    """Hash of the request's content (guard and patch excluded: they carry times and leases
    that a retrying caller may recompute)."""
    return content_hash(request.model_dump(mode="json"))


def lease_id(leased_by: str | None, lease_attempts: int | None) -> str | None:
    """A lease id is ``<leased_by>/<lease_attempts>`` (R4)."""
    if leased_by is None:
        return None
    return f"{leased_by}/{lease_attempts or 0}"


async def apply_transition(
    tx: Tx,
    request: TransitionRequest,
    *,
    guard: Mapping[str, Any],
    patch: Mapping[str, Any],
    digest: str,
) -> TransitionResult:
    """Steps 2-4 of R3 inside an open transaction (callers did the static checks)."""
    replay = await tx.fetchone(
        "fact_get_by_key",
        {"entity_id": request.entity_id, "idempotency_key": request.idempotency_key},
    )
    if replay is not None:
        if replay["request_hash"] != digest:
            raise TransitionIdempotencyConflict(
                request.entity_id, request.idempotency_key, replay["id"]
            )
        return TransitionResult(
            applied=True,
            previous_state=replay["previous_status"],
            current_state=replay["status"],
            transition_id=replay["id"],
            event_id=replay["event_id"],
            replayed=True,
        )
    transition_id = str(uuid.uuid4())
    values: dict[str, Any] = {
        "status": request.to_state,
        "updated_at": tx.now,
        "status_reason_code": request.reason.code,
        "status_reason_summary": request.reason.summary,
        "status_evidence_refs": dumps(request.reason.evidence_refs),
        **patch,
    }
    try:
        updated = await tx.run_update_if(
            request.entity_id,
            request.from_state,
            values,
            guard,
            returning=("leased_by", "lease_attempts"),
        )
    except ConcurrencyKeyBusy as exc:
        raise _LostToConcurrencyKey from exc
    if updated is None:
        observed = await tx.fetchone("run_status", {"id": request.entity_id})
        if observed is None:
            raise TaskNotFound(request.entity_id)
        return TransitionResult(
            applied=False,
            conflict=True,
            previous_state=request.from_state,
            current_state=observed["status"],
            transition_id=transition_id,
        )
    event_id = str(uuid.uuid4())
    await tx.execute(
        "fact_insert",
        {
            "id": transition_id,
            "entity_type": request.entity_type,
            "entity_id": request.entity_id,
            "previous_status": request.from_state,
            "status": request.to_state,
            "reason_code": request.reason.code,
            "reason_summary": request.reason.summary,
            "evidence_refs": dumps(request.reason.evidence_refs),
            "source": request.actor.type,
            "actor": request.actor.label(),
            "metadata": dumps(request.reason.metadata),
            "idempotency_key": request.idempotency_key,
            "request_hash": digest,
            "event_id": event_id,
            # The lease under which this write happened: the guarded one when the caller
            # presented a lease (terminal writes, reaper moves), else the row's new lease.
            "lease_id": lease_id(guard["leased_by"], guard["lease_attempts"])
            if guard.get("leased_by") is not None and "lease_attempts" in guard
            else lease_id(updated["leased_by"], updated["lease_attempts"]),
        },
    )
    await tx.execute(
        "event_insert",
        {
            "id": event_id,
            "task_id": request.entity_id,
            "kind": "transition",
            "transition_id": transition_id,
            "status": request.to_state,
            "payload": dumps(
                {
                    "from": request.from_state,
                    "to": request.to_state,
                    "reason_code": request.reason.code,
                    "actor": request.actor.label(),
                }
            ),
        },
    )
    if request.to_state == "queued":
        tx.notify("queued")  # wake idle workers: claimable work appeared
    return TransitionResult(
        applied=True,
        previous_state=request.from_state,
        current_state=request.to_state,
        transition_id=transition_id,
        event_id=event_id,
    )


async def transition_task(
    db: StateDB,
    request: TransitionRequest,
    *,
    guard: Mapping[str, Any] | None = None,
    patch: Mapping[str, Any] | None = None,
    now: float | None = None,
) -> TransitionResult:
    """Move one run along one declared edge under compare-and-swap (ADR-0072 D3, R3).

    Returns:
        TransitionResult; ``conflict=True`` (nothing written) when the CAS lost.
    Raises:
        InvalidTransition: undeclared edge, unknown reason code, guard/patch column outside the
            allowlist (before any I/O).
        TransitionIdempotencyConflict: the key was used with different content.
        TaskNotFound: no run has ``request.entity_id``.
    """
    guard = dict(guard or {})
    patch = dict(patch or {})
    _check_static(request, guard, patch)
    digest = request_hash(request)
    try:
        async with db.transaction(now=now) as tx:
            return await apply_transition(tx, request, guard=guard, patch=patch, digest=digest)
    except _LostToConcurrencyKey:
        observed = await db.fetchone("run_status", {"id": request.entity_id})
        return TransitionResult(
            applied=False,
            conflict=True,
            previous_state=request.from_state,
            current_state=observed["status"] if observed else request.from_state,
            transition_id=str(uuid.uuid4()),
        )
