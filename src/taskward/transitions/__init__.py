"""Every status change of a run (ADR-0072 D3): the only writer of a status.

- ``requests``: what a transition is before it is written: named constructors, the static
  checks (R3 step 1, before any I/O), the request hash; ``recovery``: the named constructors
  of the maintenance services' edges (lease expired, retry ready, deadline exceeded, ...);
- ``rows``: the one builder of what it writes (``Move``: the compare-and-swap; its fact, event
  and outbox notification);
- ``apply``: the one apply step for one move or many (the only caller of the store's guarded
  updates), R3 steps 2-4;
- ``claim`` and ``finish``: the claim edge and the way out of ``running``, built for many rows
  from one template, and PostgreSQL's one-statement forms of both (measured to pay:
  docs/benchmarks.md "Do the PostgreSQL one-statement paths pay?");
- ``api``: ``transition_task`` and its forms.

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

from taskward.store.port import KeyAlreadyUsed
from taskward.transitions.api import (
    apply_transitions,
    transition_at,
    transition_task,
)
from taskward.transitions.apply import Applied, LostToConcurrencyKey, apply, replayed_result
from taskward.transitions.finish import apply_built
from taskward.transitions.requests import (
    Built,
    Prepared,
    TerminalBuild,
    cancelled,
    claimed,
    finished,
    lease_id,
    prepared,
    request_hash,
)
from taskward.transitions.rows import Move, move_of

__all__ = [
    "Applied",
    "Built",
    "KeyAlreadyUsed",
    "LostToConcurrencyKey",
    "Move",
    "Prepared",
    "TerminalBuild",
    "apply",
    "apply_built",
    "apply_transitions",
    "cancelled",
    "claimed",
    "finished",
    "lease_id",
    "move_of",
    "prepared",
    "request_hash",
    "replayed_result",
    "transition_at",
    "transition_task",
]
