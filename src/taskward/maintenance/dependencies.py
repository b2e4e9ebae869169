"""Dependency readiness (DESIGN.md R21): ``waiting_dependency -> queued | skipped`` for every
waiting task the readiness rule moves now.

The end of a dependency settles its waiting dependents in its own transaction
(``transitions.apply.settle_dependents``); this pass is what guarantees R21's "within one
maintenance pass at most" whatever ended the dependency, e.g. a terminal write that committed
while a dependent's admission had not yet (PostgreSQL orders the two by the dependency's row lock,
so this should find nothing; it is the safety net, and a test holds it to its job). Its moves are
``transitions.readiness``'s, written in one transaction per batch under the dependents' lock, so
a pass racing a terminal write moves each task once.
"""

from __future__ import annotations

from dataclasses import dataclass

from taskward.maintenance.service import REAP_BATCH
from taskward.store.port import StateDB
from taskward.transitions import apply
from taskward.transitions.readiness import settle_moves


@dataclass(frozen=True)
class DependencyPromoter:
    """Settles at most ``limit`` waiting tasks a pass, oldest first."""

    limit: int = REAP_BATCH

    async def run_once(self, db: StateDB, *, now: float | None = None) -> dict[str, int]:
        """Move the waiting tasks whose dependencies all completed to ``queued``
        (``dependencies_met``) and those with one ended otherwise to ``skipped``
        (``dependency_failed``); a skip cascades to the skipped task's own dependents.

        Returns:
            ``{"dependencies_met": n, "dependency_failed": n}``, the moves this pass wrote for
            the tasks it found (a skip's cascade is written in the same transaction, uncounted).
        """
        counts = {"dependencies_met": 0, "dependency_failed": 0}
        found = await db.fetchall("dependencies_settleable", {"limit": self.limit})
        if not found:
            return counts
        async with db.transaction(now=now) as tx:
            moves = await settle_moves(tx, waiting_ids=[row["id"] for row in found])
            results = await apply(tx, moves) if moves else []
        for move, (result, _) in zip(moves, results, strict=True):
            if result.applied and not result.replayed:
                counts[move.reason_code] += 1
        return counts
