"""The one apply step: moves (``rows.Move``) written under compare-and-swap, each with its own
fact, event and notification, inside an open transaction (ADR-0072 D3, DESIGN.md R3 steps 2-4).

The only caller of the store's guarded updates (``Tx.run_update_if``, ``Tx.run_update_many``):
every status write of taskward goes through ``apply``, or through the PostgreSQL one-statement
forms in ``claim`` and ``finish`` that write the same rows (a test greps for other callers).

Invariant: a move's status, reason projection, patch, exactly one status_transitions fact and
exactly one task event (and a completion's stored result, R22) commit in one transaction with
the caller's other writes, or none of them do. The compare-and-swap runs first and the fact
insert is ``ON CONFLICT DO NOTHING`` on the unique (entity_id, idempotency_key) index: a used
key can never apply twice (the insert finds it and ``KeyAlreadyUsed`` rolls the transaction
back), and a lost compare-and-swap looks for a replay before it reports a missing row or a
conflict, exactly R3's order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from taskward.canonical import dumps
from taskward.errors import TaskNotFound, TransitionIdempotencyConflict
from taskward.ids import new_id
from taskward.lifecycle import is_terminal
from taskward.models import TransitionRequest, TransitionResult, constructed
from taskward.store.guarded import update_shape
from taskward.store.port import ConcurrencyKeyBusy, KeyAlreadyUsed, Row, StateDB, Tx
from taskward.transitions.readiness import settle_moves
from taskward.transitions.requests import lease_id
from taskward.transitions.rows import Move, audit_rows, result_row


class LostToConcurrencyKey(Exception):
    """The write would run a second row with a running serialization key (R7); leave the
    transaction or savepoint (rolling it back) and report a lost claim."""


Applied = tuple[TransitionResult, Row | None]
"""A move's result and the ``returning`` columns of its updated row (None: nothing written)."""


async def apply(
    tx: Tx, moves: Sequence[Move], *, returning: Sequence[str] = (), one_shape: bool = False
) -> list[Applied]:
    """Write ``moves`` in ``tx``, set-based; one result per move, in order.

    Each move keeps exactly its own semantics: its own compare-and-swap on its own row and guard
    values, and when it applies, its own fact, event and notification. What is shared is the
    statement: moves of one shape (same columns set and guarded) run as one multi-row UPDATE, a
    lone one as a one-row UPDATE, and every applied move's rows go in one ``write_many``. Moves
    of the same run apply in their given order (the k-th move of a run in the k-th round). A
    used transition key raises ``KeyAlreadyUsed`` and a serialization-key clash
    ``LostToConcurrencyKey``: the caller rolls back (and may retry move by move). A move to
    ``queued`` wakes idle workers once the transaction commits (the one wake-up of a status
    change). ``one_shape``: the caller built every move from one template
    (``claim.claim_moves``, ``finish.finish_moves``), so their compare-and-swaps share one
    shape and a round is one statement without grouping (the store still checks every item's
    shape before it builds the statement)."""
    results: list[Applied | None] = [None] * len(moves)
    rounds: list[list[int]] = []
    occurrences: dict[str, int] = {}
    for index, move in enumerate(moves):
        k = occurrences.get(move.update[0], 0)
        occurrences[move.update[0]] = k + 1
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(index)
    ending = any(is_terminal(move.to_state) for move in moves)
    wanted = _returned(returning, ending)
    queued = False
    with_dependents: list[str] = []
    for round_indexes in rounds:
        changed = await _compare_and_swap(tx, moves, round_indexes, wanted, one_shape)
        facts: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        notifications: list[dict[str, Any]] = []
        stored: list[dict[str, Any]] = []
        keys: dict[str, str] = {}  # fact id -> its transition key
        for index in round_indexes:
            move = moves[index]
            transition_id = new_id()
            updated = changed.get(index)
            if updated is None:
                results[index] = (await lost(tx, move, transition_id), None)
                continue
            event_id = new_id()
            row_lease = None
            if move.lease is None:
                row_lease = lease_id(updated["leased_by"], updated["lease_attempts"])
            fact, event, notification = audit_rows(move, transition_id, event_id, row_lease)
            facts.append(fact)
            events.append(event)
            if notification is not None:
                notifications.append(notification)
            if move.result is not None:
                # R22: a completion's return value, in the completing transaction, written
                # only because its compare-and-swap applied (a lost owner's never is).
                row = result_row(move, updated["lease_attempts"])
                if row is not None:
                    stored.append(row)
            keys[transition_id] = move.key
            results[index] = (
                applied_move(move.from_state, move.to_state, transition_id, event_id),
                updated,
            )
            queued = queued or move.to_state == "queued"
            if ending and updated.get("has_dependents") and is_terminal(move.to_state):
                with_dependents.append(move.update[0])
        if keys:
            rows_of = {
                "fact_insert": facts,
                "event_insert": events,
                "outbox_enqueue": notifications,
            }
            if stored:
                rows_of["result_insert"] = stored
            await write_audit_rows(tx, rows_of, keys)
    if queued:
        wake_queued(tx)
    if with_dependents:
        await settle_dependents(tx, with_dependents)
    return [result for result in results if result is not None]


