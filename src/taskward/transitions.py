"""``transition_task``: the only code that changes a run's status (ADR-0072 D3).

Checks run, as a caller observes them, in the order of DESIGN.md R3:
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

from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any, Final, NamedTuple, Protocol

from taskward.canonical import (
    content_hash,
    dumps,
    json_string,
    loads,
    plain_canonical_json,
    text_hash,
)
from taskward.errors import InvalidTransition, TaskNotFound, TransitionIdempotencyConflict
from taskward.groupcommit import GroupCommit
from taskward.ids import new_id
from taskward.lifecycle import ENTITY_TYPES, check_edge, check_reason_code, is_terminal
from taskward.models import (
    Actor,
    StateReason,
    TransitionRequest,
    TransitionResult,
    constructed,
)
from taskward.store.guarded import update_shape
from taskward.store.port import (
    RUN_GUARD_COLUMNS,
    RUN_PATCH_COLUMNS,
    AuditingTx,
    ConcurrencyKeyBusy,
    Row,
    RunUpdate,
    StateDB,
    Tx,
)
from taskward.store.port import (
    KeyAlreadyUsed as KeyAlreadyUsed,  # raised here too; callers catch it from here
)


class LostToConcurrencyKey(Exception):
    """Internal: the write would run a second row with a running serialization key (R7); leave
    the transaction or savepoint (rolling it back) and report a lost claim."""


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
    that a retrying caller may recompute).

    The canonical JSON of ``request.model_dump(mode="json")`` is spliced here field by field
    (``_request_text``), as the hot path hashes every claim and every acknowledgement; a
    reason whose evidence or metadata holds anything but plain JSON goes through the model, as
    does a subclass with fields of its own. A unit test holds the two equal.
    """
    text = _request_text(request)
    if text is None:
        return content_hash(request.model_dump(mode="json"))
    return text_hash(text)


def _request_text(request: TransitionRequest) -> str | None:
    """The canonical JSON of ``request`` spliced from its fields (keys in sorted order); None
    when only the model can say (see ``request_hash``)."""
    reason = request.reason
    evidence = plain_canonical_json(reason.evidence_refs)
    metadata = plain_canonical_json(reason.metadata) if evidence is not None else None
    actor = request.actor
    if (
        metadata is None
        or type(request) is not TransitionRequest
        or type(reason) is not StateReason
        or type(actor) is not Actor
    ):
        return None
    return (
        f'{{"actor":{{"id":{json_string(actor.id)},"type":{json_string(actor.type)}}},'
        f'"entity_id":{json_string(request.entity_id)},'
        f'"entity_type":{json_string(request.entity_type)},'
        f'"from_state":{json_string(request.from_state)},'
        f'"idempotency_key":{json_string(request.idempotency_key)},'
        f'"reason":{{"code":{json_string(reason.code)},"evidence_refs":{evidence},'
        f'"metadata":{metadata},"summary":{json_string(reason.summary)}}},'
        f'"to_state":{json_string(request.to_state)}}}'
    )


def lease_id(leased_by: str | None, lease_attempts: int | None) -> str | None:
    """A lease id is ``<leased_by>/<lease_attempts>`` (R4)."""
    if leased_by is None:
        return None
    return f"{leased_by}/{lease_attempts or 0}"


async def replayed_result(
    reader: Tx | StateDB, request: TransitionRequest, digest: str
) -> TransitionResult | None:
    """The original result of a used key; raises when the key was used with other content."""
    replay = await reader.fetchone(
        "fact_get_by_key",
        {"entity_id": request.entity_id, "idempotency_key": request.idempotency_key},
    )
    if replay is None:
        return None
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


def _values(request: TransitionRequest, patch: Mapping[str, Any], now: float) -> dict[str, Any]:
    """What the compare-and-swap sets: the status, its projection and the caller's patch."""
    return {
        "status": request.to_state,
        "updated_at": now,
        "status_reason_code": request.reason.code,
        "status_reason_summary": request.reason.summary,
        "status_evidence_refs": dumps(request.reason.evidence_refs),
        **patch,
    }


def _returned(returning: Sequence[str]) -> tuple[str, ...]:
    """``returning`` plus the lease columns the fact's lease id needs."""
    if "*" in returning:
        return tuple(returning)
    return (*returning, *(c for c in ("leased_by", "lease_attempts") if c not in returning))


def _guarded_lease_id(guard: Mapping[str, Any]) -> str | None:
    """The lease under which a write happens when the caller presented one (terminal writes,
    reaper moves); None when it did not, and the fact records the row's new lease instead."""
    if guard.get("leased_by") is not None and "lease_attempts" in guard:
        return lease_id(guard["leased_by"], guard["lease_attempts"])
    return None


def _writes(
    request: TransitionRequest,
    guard: Mapping[str, Any],
    updated: Row,
    transition_id: str,
    digest: str,
) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """The fact, its event and (for a terminal state) its notification, as named statements;
    the fact always comes first. Returns them and the event id."""
    event_id = new_id()
    fact, event, notification = _audit_rows(
        transition_id=transition_id,
        event_id=event_id,
        entity_type=request.entity_type,
        entity_id=request.entity_id,
        from_state=request.from_state,
        to_state=request.to_state,
        reason_code=request.reason.code,
        reason_summary=request.reason.summary,
        evidence_refs=dumps(request.reason.evidence_refs),
        source=request.actor.type,
        actor=request.actor.label(),
        metadata=dumps(request.reason.metadata),
        idempotency_key=request.idempotency_key,
        request_hash=digest,
        lease_id=_guarded_lease_id(guard)
        or lease_id(updated["leased_by"], updated["lease_attempts"]),
    )
    statements = [("fact_insert", fact), ("event_insert", event)]
    if notification is not None:
        statements.append(("outbox_enqueue", notification))
    return statements, event_id


