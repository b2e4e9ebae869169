"""What every maintenance service shares: the ``run_once`` shape, the batch a pass moves at
most, and how one edge is written and counted. Status changes only through ``transition_task``.
"""

from __future__ import annotations

from typing import Final, Protocol

from taskward.store.port import StateDB
from taskward.transitions import transition_task
from taskward.transitions.recovery import Edge

REAP_BATCH: Final = 500


class MaintenanceService(Protocol):
    """One pass of one maintenance job (STYLE.md section 7): tests call it with ``now``, the
    runtime's loop calls it on an interval."""

    async def run_once(self, db: StateDB, *, now: float | None = None) -> dict[str, int]:
        """Move every row this service owns that is due at ``now`` (the store's time when
        None). Returns counts per outcome, of the moves this call wrote."""
        ...


async def write_edge(db: StateDB, edge: Edge, *, now: float) -> bool:
    """Apply ``edge`` under its compare-and-swap; True if this call wrote the fact.

    A lost race (a terminal write, another reaper) and a replay of a key another reaper already
    wrote both count for nothing: racing reapers converge on one fact, counted once.
    """
    result = await transition_task(db, edge.request, guard=edge.guard, patch=edge.patch, now=now)
    return result.applied and not result.replayed