async def settle_dependents(tx: Tx, ended: Sequence[str]) -> None:
    """R21, in the transaction that ended the tasks ``ended`` (each has dependents): move their
    waiting dependents as the readiness rule says (``readiness.settle_moves``), through ``apply``
    itself, so a dependent skipped here settles its own dependents in turn (the cascade of
    ``dependency_failed``)."""
    moves = await settle_moves(tx, dependency_ids=ended)
    if moves:
        await apply(tx, moves)


async def _compare_and_swap(
    tx: Tx, moves: Sequence[Move], indexes: list[int], returning: Sequence[str], one_shape: bool
) -> dict[int, Row]:
    """One round's compare-and-swaps, one statement per shape; the rows they changed, by the
    index of their move."""
    shapes: dict[object, list[int]] = {}
    if one_shape:
        shapes[None] = indexes
    else:
        for index in indexes:
            shapes.setdefault(update_shape(moves[index].update), []).append(index)
    changed: dict[int, Row] = {}
    try:
        for group in shapes.values():
            if len(group) == 1:
                row = await tx.run_update_if(*moves[group[0]].update, returning=returning)
                if row is not None:
                    changed[group[0]] = row
                continue
            rows = await tx.run_update_many([moves[i].update for i in group], returning=returning)
            by_id = {row["id"]: row for row in rows}
            for index in group:
                row = by_id.get(moves[index].update[0])
                if row is not None:
                    changed[index] = row
    except ConcurrencyKeyBusy as exc:
        raise LostToConcurrencyKey from exc
    return changed


def wake_queued(tx: Tx) -> None:
    """A status change to ``queued`` committed with ``tx``: wake idle workers once it commits
    (claimable work appeared). Every writer of such a change calls this, once per transaction
    it writes in."""
    tx.notify("queued")


def _returned(returning: Sequence[str], ending: bool) -> tuple[str, ...]:
    """``returning`` plus the lease columns the fact's lease id needs, and, when a move ends its
    task, ``has_dependents`` (R21: whether it has dependents to settle)."""
    if "*" in returning:
        return tuple(returning)
    extra = ("leased_by", "lease_attempts", "has_dependents") if ending else _LEASE_COLUMNS
    return (*returning, *(c for c in extra if c not in returning))


_LEASE_COLUMNS: Final = ("leased_by", "lease_attempts")


async def write_audit_rows(
    tx: Tx, rows_of: Mapping[str, Sequence[Mapping[str, Any]]], keys: Mapping[str, str]
) -> None:
    """The facts (``rows_of["fact_insert"]``), then the events and notifications, each with
    ``write_many``, in one round trip; ``keys`` maps each fact's id to its transition key. A
    fact whose key was taken inserts nothing and the count falls short: KeyAlreadyUsed, and the
    caller rolls back the whole transaction, the rows written beside it too."""
    names = ["fact_insert", *(name for name in rows_of if name != "fact_insert")]
    counts = await tx.write_many([(f"{name}_many", rows_of[name]) for name in names])
    if counts[0] < len(keys):
        present = await tx.fetchall("fact_ids_among", {"ids": dumps(list(keys))})
        for fact_id in keys.keys() - {fact["id"] for fact in present}:
            raise KeyAlreadyUsed(keys[fact_id])


async def lost(tx: Tx, move: Move, transition_id: str) -> TransitionResult:
    """The compare-and-swap matched nothing: a replay of a used key, a missing row (raises
    TaskNotFound) or a conflict that writes nothing (R3 steps 2-4)."""
    replay = await replayed(tx, move.update[0], move.key, move.digest)
    if replay is not None:
        return replay
    observed = await tx.fetchone("run_status", {"id": move.update[0]})
    if observed is None:
        raise TaskNotFound(move.update[0])
    return TransitionResult(
        applied=False,
        conflict=True,
        previous_state=move.update[1],
        current_state=observed["status"],
        transition_id=transition_id,
    )


async def replayed(
    reader: Tx | StateDB, entity_id: str, key: str, digest: str
) -> TransitionResult | None:
    """The original result of a used key; raises when the key was used with other content."""
    replay = await reader.fetchone(
        "fact_get_by_key", {"entity_id": entity_id, "idempotency_key": key}
    )
    if replay is None:
        return None
    if replay["request_hash"] != digest:
        raise TransitionIdempotencyConflict(entity_id, key, replay["id"])
    return TransitionResult(
        applied=True,
        previous_state=replay["previous_status"],
        current_state=replay["status"],
        transition_id=replay["id"],
        event_id=replay["event_id"],
        replayed=True,
    )


async def replayed_result(
    reader: Tx | StateDB, request: TransitionRequest, digest: str
) -> TransitionResult | None:
    """``replayed`` for ``request``'s key."""
    return await replayed(reader, request.entity_id, request.idempotency_key, digest)


_APPLIED_FIELDS: Final = ("applied", "previous_state", "current_state", "transition_id", "event_id")


def applied_move(
    from_state: str, to_state: str, transition_id: str, event_id: str
) -> TransitionResult:
    """The result of an applied move. Every value is already of its field's type (a validated
    request's, or a template's built from one): no validation."""
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
