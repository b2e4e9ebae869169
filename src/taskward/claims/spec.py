"""What a worker serves and what a claim grants it (ADR-0071 D4/D5, R5, R25): ``WorkerSpec``,
the ``Lease`` and ``Claimed`` a pass hands back, and the lease arithmetic of a claim and of a
renewal (``lease_expiry``, ``_claim_parts``). Pure: no I/O; the moves it builds are written by
``taskward.transitions``.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, Final

from taskward.capabilities import (
    CAPABILITY_CLASSES,
    capability_class,
    worker_can_serve,
)
from taskward.models import Actor
from taskward.registry import MAX_TASK_TIMEOUT_CEILING_S
from taskward.store.port import Row
from taskward.transitions import (
    Move,
    claimed,
    lease_id,
    move_of,
    prepared,
)
from taskward.transitions.claim import (
    ClaimItem,
    claim_moves,
    claim_template,
)

DEFAULT_LEASE_TTL_SECONDS: Final = 300.0
DEFAULT_HEARTBEAT_TTL_SECONDS: Final = 90.0
# R5: a claim sets deadline_at = now + timeout_s (args.timeout_s, else this default) and
# lease_expires_at = max(now + lease_ttl, deadline_at + lease_slack_s), so the lease always
# covers the deadline. 240 s + 30 s slack fits the default 300 s lease.
DEFAULT_TASK_TIMEOUT_SECONDS: Final = 240.0
# The longest deadline a claim ever grants, whatever a row's args say: admission bounds
# ``timeout_s`` (a deployment's maximum, 7 days by default, never above this), and a row stored
# before that bound existed is clamped here, so no claim commits a deadline or lease the host
# cannot turn into a ``Task`` (a datetime) and the reaper cannot act on. run_claim_batch
# (PostgreSQL's one-statement pass) clamps with the same value (:max_timeout_s).
MAX_TASK_TIMEOUT_SECONDS: Final = MAX_TASK_TIMEOUT_CEILING_S
DEFAULT_LEASE_SLACK_SECONDS: Final = 30.0
# R25: a renewing worker renews RENEWALS_PER_LEASE times a lease_ttl, so a renewal may be lost
# or late and the next still lands before the lease lapses; below this ttl renewals would be due
# more often than once a second, each a store round trip and a scheduling hiccup away from a
# lapse. ``WorkerSpec`` refuses a shorter ttl for a renewing worker.
RENEWALS_PER_LEASE: Final = 3
MIN_RENEWABLE_LEASE_TTL_SECONDS: Final = 3.0
# Tokens that order and never filter (affinity): the page's SQL filter must skip them too.
_SOFT_TOKENS: Final = json.dumps(
    sorted(t for t, c in CAPABILITY_CLASSES.items() if c == "affinity")
)


def new_worker_id() -> str:
    """A worker id shaped ``host:<8 hex>`` (ADR-0071 D4)."""
    return f"host:{secrets.token_hex(4)}"


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker serves and how it leases."""

    worker_id: str
    kinds: Sequence[str]
    execution_targets: Sequence[str] = ("host",)
    capabilities: Sequence[str] = ()
    lease_ttl: float = DEFAULT_LEASE_TTL_SECONDS
    heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL_SECONDS
    default_timeout_s: float = DEFAULT_TASK_TIMEOUT_SECONDS
    lease_slack_s: float = DEFAULT_LEASE_SLACK_SECONDS
    hostname: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    # R25 (ADR-0037 protocol version two): this worker renews the leases it holds, so a claim
    # grants ``lease_ttl`` alone instead of covering the deadline (``lease_expiry``).
    renews: bool = False

    def __post_init__(self) -> None:
        if self.renews and not self.lease_ttl >= MIN_RENEWABLE_LEASE_TTL_SECONDS:
            raise ValueError(
                f"lease_ttl {self.lease_ttl!r} is too short to renew: a renewing worker needs "
                f"at least {MIN_RENEWABLE_LEASE_TTL_SECONDS:g} s (it renews every lease_ttl / 3)"
            )

    @property
    def renew_every_s(self) -> float | None:
        """How often a host renews this worker's leases (R25); None when it does not renew."""
        return self.lease_ttl / RENEWALS_PER_LEASE if self.renews else None

    @cached_property
    def actor(self) -> Actor:
        """The worker as the actor of its claims (a frozen model: built once)."""
        return Actor(type="system", id=self.worker_id)

    @cached_property
    def page_filter(self) -> dict[str, Any]:
        """What ``run_claim_page`` filters by, as its JSON parameters: encoded once per worker,
        not once per page (a claim pass reads one or more pages)."""
        return {
            "kinds": json.dumps(sorted(set(self.kinds))),
            "targets": json.dumps(sorted(set(self.execution_targets))),
            "capabilities": json.dumps(sorted(set(self.capabilities))),
            "soft": _SOFT_TOKENS,
        }

    @cached_property
    def claim_template(self) -> dict[str, Any] | None:
        """This worker's claim transition as a template (``transitions.claim``; None: a request
        per row): built once."""
        return claim_template(partial(claimed, self.actor, self.worker_id))

    def claim_moves(self, items: Sequence[ClaimItem], now: float) -> list[Move]:
        """The moves of this worker's claims ``(entity_id, attempt, guard, patch)`` at ``now``:
        from its template, or a request per row where it has none."""
        template = self.claim_template
        if template is not None:
            return claim_moves(template, items, now)
        return [
            move_of(
                *prepared(claimed(self.actor, self.worker_id, entity_id, attempt), guard, patch),
                now,
            )
            for entity_id, attempt, guard, patch in items
        ]

    @cached_property
    def ranked(self) -> bool:
        """Whether affinity can reorder this worker's candidates (it advertises an affinity
        token); without one every score is 0 and the order is the SQL's oldest-first."""
        return any(capability_class(token) == "affinity" for token in self.capabilities)

    def serves(self, row: Row) -> bool:
        """Target and capability filter, applied before any claim (ADR-0071 D5)."""
        target = row.get("execution_target")
        if target and target not in self.execution_targets:
            return False
        return worker_can_serve(row.get("required_capabilities"), self.capabilities)