def _event_payload(from_state: str, to_state: str, reason_code: str, actor: str) -> str:
    """dumps({"from": ..., "to": ..., "reason_code": ..., "actor": ...}), spliced."""
    return (
        f'{{"from":{json_string(from_state)},"to":{json_string(to_state)},'
        f'"reason_code":{json_string(reason_code)},"actor":{json_string(actor)}}}'
    )


def _audit_rows(
    *,
    transition_id: str,
    event_id: str,
    entity_type: str,
    entity_id: str,
    from_state: str,
    to_state: str,
    reason_code: str,
    reason_summary: str,
    evidence_refs: str,
    source: str,
    actor: str,
    metadata: str,
    idempotency_key: str,
    request_hash: str,
    lease_id: str | None,
    payload: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """One transition's fact, its event and (for a terminal state; else None) its
    notification, as the ``_many`` statements' rows: what every set-based writer stores (the
    request-per-row path, and the claim and finish templates'); ``evidence_refs`` and
    ``metadata`` as their stored JSON text; ``payload``: the event's, when a group's writer
    built it once (``_event_payload``)."""
    fact = {
        "id": transition_id,
        "entity_type": entity_type,
        "entity_id": entity_id,
        "previous_status": from_state,
        "status": to_state,
        "reason_code": reason_code,
        "reason_summary": reason_summary,
        "evidence_refs": evidence_refs,
        "source": source,
        "actor": actor,
        "metadata": metadata,
        "idempotency_key": idempotency_key,
        "request_hash": request_hash,
        "event_id": event_id,
        "lease_id": lease_id,
    }
    event = {
        "id": event_id,
        "task_id": entity_id,
        "kind": "transition",
        "transition_id": transition_id,
        "status": to_state,
        "payload": payload or _event_payload(from_state, to_state, reason_code, actor),
    }
    # -- outbox (ADR-0072 D6, R12) ----------------------------------------------------------
    # A terminal transition enqueues exactly one notification in this same transaction, keyed
    # by the transition id (ON CONFLICT DO NOTHING). Delivery (taskward.outbox) only ever
    # changes dispatch_outbox, never this task. NULL max_attempts/ttl_s take the defaults.
    if not is_terminal(to_state):
        return fact, event, None
    notification = {
        "id": new_id(),
        "kind": "task_terminal",
        "dedup_key": f"task-terminal:{transition_id}",
        "schedule_run_id": entity_id,
        "transition_id": transition_id,
        # dumps({"status": ..., "reason": {"code": ..., "summary": ...},
        #        "evidence_refs": ...}), spliced around the stored evidence text.
        "body": f'{{"status":{json_string(to_state)},'
        f'"reason":{{"code":{json_string(reason_code)},'
        f'"summary":{json_string(reason_summary)}}},"evidence_refs":{evidence_refs}}}',
        "max_attempts": None,
        "ttl_s": None,
    }
    # -- end outbox -----------------------------------------------------------------------
    return fact, event, notification


async def _lost(
    tx: Tx, request: TransitionRequest, digest: str, transition_id: str
) -> TransitionResult:
    """The compare-and-swap matched nothing: a replay of a used key, a missing row (raises
    TaskNotFound) or a conflict that writes nothing (R3 steps 2-4)."""
    replay = await replayed_result(tx, request, digest)
    if replay is not None:
        return replay
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


_APPLIED_FIELDS: Final = ("applied", "previous_state", "current_state", "transition_id", "event_id")


def _applied(request: TransitionRequest, transition_id: str, event_id: str) -> TransitionResult:
    return _applied_move(request.from_state, request.to_state, transition_id, event_id)


def _applied_move(
    from_state: str, to_state: str, transition_id: str, event_id: str
) -> TransitionResult:
    # Every value is already of its field's type (a validated request's, or a template's
    # built from one): no validation.
    return constructed(
        TransitionResult,
        {
            "applied": True,
            "conflict": False,
            "previous_state": from_state,
            "current_state": to_state,
            "transition_id": transition_id,
            "event_id": event_id,
            "replayed": False,
        },
        _APPLIED_FIELDS,
    )


async def _write_audit_rows(
    tx: Tx, rows_of: Mapping[str, Sequence[Mapping[str, Any]]], keys: Mapping[str, str]
) -> None:
    """The facts (``rows_of["fact_insert"]``), then the events and notifications, each with
    ``write_many``, in one round trip; ``keys`` maps each fact's id to its transition key. A fact
    whose key was taken inserts nothing and the count falls short: KeyAlreadyUsed, and the
    caller rolls back the whole transaction, the rows written beside it too."""
    names = ["fact_insert", *(name for name in rows_of if name != "fact_insert")]
    counts = await tx.write_many([(f"{name}_many", rows_of[name]) for name in names])
    if counts[0] < len(keys):
        present = await tx.fetchall("fact_ids_among", {"ids": dumps(list(keys))})
        for fact_id in keys.keys() - {fact["id"] for fact in present}:
            raise KeyAlreadyUsed(keys[fact_id])


async def apply_transition(
    tx: Tx,
    request: TransitionRequest,
    *,
    guard: Mapping[str, Any],
    patch: Mapping[str, Any],
    digest: str,
    returning: Sequence[str] = ("leased_by", "lease_attempts"),
) -> tuple[TransitionResult, Row | None]:
    """Steps 2-4 of R3 inside an open transaction (callers did the static checks).

    The compare-and-swap runs first and the fact insert is ``ON CONFLICT DO NOTHING`` on the
    unique (entity_id, idempotency_key) index: a used key can never apply twice (the insert
    finds it and ``KeyAlreadyUsed`` rolls the update back), and a lost compare-and-swap looks for
    a replay before it reports a missing row or a conflict. What a caller observes is exactly
    R3's order, with one statement fewer on the common path. Returns the result and the
    ``returning`` columns of the updated row (None when nothing was written).
    """
    transition_id = new_id()
    try:
        updated = await tx.run_update_if(
            request.entity_id,
            request.from_state,
            _values(request, patch, tx.now),
            guard,
            returning=_returned(returning),
        )
    except ConcurrencyKeyBusy as exc:
        raise LostToConcurrencyKey from exc
    if updated is None:
        return await _lost(tx, request, digest, transition_id), None
    statements, event_id = _writes(request, guard, updated, transition_id, digest)
    # The fact, its event and any notification travel together (one round trip on
    # PostgreSQL); a fact whose key is taken inserts nothing, and KeyAlreadyUsed rolls the
    # whole transaction back (the notification with it).
    inserted = (await tx.fetch_batch(statements))[0]
    if inserted is None:
        raise KeyAlreadyUsed(request.idempotency_key)
    if request.to_state == "queued":
        tx.notify("queued")  # wake idle workers: claimable work appeared
    return _applied(request, transition_id, event_id), updated


Prepared = tuple[TransitionRequest, Mapping[str, Any], Mapping[str, Any], str]
"""A statically checked transition ready to apply: ``(request, guard, patch, digest)``."""


async def apply_transitions(
    tx: Tx,
    items: Sequence[Prepared],
    *,
    returning: Sequence[str] = ("leased_by", "lease_attempts"),
) -> list[tuple[TransitionResult, Row | None]]:
    """``apply_transition`` for many transitions in one open transaction, set-based.

    Each item keeps exactly its own semantics: its own compare-and-swap on its own row and
    guard values, and when it applies, its own fact, event and notification. What is shared is
    the statement: the compare-and-swaps of items of one shape (same columns set and guarded)
    run as one multi-row UPDATE, and every applied item's inserts go in one pipelined batch.
    Items that touch the same run are applied in their given order (the k-th item of a run goes
    in the k-th round). A used transition key raises KeyAlreadyUsed and a serialization-key
    clash LostToConcurrencyKey, as for one item: the caller rolls back and retries item by item.
    """
    results: list[tuple[TransitionResult, Row | None] | None] = [None] * len(items)
    rounds: list[list[int]] = []
    occurrences: dict[str, int] = {}
    for index, (request, _, _, _) in enumerate(items):
        k = occurrences.get(request.entity_id, 0)
        occurrences[request.entity_id] = k + 1
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(index)
    wanted = _returned(returning)
    for round_indexes in rounds:
        shapes: dict[object, list[int]] = {}
        updates: dict[int, RunUpdate] = {}
        for index in round_indexes:
            request, guard, patch, _ = items[index]
            update = (
                request.entity_id,
                request.from_state,
                _values(request, patch, tx.now),
                guard,
            )
            updates[index] = update
            shapes.setdefault(update_shape(update), []).append(index)
        for group in shapes.values():
            if len(group) == 1:
                request, guard, patch, digest = items[group[0]]
                results[group[0]] = await apply_transition(
                    tx, request, guard=guard, patch=patch, digest=digest, returning=returning
                )
                continue
            auditing = tx.auditing()
            if auditing is not None:
                await _apply_audited(auditing, items, group, updates, wanted, results)
                continue
            try:
                rows = await tx.run_update_many([updates[i] for i in group], returning=wanted)
            except ConcurrencyKeyBusy as exc:
                raise LostToConcurrencyKey from exc
            by_id = {row["id"]: row for row in rows}
            # One multi-row insert per table, each row exactly the one-row statement's
            # parameters (``<name>_many`` in queries.sql).
            rows_of: dict[str, list[dict[str, Any]]] = {}
            keys: dict[str, str] = {}  # fact id -> its transition key
            for index in group:
                request, guard, _, digest = items[index]
                transition_id = new_id()
                updated = by_id.get(request.entity_id)
                if updated is None:
                    results[index] = (await _lost(tx, request, digest, transition_id), None)
                    continue
                writes, event_id = _writes(request, guard, updated, transition_id, digest)
                for name, params in writes:
                    rows_of.setdefault(name, []).append(params)
                keys[transition_id] = request.idempotency_key
                results[index] = (_applied(request, transition_id, event_id), updated)
                if request.to_state == "queued":
                    tx.notify("queued")
            if keys:
                await _write_audit_rows(tx, rows_of, keys)
    return [result for result in results if result is not None]


def _audit(request: TransitionRequest, guard: Mapping[str, Any], digest: str) -> dict[str, Any]:
    """What the audited compare-and-swap needs of one transition beyond the update itself
    (``guarded.AUDIT_FIELDS``): the rows ``_writes`` would build, reduced to what the
    compare-and-swap's own columns do not already hold."""
    return {
        "fact_id": new_id(),
        "event_id": new_id(),
        "outbox_id": new_id() if is_terminal(request.to_state) else None,
        "entity_type": request.entity_type,
        "source": request.actor.type,
        "actor": request.actor.label(),
        "metadata": dumps(request.reason.metadata),
        "idempotency_key": request.idempotency_key,
        "request_hash": digest,
        "lease_id": _guarded_lease_id(guard),  # None: the statement reads the row's
    }


async def _apply_audited(
    tx: AuditingTx,
    items: Sequence[Prepared],
    group: list[int],
    updates: Mapping[int, RunUpdate],
    wanted: Sequence[str],
    results: list[tuple[TransitionResult, Row | None] | None],
) -> None:
    """One group of ``apply_transitions`` where the store writes the facts, events and
    notifications in the compare-and-swap's own statement (``Tx.auditing``). The
    semantics are the two-statement path's: a row the compare-and-swap did not change gets
    ``_lost``'s answer and nothing written; a taken transition key raises KeyAlreadyUsed."""
    audits = [_audit(items[i][0], items[i][1], items[i][3]) for i in group]
    try:
        rows = await tx.run_update_many_audited(
            [updates[i] for i in group], audits, returning=wanted
        )
    except ConcurrencyKeyBusy as exc:
        raise LostToConcurrencyKey from exc
    by_id = {row["id"]: row for row in rows}
    for index, audit in zip(group, audits, strict=True):
        request, _, _, digest = items[index]
        updated = by_id.get(request.entity_id)
        if updated is None:
            results[index] = (await _lost(tx, request, digest, audit["fact_id"]), None)
            continue
        if not updated.pop("fact_written"):
            raise KeyAlreadyUsed(request.idempotency_key)
        results[index] = (_applied(request, audit["fact_id"], audit["event_id"]), updated)
        if request.to_state == "queued":
            tx.notify("queued")


# -- the claim edge, set-based in the store (PostgreSQL) -----------------------------------------

_ENTITY_MARK: Final = "@entity@"
_ATTEMPT_MARK: Final = "@attempt@"


def claim_template(request_for: Callable[[str, str], TransitionRequest]) -> dict[str, Any] | None:
    """What ``AuditingTx.claim_queued`` needs to write a claim's transition without a request
    per row: ``request_for(entity_id, attempt)`` (the claim's request, as the paged pass builds
    it) is built once with markers, and its fact's fields and its canonical request text are cut
    around them, so the store splices each row's id and attempt into the very text
    ``request_hash`` would hash. None when the request cannot be cut that way (a reason the
    model must encode, a marker met twice, not the ``queued -> running`` edge): the caller then
    claims through ``apply_transitions``."""
    request = request_for(_ENTITY_MARK, _ATTEMPT_MARK)
    if (request.from_state, request.to_state) != ("queued", "running"):
        return None
    _check_static(request, {}, {})
    text = _request_text(request)
    if text is None:
        return None
    head, found, rest = text.partition(json_string(_ENTITY_MARK))
    hashed = rest.split(_ATTEMPT_MARK)
    key = request.idempotency_key.split(_ATTEMPT_MARK)
    summary = request.reason.summary.split(_ATTEMPT_MARK)
    if (
        not found
        or len(hashed) != 3
        or len(key) != 2
        or len(summary) != 2
        or _ENTITY_MARK in head + rest + request.idempotency_key + request.reason.summary
    ):
        return None
    return {
        "entity_type": request.entity_type,
        "from_state": request.from_state,
        "to_state": request.to_state,
        "reason_code": request.reason.code,
        "summary_head": summary[0],
        "summary_tail": summary[1],
        "evidence_refs": dumps(request.reason.evidence_refs),
        "metadata": dumps(request.reason.metadata),
        "source": request.actor.type,
        "actor": request.actor.label(),
        "key_head": key[0],
        "key_tail": key[1],
        "hash_0": head,
        "hash_1": hashed[0],
        "hash_2": hashed[1],
        "hash_3": hashed[2],
    }


async def apply_claim_rows(
    tx: Tx,
    template: Mapping[str, Any],
    request_for: Callable[[str, str], TransitionRequest],
    items: Sequence[tuple[str, int, Mapping[str, Any], Mapping[str, Any]]],
) -> list[tuple[TransitionResult, Row | None]]:
    """``apply_transitions`` for claims ``(entity_id, attempt, guard, patch)`` of distinct runs,
    built from ``template`` (``claim_template``) instead of a request per row: one set-based
    compare-and-swap, then every fact and event with ``write_many``, each row exactly what the
    generic path writes for ``request_for(entity_id, attempt)`` (the request text spliced around
    the row's id and attempt, as the store does in ``claim_queued``; a test compares the rows).
    A row the compare-and-swap did not change gets ``_lost``'s answer, for which its request is
    built; a taken transition key raises KeyAlreadyUsed, a serialization-key clash
    LostToConcurrencyKey."""
    now = tx.now
    to_state, reason_code = template["to_state"], template["reason_code"]
    summary_head, summary_tail = template["summary_head"], template["summary_tail"]
    key_head, key_tail = template["key_head"], template["key_tail"]
    hash_0, hash_1, hash_2, hash_3 = (template[f"hash_{n}"] for n in range(4))
    updates: list[RunUpdate] = [
        (
            entity_id,
            template["from_state"],
            {
                "status": to_state,
                "updated_at": now,
                "status_reason_code": reason_code,
                "status_reason_summary": f"{summary_head}{attempt}{summary_tail}",
                "status_evidence_refs": template["evidence_refs"],
                **patch,
            },
            guard,
        )
        for entity_id, attempt, guard, patch in items
    ]
    try:
        rows = await tx.run_update_many(updates, returning=("*",))
    except ConcurrencyKeyBusy as exc:
        raise LostToConcurrencyKey from exc
    by_id = {row["id"]: row for row in rows}
    results: list[tuple[TransitionResult, Row | None]] = []
    facts: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    notifications: list[dict[str, Any]] = []
    keys: dict[str, str] = {}
    payload = _event_payload(template["from_state"], to_state, reason_code, template["actor"])
    for entity_id, attempt, guard, _ in items:
        transition_id = new_id()
        digest = text_hash(
            f"{hash_0}{json_string(entity_id)}{hash_1}{attempt}{hash_2}{attempt}{hash_3}"
        )
        updated = by_id.get(entity_id)
        if updated is None:
            request = request_for(entity_id, str(attempt))
            results.append((await _lost(tx, request, digest, transition_id), None))
            continue
        event_id = new_id()
        key = f"{key_head}{attempt}{key_tail}"
        fact, event, notification = _audit_rows(
            transition_id=transition_id,
            event_id=event_id,
            entity_type=template["entity_type"],
            entity_id=entity_id,
            from_state=template["from_state"],
            to_state=to_state,
            reason_code=reason_code,
            reason_summary=f"{summary_head}{attempt}{summary_tail}",
            evidence_refs=template["evidence_refs"],
            source=template["source"],
            actor=template["actor"],
            metadata=template["metadata"],
            idempotency_key=key,
            request_hash=digest,
            lease_id=_guarded_lease_id(guard)
            or lease_id(updated["leased_by"], updated["lease_attempts"]),
            payload=payload,
        )
        facts.append(fact)
        events.append(event)
        if notification is not None:
            notifications.append(notification)
        keys[transition_id] = key
        results.append(
            (
                _applied_move(template["from_state"], to_state, transition_id, event_id),
                updated,
            )
        )
    if keys:
        await _write_audit_rows(
            tx,
            {"fact_insert": facts, "event_insert": events, "outbox_enqueue": notifications},
            keys,
        )
    return results


class ClaimedRows(NamedTuple):
    """``claimed_rows``' answer: the rows it claimed (each as ``RETURNING *`` left it), in claim
    order, and what the page said: its size, whether a locked row with a serialization key
    stopped the pass, whether the worker's heartbeat was stale (then nothing was claimed)."""

    rows: list[Row]
    page_rows: int
    keyed: bool
    stale: bool


def claim_call(
    template: Mapping[str, Any], params: Mapping[str, Any], *, limit: int
) -> dict[str, Any]:
    """``AuditingTx.claim_queued``'s parameters for one claim pass of up to ``limit``: the page
    and lease parameters are the caller's (claims), the transition's are ``template``'s
    (``claim_template``), with new fact and event ids."""
    ids = [new_id() for _ in range(2 * limit)]
    return {
        **params,
        **template,
        "limit": limit,
        "fact_ids": ids[:limit],
        "event_ids": ids[limit:],
    }


def claimed_rows(template: Mapping[str, Any], found: list[Row]) -> ClaimedRows:
    """What ``claim_queued`` answered for a ``claim_call``, as ``ClaimedRows`` (rows in claim
    order); a taken transition key raises KeyAlreadyUsed."""
    page_rows, keyed, stale = found[0]["page_rows"], found[0]["keyed"], found[0]["stale"]
    claimed: list[tuple[int, Row]] = []
    for row in found:
        for column in ("page_rows", "keyed", "stale"):
            del row[column]
        written = row.pop("fact_written")
        place = row.pop("claim_k")
        if row["id"] is None:  # the page's answer alone: nothing claimed
            continue
        if not written:
            attempt = row["lease_attempts"]
            raise KeyAlreadyUsed(f"{template['key_head']}{attempt}{template['key_tail']}")
        claimed.append((place, row))
    claimed.sort(key=lambda pair: pair[0])
    return ClaimedRows([row for _, row in claimed], int(page_rows), bool(keyed), bool(stale))


Built = tuple[TransitionRequest, Mapping[str, Any], Mapping[str, Any]]


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
    return await transition_at(db, lambda _now: (request, guard, patch), now=now)


async def transition_at(
    db: StateDB,
    build: Callable[[float], Built],
    *,
    now: float | None = None,
    group: GroupCommit | None = None,
) -> TransitionResult:
    """``transition_task`` for a request whose content depends on the operation's time.

    ``build(now)`` runs inside the transaction with the store's time (R9), so a terminal write
    computes ``ended_at``/``retry_at`` without a separate clock read. Static checks still run
    before the first write.
    """
    if group is not None and now is None:
        # Share the commit, and the statements, with other transitions finishing at the same
        # moment; any error sends each of them down the ordinary path below, unchanged.
        return await group.run_many(
            "transition", build, apply_built, fallback=lambda: transition_at(db, build)
        )
    built: Built | None = None
    digest = ""
    try:
        async with db.transaction(now=now) as tx:
            request, guard, patch = built = build(tx.now)
            _check_static(request, guard, patch)
            digest = request_hash(request)
            result, _ = await apply_transition(tx, request, guard=guard, patch=patch, digest=digest)
            return result
    except KeyAlreadyUsed:
        assert built is not None
        replay = await replayed_result(db, built[0], digest)
        assert replay is not None  # facts are append-only: the key cannot have vanished
        return replay
    except LostToConcurrencyKey:
        assert built is not None
        observed = await db.fetchone("run_status", {"id": built[0].entity_id})
        return TransitionResult(
            applied=False,
            conflict=True,
            previous_state=built[0].from_state,
            current_state=observed["status"] if observed else built[0].from_state,
            transition_id=new_id(),
        )


async def apply_built(tx: Tx, builds: list[Callable[[float], Built]]) -> list[TransitionResult]:
    """Build each transition at ``tx``'s time, check it statically, and apply them all
    set-based (GroupCommit's combine for ``transition_at``). A replayed idempotency key raises
    ``KeyAlreadyUsed``: the caller's transaction is then rolled back whole.

    A group of ``TerminalBuild`` items that share one outcome goes through ``_apply_finishes``
    (one ``AuditingTx.finish_running`` statement where the store writes audit rows in its
    statements, rows built from the same template elsewhere); anything else, and anything
    that path declines, through ``apply_transitions``. Each outcome is resolved once either
    way."""
    now = tx.now
    if builds and all(type(build) is TerminalBuild for build in builds):
        terminals: list[TerminalBuild] = builds  # type: ignore[assignment]
        resolved = [terminal.resolve(now) for terminal in terminals]
        finished = await _apply_finishes(tx, terminals, resolved)
        if finished is not None:
            return finished
        built = [
            terminal.built(outcome) for terminal, outcome in zip(terminals, resolved, strict=True)
        ]
    else:
        built = [build(now) for build in builds]
    prepared: list[Prepared] = []
    for request, guard, patch in built:
        _check_static(request, guard, patch)
        prepared.append((request, guard, patch, request_hash(request)))
    return [result for result, _ in await apply_transitions(tx, prepared)]


# -- terminal transitions of a group, set-based in the store (PostgreSQL) -----------------------


class Resolved(Protocol):
    """What a terminal build's outcome resolves to (``execution.Outcome``)."""

    @property
    def to_state(self) -> str: ...
    @property
    def reason_code(self) -> str: ...
    @property
    def summary(self) -> str: ...
    @property
    def patch(self) -> dict[str, Any]: ...
    @property
    def metadata(self) -> dict[str, Any]: ...


class TerminalBuild:
    """A guarded transition out of ``running`` under a lease, built at the operation's time
    (``execution.finish_build``). A build like any other (called with the time, it answers
    ``Built``); ``apply_built`` also reads its parts, so that a group of them is written
    without a request model, a static check and a canonical text per item."""

    __slots__ = ("actor", "entity_id", "evidence_refs", "guard", "key", "outcome")

    def __init__(
        self,
        *,
        entity_id: str,
        guard: dict[str, Any],
        lease_id: str,
        outcome: Resolved | Callable[[float], Resolved],
        actor: Actor,
        evidence_refs: list[dict[str, Any]],
        key_suffix: str,
    ) -> None:
        self.entity_id = entity_id
        self.guard = guard
        self.key = f"{key_suffix}:{lease_id}"
        self.outcome = outcome
        self.actor = actor
        self.evidence_refs = evidence_refs

    def resolve(self, at: float) -> Resolved:
        """The outcome at ``at`` (an outcome given as a function of the time is called once)."""
        outcome = self.outcome
        return outcome(at) if callable(outcome) else outcome

    def built(self, resolved: Resolved) -> Built:
        request = TransitionRequest(
            entity_id=self.entity_id,
            from_state="running",
            to_state=resolved.to_state,
            reason=StateReason(
                code=resolved.reason_code,
                summary=resolved.summary,
                evidence_refs=self.evidence_refs,
                metadata=resolved.metadata,
            ),
            actor=self.actor,
            idempotency_key=self.key,
        )
        return request, self.guard, resolved.patch

    def __call__(self, at: float) -> Built:
        return self.built(self.resolve(at))


# The patch of every terminal outcome (execution.outcome_for), in its order; the statement sets
# ended_at to the transaction's time and error_detail and invocation_id to NULL, so only
# outcomes holding exactly that take it.
_FINISH_PATCH: Final = ("ended_at", "exit_code", "error_detail", "invocation_id")
_EVIDENCE_MARK: Final = "@evidence@"


@lru_cache(maxsize=64)
def finish_template(
    actor: Actor, key_head: str, to_state: str, reason_code: str, summary: str, metadata: str
) -> dict[str, Any] | None:
    """What ``AuditingTx.finish_running`` needs to write a group's ``running -> to_state``
    transitions without a request per row: the request (``metadata`` as its canonical JSON,
    the key ``key_head`` then the attempt) is built once with markers for the row's id,
    attempt and evidence, checked as ``apply_built`` checks each (raising as it would), and its
    canonical text cut around the markers, so the store hashes exactly the text
    ``request_hash`` would. None when it cannot be cut that way."""
    request = TransitionRequest(
        entity_id=_ENTITY_MARK,
        from_state="running",
        to_state=to_state,
        reason=StateReason(
            code=reason_code,
            summary=summary,
            evidence_refs=[{"kind": _EVIDENCE_MARK}],
            metadata=loads(metadata),
        ),
        actor=actor,
        idempotency_key=key_head + _ATTEMPT_MARK,
    )
    guard = {"leased_by": "", "lease_expires_at": 0.0, "lease_attempts": 0}
    _check_static(request, guard, dict.fromkeys(_FINISH_PATCH))
    text = _request_text(request)
    evidence = plain_canonical_json(request.reason.evidence_refs)
    if text is None or evidence is None:
        return None
    head, entity, rest = text.partition(json_string(_ENTITY_MARK))
    middle, attempt, rest = rest.partition(_ATTEMPT_MARK)
    between, refs, tail = rest.partition(evidence)
    pieces = (head, middle, between, tail, key_head, summary, metadata)
    marks = (_ENTITY_MARK, _ATTEMPT_MARK, _EVIDENCE_MARK)
    if not (entity and attempt and refs) or any(m in p for p in pieces for m in marks):
        return None
    return {
        "entity_type": request.entity_type,
        "from_state": "running",
        "to_state": to_state,
        "reason_code": reason_code,
        "summary": summary,
        "metadata": dumps(request.reason.metadata),
        "source": actor.type,
        "actor": actor.label(),
        "key_head": key_head,
        "key_tail": "",
        "hash_0": head,
        "hash_1": middle,
        "hash_2": between,
        "hash_3": tail,
    }


def _finish_params(
    terminals: Sequence[TerminalBuild], resolved: Sequence[Resolved], now: float
) -> tuple[dict[str, Any], str] | None:
    """``finish_running``'s parameters for the group, and its key head; None unless every item
    moves out of ``running`` to one outcome (state, reason, summary, metadata) under a lease of
    one owner, with the terminal patch at ``now`` and no error detail or invocation id, plain
    JSON evidence, and a run of its own."""
    first_terminal, first = terminals[0], resolved[0]
    metadata = plain_canonical_json(first.metadata)
    leased_by = first_terminal.guard.get("leased_by")
    if metadata is None or not isinstance(leased_by, str):
        return None
    suffix = first_terminal.key.partition(":")[0]
    key_head = f"{suffix}:{leased_by}/"
    outcome = (first.to_state, first.reason_code, first.summary)
    ids: list[str] = []
    attempts: list[int] = []
    expiries: list[float] = []
    exit_codes: list[int | None] = []
    evidence: list[str] = []
    for terminal, item in zip(terminals, resolved, strict=True):
        guard, patch = terminal.guard, item.patch
        attempt, expiry = guard.get("lease_attempts"), guard.get("lease_expires_at")
        exit_code = patch.get("exit_code")
        refs = plain_canonical_json(terminal.evidence_refs)
        if (
            (item.to_state, item.reason_code, item.summary) != outcome
            or item.metadata != first.metadata
            or terminal.actor != first_terminal.actor
            or tuple(guard) != ("leased_by", "lease_expires_at", "lease_attempts")
            or guard["leased_by"] != leased_by
            or type(attempt) is not int
            or type(expiry) is not float
            or terminal.key != f"{key_head}{attempt}"
            or tuple(patch) != _FINISH_PATCH
            or patch["ended_at"] != now
            or patch["error_detail"] is not None
            or patch["invocation_id"] is not None
            or (exit_code is not None and type(exit_code) is not int)
            or refs is None
        ):
            return None
        ids.append(terminal.entity_id)
        attempts.append(attempt)
        expiries.append(expiry)
        exit_codes.append(exit_code)
        evidence.append(refs)
    if len(set(ids)) != len(ids):
        return None
    params = {
        "metadata_json": metadata,
        "now": now,
        "worker_id": leased_by,
        "ids": ids,
        "attempts": attempts,
        "expiries": expiries,
        "exit_codes": exit_codes,
        "evidence": evidence,
    }
    return params, key_head


class FinishCall(NamedTuple):
    """A group of terminal builds prepared as one ``AuditingTx.finish_running`` statement
    (``finish_call``): its parameters, and what ``finish_results`` reads its answer with."""

    params: dict[str, Any]
    terminals: Sequence[TerminalBuild]
    resolved: Sequence[Resolved]
    fact_ids: list[str]
    event_ids: list[str]


def finish_call(tx: Tx, builds: Sequence[Callable[[float], Built]]) -> FinishCall | None:
    """``apply_built``'s one-statement path for ``builds``, prepared but not sent, for a caller
    that sends it together with other statements (``AuditingTx.together``). None unless the
    store writes audit rows in its statements and every build is a ``TerminalBuild`` of one
    ``finish_template`` (then ``apply_built`` is the way). Outcomes are resolved at ``tx``'s
    time, once."""
    if tx.auditing() is None or not builds:
        return None
    if not all(type(build) is TerminalBuild for build in builds):
        return None
    terminals: Sequence[TerminalBuild] = builds  # type: ignore[assignment]
    resolved = [terminal.resolve(tx.now) for terminal in terminals]
    found = _finish_group(terminals, resolved, tx.now)
    return None if found is None else _finish_call(terminals, resolved, *found)


def _finish_group(
    terminals: Sequence[TerminalBuild], resolved: Sequence[Resolved], now: float
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The group's per-row parameters and its ``finish_template``, or None when the group does
    not fit (``_finish_params``, ``finish_template``)."""
    found = _finish_params(terminals, resolved, now)
    if found is None:
        return None
    params, key_head = found
    first = resolved[0]
    template = finish_template(
        terminals[0].actor,
        key_head,
        first.to_state,
        first.reason_code,
        first.summary,
        params.pop("metadata_json"),
    )
    return None if template is None else (params, template)


def _finish_call(
    terminals: Sequence[TerminalBuild],
    resolved: Sequence[Resolved],
    params: dict[str, Any],
    template: dict[str, Any],
) -> FinishCall:
    count = len(terminals)
    new = [new_id() for _ in range(3 * count)]
    fact_ids, event_ids = new[:count], new[count : 2 * count]
    outbox_ids = new[2 * count :] if is_terminal(resolved[0].to_state) else [None] * count
    call = {
        **template,
        **params,
        "fact_ids": fact_ids,
        "event_ids": event_ids,
        "outbox_ids": outbox_ids,
    }
    return FinishCall(call, terminals, resolved, fact_ids, event_ids)


async def finish_results(tx: Tx, call: FinishCall, rows: list[Row]) -> list[TransitionResult]:
    """What ``finish_running`` answered for ``call``, one result per build in order: a row the
    compare-and-swap did not change gets ``_lost``'s answer; a taken transition key raises
    KeyAlreadyUsed."""
    written = {row["id"]: row["fact_written"] for row in rows}
    first = call.resolved[0]
    results: list[TransitionResult] = []
    for terminal, item, fact_id, event_id in zip(
        call.terminals, call.resolved, call.fact_ids, call.event_ids, strict=True
    ):
        fact_written = written.get(terminal.entity_id)
        if fact_written is None:
            request, _, _ = terminal.built(item)
            results.append(await _lost(tx, request, request_hash(request), fact_id))
            continue
        if not fact_written:
            raise KeyAlreadyUsed(terminal.key)
        results.append(_applied_move("running", first.to_state, fact_id, event_id))
    if first.to_state == "queued" and any(result.applied for result in results):
        tx.notify("queued")  # as apply_transitions: wake idle workers for what was queued
    return results


async def _apply_finishes(
    tx: Tx, terminals: Sequence[TerminalBuild], resolved: Sequence[Resolved]
) -> list[TransitionResult] | None:
    """``apply_transitions`` for a group of terminal builds from one ``finish_template``, each
    with its own compare-and-swap, fact, event and notification: one ``finish_running``
    statement where the store writes audit rows in its statements (PostgreSQL), else
    ``_finish_written``. None when the group does not fit (``_finish_group``): the caller then
    applies it item by item's request."""
    found = _finish_group(terminals, resolved, tx.now)
    if found is None:
        return None
    params, template = found
    auditing = tx.auditing()
    if auditing is None:
        return await _finish_written(tx, terminals, resolved, params, template)
    call = _finish_call(terminals, resolved, params, template)
    return await finish_results(auditing, call, await auditing.finish_running(call.params))


async def _finish_written(
    tx: Tx,
    terminals: Sequence[TerminalBuild],
    resolved: Sequence[Resolved],
    params: Mapping[str, Any],
    template: Mapping[str, Any],
) -> list[TransitionResult]:
    """``_apply_finishes`` on a store that takes written rows (SQLite): one set-based
    compare-and-swap, then the facts, events and notifications with ``write_many``, each row
    what ``_writes`` builds for the item's request (its text spliced from ``template`` and
    hashed here; a test compares the rows)."""
    now = tx.now
    first = resolved[0]
    to_state, reason_code, summary = first.to_state, first.reason_code, first.summary
    hash_0, hash_1, hash_2, hash_3 = (template[f"hash_{n}"] for n in range(4))
    stored = [dumps(terminal.evidence_refs) for terminal in terminals]
    updates: list[RunUpdate] = [
        (
            terminal.entity_id,
            "running",
            {
                "status": to_state,
                "updated_at": now,
                "status_reason_code": reason_code,
                "status_reason_summary": summary,
                "status_evidence_refs": refs,
                **item.patch,
            },
            terminal.guard,
        )
        for terminal, item, refs in zip(terminals, resolved, stored, strict=True)
    ]
    try:
        rows = await tx.run_update_many(updates, returning=_returned(()))
    except ConcurrencyKeyBusy as exc:
        raise LostToConcurrencyKey from exc
    changed = {row["id"] for row in rows}
    facts: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    notifications: list[dict[str, Any]] = []
    payload = _event_payload("running", to_state, reason_code, template["actor"])
    keys: dict[str, str] = {}
    results: list[TransitionResult] = []
    for terminal, item, refs, canonical, attempt in zip(
        terminals, resolved, stored, params["evidence"], params["attempts"], strict=True
    ):
        transition_id = new_id()
        digest = text_hash(
            f"{hash_0}{json_string(terminal.entity_id)}{hash_1}{attempt}{hash_2}{canonical}{hash_3}"
        )
        if terminal.entity_id not in changed:
            request, _, _ = terminal.built(item)
            results.append(await _lost(tx, request, digest, transition_id))
            continue
        event_id = new_id()
        fact, event, notification = _audit_rows(
            transition_id=transition_id,
            event_id=event_id,
            entity_type=template["entity_type"],
            entity_id=terminal.entity_id,
            from_state="running",
            to_state=to_state,
            reason_code=reason_code,
            reason_summary=summary,
            evidence_refs=refs,
            source=template["source"],
            actor=template["actor"],
            metadata=template["metadata"],
            idempotency_key=terminal.key,
            request_hash=digest,
            lease_id=_guarded_lease_id(terminal.guard),
            payload=payload,
        )
        facts.append(fact)
        events.append(event)
        if notification is not None:
            notifications.append(notification)
        keys[transition_id] = terminal.key
        results.append(_applied_move("running", to_state, transition_id, event_id))
    if keys:
        await _write_audit_rows(
            tx,
            {"fact_insert": facts, "event_insert": events, "outbox_enqueue": notifications},
            keys,
        )
    if to_state == "queued" and keys:
        tx.notify("queued")
    return results
