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
from typing import Any, Final, NamedTuple

from taskward.canonical import content_hash, dumps, json_string, plain_canonical_json, text_hash
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


class KeyAlreadyUsed(Exception):
    """Internal: the transition's idempotency key already has a fact. The caller lets the
    transaction roll back and answers with ``replayed_result``."""


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
    actor = request.actor.label()
    fact = {
        "id": transition_id,
        "entity_type": request.entity_type,
        "entity_id": request.entity_id,
        "previous_status": request.from_state,
        "status": request.to_state,
        "reason_code": request.reason.code,
        "reason_summary": request.reason.summary,
        "evidence_refs": dumps(request.reason.evidence_refs),
        "source": request.actor.type,
        "actor": actor,
        "metadata": dumps(request.reason.metadata),
        "idempotency_key": request.idempotency_key,
        "request_hash": digest,
        "event_id": event_id,
        "lease_id": _guarded_lease_id(guard)
        or lease_id(updated["leased_by"], updated["lease_attempts"]),
    }
    event = {
        "id": event_id,
        "task_id": request.entity_id,
        "kind": "transition",
        "transition_id": transition_id,
        "status": request.to_state,
        # dumps({"from": ..., "to": ..., "reason_code": ..., "actor": ...}), spliced.
        "payload": f'{{"from":{json_string(request.from_state)},'
        f'"to":{json_string(request.to_state)},'
        f'"reason_code":{json_string(request.reason.code)},"actor":{json_string(actor)}}}',
    }
    statements: list[tuple[str, dict[str, Any]]] = [("fact_insert", fact), ("event_insert", event)]
    # -- outbox (ADR-0072 D6, R12) ----------------------------------------------------------
    # A terminal transition enqueues exactly one notification in this same transaction, keyed
    # by the transition id (ON CONFLICT DO NOTHING). Delivery (taskward.outbox) only ever
    # changes dispatch_outbox, never this task. NULL max_attempts/ttl_s take the defaults.
    if is_terminal(request.to_state):
        outbox_row = {
            "id": new_id(),
            "kind": "task_terminal",
            "dedup_key": f"task-terminal:{transition_id}",
            "schedule_run_id": request.entity_id,
            "transition_id": transition_id,
            "body": dumps(
                {
                    "status": request.to_state,
                    "reason": {"code": request.reason.code, "summary": request.reason.summary},
                    "evidence_refs": request.reason.evidence_refs,
                }
            ),
            "max_attempts": None,
            "ttl_s": None,
        }
        statements.append(("outbox_enqueue", outbox_row))
    # -- end outbox -----------------------------------------------------------------------
    return statements, event_id


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
    # Every value is already of its field's type (the request was validated): no validation.
    return constructed(
        TransitionResult,
        {
            "applied": True,
            "conflict": False,
            "previous_state": request.from_state,
            "current_state": request.to_state,
            "transition_id": transition_id,
            "event_id": event_id,
            "replayed": False,
        },
        _APPLIED_FIELDS,
    )


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
                # Facts first, then events and notifications, in one round trip. A fact whose
                # key was taken inserts nothing and the count falls short: KeyAlreadyUsed, and
                # the caller rolls back the whole transaction, the rows written beside it too.
                names = ["fact_insert", *(name for name in rows_of if name != "fact_insert")]
                counts = await tx.write_many([(f"{name}_many", rows_of[name]) for name in names])
                if counts[0] < len(keys):
                    present = await tx.fetchall("fact_ids_among", {"ids": dumps(list(keys))})
                    for fact_id in keys.keys() - {fact["id"] for fact in present}:
                        raise KeyAlreadyUsed(keys[fact_id])
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


class ClaimedRows(NamedTuple):
    """``apply_claims``' answer: the rows it claimed (each as ``RETURNING *`` left it), in claim
    order, and what the page said: its size, whether a locked row with a serialization key
    stopped the pass, whether the worker's heartbeat was stale (then nothing was claimed)."""

    rows: list[Row]
    page_rows: int
    keyed: bool
    stale: bool


async def apply_claims(
    tx: AuditingTx, template: Mapping[str, Any], params: Mapping[str, Any], *, limit: int
) -> ClaimedRows:
    """Up to ``limit`` ``queued -> running`` transitions of one claim pass in one statement
    (``AuditingTx.claim_queued``): the page and lease parameters are the caller's (claims),
    the transition's are ``template``'s (``claim_template``). Each row keeps its own
    compare-and-swap, fact and event, as ``apply_transitions`` would write them; a taken
    transition key raises KeyAlreadyUsed (the caller rolls back)."""
    ids = [new_id() for _ in range(2 * limit)]
    found = await tx.claim_queued(
        {**params, **template, "limit": limit, "fact_ids": ids[:limit], "event_ids": ids[limit:]}
    )
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
    ``KeyAlreadyUsed``: the caller's transaction is then rolled back whole."""
    prepared: list[Prepared] = []
    for build in builds:
        request, guard, patch = build(tx.now)
        _check_static(request, guard, patch)
        prepared.append((request, guard, patch, request_hash(request)))
    return [result for result, _ in await apply_transitions(tx, prepared)]