@dataclass(frozen=True)
class Lease:
    """A claimed run as its owner sees it: the lease its terminal write guards (``guard``), and
    the expiry as the owner last knew it (its claim's, or its last renewal's, R25)."""

    task_id: str
    leased_by: str
    attempt: int
    lease_expires_at: float
    deadline_at: float
    claimed_at: float
    action_kind: str
    concurrency_key: str | None = None

    @property
    def lease_id(self) -> str:
        value = lease_id(self.leased_by, self.attempt)
        assert value is not None
        return value

    def guard(self) -> dict[str, Any]:
        """Terminal writes guard the exact lease: its owner and attempt, the lease id (R4).

        Decision (R25): the guard holds the lease id, not the stored expiry. ADR-0071 D4 also
        guarded the expiry when a lease never changed once granted, so the expiry named a lease
        as surely as its id; a renewal moves ``lease_expires_at`` under a running owner, and a
        guard on it would refuse the owner's own completion after a renewal it had not heard
        of (a lost reply; a renewal and a finish in flight at once). R4 still holds, as
        everything that takes a lease away changes the guarded row: the reaper moves the row
        out of ``running`` and clears ``leased_by``, a deadline reaper or a cancellation moves
        it out of ``running``, a reclaim writes the next attempt (``lease_attempts`` only
        grows), and every terminal write compares the status (``running``) too. The reaper
        still guards the expiry it saw (``transitions.recovery``), so a renewal that lands
        first wins over it.
        """
        return {"leased_by": self.leased_by, "lease_attempts": self.attempt}


@dataclass(frozen=True)
class Claimed:
    """A lease and the full row as the claim left it (RETURNING *)."""

    lease: Lease
    row: Row


def lease_expiry(spec: WorkerSpec, deadline_at: float, *, now: float) -> float:
    """The expiry a claim at ``now`` grants for ``deadline_at``.

    R5 (protocol version one): ``max(now + lease_ttl, deadline_at + lease_slack_s)``, a lease
    that covers the deadline. R25 (a renewing worker): ``min(now + lease_ttl, deadline_at +
    lease_slack_s)``, the claim being the lease's first renewal (``run_renew_lease``: never past
    the deadline + slack). run_claim_batch (PostgreSQL's one-statement pass) computes the same
    in SQL (``:renews``)."""
    if spec.renews:
        return min(now + spec.lease_ttl, deadline_at + spec.lease_slack_s)
    return max(now + spec.lease_ttl, deadline_at + spec.lease_slack_s)


def _claim_parts(
    spec: WorkerSpec, row: Row, *, now: float
) -> tuple[dict[str, Any], dict[str, Any], Lease]:
    """The guarded ``queued -> running`` claim of ``row`` at ``now``: its guard, its patch and
    the lease it would grant (R5, R25)."""
    # R5. run_claim_batch (PostgreSQL's one-statement pass) computes the same in SQL.
    timeout_s = row.get("timeout_s")
    timeout = min(
        float(timeout_s) if timeout_s else spec.default_timeout_s, MAX_TASK_TIMEOUT_SECONDS
    )
    deadline_at = now + timeout
    expires_at = lease_expiry(spec, deadline_at, now=now)
    attempt = int(row["lease_attempts"]) + 1
    guard = {
        "leased_by": None,
        "lease_attempts": row["lease_attempts"],
        "cancel_requested_at": None,
    }
    patch = {
        "leased_by": spec.worker_id,
        "lease_expires_at": expires_at,
        "lease_attempts": attempt,
        "deadline_at": deadline_at,
        "retry_at": None,
    }
    lease = Lease(
        task_id=row["id"],
        leased_by=spec.worker_id,
        attempt=attempt,
        lease_expires_at=expires_at,
        deadline_at=deadline_at,
        claimed_at=now,
        action_kind=row["action_kind"],
        concurrency_key=row.get("concurrency_key"),
    )
    return guard, patch, lease
