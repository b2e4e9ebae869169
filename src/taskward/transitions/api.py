"""``transition_task`` and its forms: one transition in a transaction of its own, or several in
the caller's (ADR-0072 D3, DESIGN.md R3)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from taskward.groupcommit import GroupCommit
from taskward.ids import new_id
from taskward.models import TransitionRequest, TransitionResult
from taskward.store.port import KeyAlreadyUsed, StateDB, Tx
from taskward.transitions.apply import Applied, LostToConcurrencyKey, apply, replayed_result
from taskward.transitions.finish import apply_built
from taskward.transitions.requests import (
    Built,
    Prepared,
    check_static,
    request_hash,
    result_of,
)
from taskward.transitions.rows import move_of


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
    check_static(request, guard, patch)
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
            check_static(request, guard, patch)
            digest = request_hash(request)
            move = move_of(request, guard, patch, digest, tx.now)
            move.result = result_of(build, request.to_state)  # R22: a completion's result
            [(result, _)] = await apply(tx, [move])
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


async def apply_transitions(
    tx: Tx, items: Sequence[Prepared], *, returning: Sequence[str] = ()
) -> list[Applied]:
    """Checked requests (``requests.prepared``) applied in the open ``tx``, set-based
    (``apply.apply``); one result and updated row per item, in order."""
    moves = [
        move_of(request, guard, patch, digest, tx.now) for request, guard, patch, digest in items
    ]
    return await apply(tx, moves, returning=returning)
