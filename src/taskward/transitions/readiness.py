"""R21's readiness rule and the moves it takes: when a task with dependencies may run.

The rule (DESIGN.md R21), applied to the statuses of a task's dependencies:
  - one ended otherwise than ``completed`` (failed, timed_out, skipped, cancelled): the task is
    skipped (``dependency_failed``, the evidence naming that dependency, the first by id when
    several have), whether it is still ``queued`` at admission or ``waiting_dependency``;
  - every one ``completed``: the task is ``queued`` (at admission it stays queued; a waiting
    task moves ``waiting_dependency -> queued``, ``dependencies_met``, ``queued_at = now``, or its
    ``run_after`` when that is later, R16);
  - else it waits (at admission ``queued -> waiting_dependency``, ``dependencies_pending``).

``settle_moves`` reads what the rule needs inside the caller's transaction and builds the moves;
``transitions.apply`` writes them (``settle_dependents``), after a terminal write of a task that
has dependents, and the maintenance pass writes them for any waiting task the rule moves (the
safety net for a dependency that ended in a one-statement write whose settle did not commit).

Exactly once: the waiting rows are read locked (``FOR UPDATE`` on PostgreSQL, in the order of
their ids; SQLite's transactions are serial) and their dependencies' statuses are read after
that lock is held, in a later statement, so of two transactions that end a task's last two
dependencies at once the second waits for the first and then sees both ended: one of them
moves the task, and the other finds it no longer waiting. Each move's key is deterministic per
task (``dependencies:<id>:<outcome>``), so a replay writes nothing twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

from taskward.canonical import dumps
from taskward.lifecycle import TERMINAL, Status
from taskward.models import Actor, StateReason, TransitionRequest
from taskward.store.port import Tx
from taskward.transitions.requests import prepared
from taskward.transitions.rows import Move, move_of

DEPENDENCIES: Final = Actor(type="system", id="dependencies")
ENDED_OTHERWISE: Final = frozenset(s.value for s in TERMINAL) - {Status.COMPLETED.value}
# The evidence of a pending move names at most this many of the dependencies it waits for.
MAX_EVIDENCE_IDS: Final = 20


class Verdict(NamedTuple):
    """What R21 says of a task, given its dependencies' statuses: ``to_state`` is ``queued``,
    ``waiting_dependency`` or ``skipped``; ``failed`` the dependency (id, status) that skips it;
    ``pending`` the ids not yet ended, in id order."""

    to_state: str
    failed: tuple[str, str] | None
    pending: list[str]


def verdict(statuses: Mapping[str, str]) -> Verdict:
    """R21's rule over ``statuses`` (dependency id -> status): ``verdict_of_counts`` of the
    first dependency that ended otherwise and of those not completed (listed: the evidence of
    a pending move)."""
    failed = next(
        ((i, statuses[i]) for i in sorted(statuses) if statuses[i] in ENDED_OTHERWISE), None
    )
    pending = sorted(i for i, s in statuses.items() if s != Status.COMPLETED.value)
    found = verdict_of_counts(len(pending), failed)
    return found._replace(pending=pending) if found.failed is None else found


def _move(
    task_id: str,
    src: str,
    dst: str,
    code: str,
    summary: str,
    evidence: list[dict[str, Any]],
    outcome: str,
    patch: dict[str, Any],
    now: float,
    **metadata: object,
) -> Move:
    request = TransitionRequest(
        entity_id=task_id,
        from_state=src,
        to_state=dst,
        reason=StateReason(
            code=code, summary=summary, evidence_refs=evidence, metadata=dict(metadata)
        ),
        actor=DEPENDENCIES,
        idempotency_key=f"dependencies:{task_id}:{outcome}",
    )
    return move_of(*prepared(request, {}, patch), now)


def verdict_move(
    task_id: str,
    from_state: str,
    found: Verdict,
    total: int,
    *,
    run_after: float | None,
    now: float,
) -> Move | None:
    """The move ``found`` asks of a task in ``from_state`` (``queued`` at its admission,
    ``waiting_dependency`` after); None when it stays where it is."""
    if found.to_state == Status.SKIPPED.value:
        assert found.failed is not None
        dependency_id, status = found.failed
        return _move(
            task_id,
            from_state,
            Status.SKIPPED.value,
            "dependency_failed",
            f"dependency {dependency_id} ended {status}",
            [{"kind": "task", "id": dependency_id, "status": status}],
            "failed",
            {"ended_at": now},
            now,
            dependencies=total,
        )
    if found.to_state == from_state:
        return None
    if found.to_state == Status.WAITING_DEPENDENCY.value:
        return _move(
            task_id,
            from_state,
            Status.WAITING_DEPENDENCY.value,
            "dependencies_pending",
            f"waiting for {len(found.pending)} of {total} dependencies",
            [{"kind": "task", "id": i} for i in found.pending[:MAX_EVIDENCE_IDS]],
            "pending",
            {},
            now,
            dependencies=total,
            pending=len(found.pending),
        )
    return _move(
        task_id,
        from_state,
        Status.QUEUED.value,
        "dependencies_met",
        f"all {total} dependencies completed",
        [],
        "met",
        {"queued_at": max(now, run_after) if run_after is not None else now},
        now,
        dependencies=total,
    )


def verdict_of_counts(open_count: int, failed: tuple[str, str] | None) -> Verdict:
    """R21's rule from a ``dependency_verdicts`` row: how many dependencies have not completed,
    and the first that ended otherwise (its id and status), if any."""
    if failed is not None:
        return Verdict(Status.SKIPPED.value, failed, [])
    if open_count:
        return Verdict(Status.WAITING_DEPENDENCY.value, None, [])
    return Verdict(Status.QUEUED.value, None, [])


async def settle_moves(
    tx: Tx,
    *,
    dependency_ids: Sequence[str] = (),
    waiting_ids: Sequence[str] = (),
) -> list[Move]:
    """The moves R21 asks, at ``tx``'s time, of the waiting dependents of ``dependency_ids``
    (tasks that just ended) and of the ``waiting_ids`` (tasks the maintenance pass found),
    read under their lock (see the module's docstring)."""
    waiting: list[Any] = []
    if dependency_ids:
        waiting += await tx.fetchall("dependents_waiting", {"ids": dumps(list(dependency_ids))})
    if waiting_ids:
        waiting += await tx.fetchall("waiting_among", {"ids": dumps(list(waiting_ids))})
    if not waiting:
        return []
    rows = {row["id"]: row for row in waiting}
    counts = await tx.fetchall("dependency_verdicts", {"ids": dumps(list(rows))})
    moves: list[Move] = []
    for found in counts:
        failed = found["failed_id"]
        move = verdict_move(
            found["task_id"],
            Status.WAITING_DEPENDENCY.value,
            verdict_of_counts(
                int(found["open"]), (failed, found["failed_status"]) if failed else None
            ),
            int(found["total"]),
            run_after=rows[found["task_id"]]["run_after"],
            now=tx.now,
        )
        if move is not None:
            moves.append(move)
    moves.sort(key=lambda move: move.entity_id)  # the lock's order
    return moves


__all__ = [
    "DEPENDENCIES",
    "ENDED_OTHERWISE",
    "Verdict",
    "settle_moves",
    "verdict",
    "verdict_move",
    "verdict_of_counts",
]
