"""Background maintenance (ADR-0072 D5, R5, R6): recovery of expired leases, due retries and
overdue deadlines. Status changes only through
``transition_task``; nothing moves because the clock moved: every move is a compare-and-swap a
racing terminal write wins or loses, never both, under a key deterministic per row and attempt,
so two reapers racing converge on one fact (the second sees a replay).

Each job is a service, a small frozen dataclass of its settings with
``async def run_once(self, db, *, now=None) -> dict[str, int]`` (one pass; the counts of the
moves it wrote). One owner per module; imports inside the package point one way:

The named requests, guards and patches of every maintenance edge are the one writer's
(``taskward.transitions.recovery``, imported here as ``edges``).

- ``service`` -> ``edges``: the ``run_once`` shape (``MaintenanceService``), ``REAP_BATCH``, and
  ``write_edge``, which applies one edge and counts it only if this call wrote it.
- ``leases`` -> ``service``, ``edges``: ``LeaseReaper``, ``running -> retry_wait | failed``.
- ``ceiling`` -> ``service``, ``edges``: ``skip_at_ceiling``, the end of an idle row at its own
  attempt ceiling (R18: a row carries its ceiling, so lowering the queue's strands nothing).
- ``retries`` -> ``ceiling``, ``service``, ``edges``: ``RetryPromoter``, ``retry_wait -> queued |
  cancelled``, then the skip of a row it queued at the ceiling (read after its promotions).
- ``deadlines`` -> ``service``, ``edges``: ``DeadlineReaper``, ``running -> timed_out``.
- ``composite`` -> the services: ``Maintenance``, which runs leases, then retries
  (``recover_once``) and then the deadlines and dependencies (``run_once``), and the
  function surface of before (``reap_expired_leases`` and the rest), one call into each.
- ``reaper``: re-exports that function surface where it has always been imported from.

- ``dependencies`` -> ``service``: ``DependencyPromoter``, R21's ``waiting_dependency -> queued |
  skipped`` for every waiting task the readiness rule moves (the safety net behind the settle
  a dependency's own terminal transaction does); its moves are ``transitions.readiness``'s.
"""

from taskward.maintenance.composite import (
    Maintenance,
    promote_due_retries,
    reap_deadlines,
    reap_expired_leases,
)
from taskward.maintenance.deadlines import DEFAULT_DEADLINE_GRACE_SECONDS, DeadlineReaper
from taskward.maintenance.dependencies import DependencyPromoter
from taskward.maintenance.leases import LeaseReaper
from taskward.maintenance.retries import RetryPromoter
from taskward.maintenance.service import REAP_BATCH, MaintenanceService
from taskward.transitions.recovery import REAPER, Edge

__all__ = [
    "DEFAULT_DEADLINE_GRACE_SECONDS",
    "REAPER",
    "REAP_BATCH",
    "DeadlineReaper",
    "DependencyPromoter",
    "Edge",
    "LeaseReaper",
    "Maintenance",
    "MaintenanceService",
    "RetryPromoter",
    "promote_due_retries",
    "reap_deadlines",
    "reap_expired_leases",
]
