"""Lease claims (ADR-0071 D4/D5, R5-R7): the one guarded ``queued -> running`` path.

Used by the ADR-0071 worker functions and by ``LocalTaskSource.claim()`` alike, so the host and
the tick loop lease exactly the same way.

A pass pages candidates 50 at a time on a ``(queued_at, id)`` keyset, scans at most 5,000 rows
and claims at most ``limit`` (<= 20) of them. Filtering by execution target and capabilities
happens before the claim; affinity orders the candidates of the pages scanned (stable, so ties
keep oldest-first order). The page itself hands the pass its rows locked: on PostgreSQL it
locks the rows this worker serves with ``FOR UPDATE SKIP LOCKED`` in the same statement
(migration 0006), so rows another claimer holds are skipped without a second round trip; on
SQLite the pass's ``BEGIN IMMEDIATE`` already holds the one write lock. Serialization keys
block against running rows and within the pass; the store's unique index on running keys makes
the block authoritative across machines (R7).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, Final, NamedTuple

from taskward.capabilities import (
    CAPABILITY_CLASSES,
    affinity_score,
    capability_class,
    worker_can_serve,
)
from taskward.groupcommit import GroupCommit
from taskward.models import Actor
from taskward.registry import MAX_TASK_TIMEOUT_CEILING_S
from taskward.settings import DEFAULT_MAX_ATTEMPTS
from taskward.store.port import Row, StateDB, Tx
from taskward.transitions import (
    LostToConcurrencyKey,
    Move,
    apply,
    claimed,
    lease_id,
    move_of,
    prepared,
)
from taskward.transitions.claim import (
    ClaimedRows,
    ClaimItem,
    claim_first_page,
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
CLAIM_PAGE_SIZE: Final = 50
CLAIM_SCAN_CAP: Final = 5000
CLAIM_CAP: Final = 20
# A pass whose candidates concurrent claimers took first scans on past them this many times
# (each scan starts after the last row of the previous one) before it reports what it got.
CONTENDED_RESCANS: Final = 3
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
    """A claimed run as its owner sees it: the values its terminal write must guard."""

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
        """Terminal writes guard the exact owner, stored expiry and attempt (ADR-0071 D4)."""
        return {
            "leased_by": self.leased_by,
            "lease_expires_at": self.lease_expires_at,
            "lease_attempts": self.attempt,
        }


Cursor = tuple[float | None, str | None]


async def find_candidates(
    db: StateDB | Tx, spec: WorkerSpec, *, limit: int, max_attempts: int
) -> list[Row]:
    """Eligible queued rows in claim order (affinity first, then oldest)."""
    candidates, _ = await _find(db, spec, limit=limit, max_attempts=max_attempts)
    return candidates


async def _find(
    db: StateDB | Tx,
    spec: WorkerSpec,
    *,
    limit: int,
    max_attempts: int,
    after: Cursor = (None, None),
    first_page: list[Row] | None = None,
) -> tuple[list[Row], Cursor | None]:
    """``find_candidates`` from ``after`` on; also returns where the next scan would start
    (None when the queue was read to its end). ``first_page``: the first page, already read
    (``_page_params`` with ``_first_page_size``)."""
    candidates: list[Row] = []
    scanned = 0
    cursor = after
    more = True
    page_size = _first_page_size(spec, limit)
    while scanned < CLAIM_SCAN_CAP and len(candidates) < limit:
        page_size = min(page_size, CLAIM_SCAN_CAP - scanned)
        if first_page is not None:
            page, first_page = first_page, None
        else:
            params = _page_params(spec, max_attempts, cursor, page_size, limit - len(candidates))
            page = await db.fetchall("run_claim_page", params)
        scanned += len(page)
        # Only the rows the page locked for this pass: the others are held by another claimer,
        # or the worker cannot serve them (serves() is the SQL filter's Python twin, kept as a
        # check), or they lie beyond the rows it asked to lock.
        candidates.extend(row for row in page if row["locked"] and spec.serves(row))
        if page:
            cursor = (page[-1]["queued_at"], page[-1]["id"])
        if len(page) < page_size:
            more = False
            break
        page_size = CLAIM_PAGE_SIZE
    # Stable sort: descending affinity, the SQL's oldest-first order kept for ties.
    candidates.sort(
        key=lambda r: -affinity_score(r.get("required_capabilities"), spec.capabilities)
    )
    return candidates, cursor if more else None


def _first_page_size(spec: WorkerSpec, limit: int) -> int:
    """Without an affinity token every score is 0 and the order is the SQL's oldest-first, so
    the first page need only hold the rows wanted plus a margin for rows a concurrent claimer
    holds (the other lane of this worker, or another worker): a pass for one free slot reads ten
    rows, not fifty. Later pages (after rows were filtered out by target or capability, or were
    held) are full size."""
    return CLAIM_PAGE_SIZE if spec.ranked else min(CLAIM_PAGE_SIZE, 2 * limit + 8)


def _page_params(
    spec: WorkerSpec, max_attempts: int | None, cursor: Cursor, page_size: int, wanted: int
) -> dict[str, Any]:
    """``run_claim_page``'s parameters; ``max_attempts`` None reads the stored ceiling.

    The page locks at most ``wanted`` rows, the oldest this worker serves; a worker that ranks
    by affinity locks every row of the page it serves, as it may claim any of them."""
    return {
        "max_attempts": max_attempts,
        "default_max_attempts": DEFAULT_MAX_ATTEMPTS,
        **spec.page_filter,
        "cursor_queued_at": cursor[0],
        "cursor_id": cursor[1],
        "page_size": page_size,
        "lock": page_size if spec.ranked else wanted,
    }


def _claim_parts(
    spec: WorkerSpec, row: Row, *, now: float
) -> tuple[dict[str, Any], dict[str, Any], Lease]:
    """The guarded ``queued -> running`` claim of ``row`` at ``now``: its guard, its patch and
    the lease it would grant (R5)."""
    # R5. run_claim_batch (PostgreSQL's one-statement pass) computes the same in SQL.
    timeout_s = row.get("timeout_s")
    timeout = min(
        float(timeout_s) if timeout_s else spec.default_timeout_s, MAX_TASK_TIMEOUT_SECONDS
    )
    deadline_at = now + timeout
    expires_at = max(now + spec.lease_ttl, deadline_at + spec.lease_slack_s)
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


@dataclass(frozen=True)
class Claimed:
    """A lease and the full row as the claim left it (RETURNING *)."""

    lease: Lease
    row: Row


async def _claim_in(
    tx: Tx, spec: WorkerSpec, candidates: Sequence[Row], blocked: set[str], *, limit: int
) -> list[Claimed]:
    """Claim up to ``limit`` of ``candidates`` inside the pass's transaction.

    Each row still gets its own compare-and-swap, fact and event (ADR-0072 D3); they commit
    together. The candidates are already this transaction's (the page locked them), so
    concurrent claimers skipped them instead of queueing behind them. A row whose
    serialization key turns out to be running elsewhere is rolled back alone (a savepoint) and
    stays blocked for the rest of the pass (ADR-0071 D5, R7).
    """
    now = tx.now
    claimed_at: list[tuple[int, Claimed]] = []
    plain: list[tuple[int, Lease, ClaimItem]] = []  # rows without a serialization key
    for position, row in enumerate(candidates):
        if len(claimed_at) + len(plain) >= limit:
            break
        key = row.get("concurrency_key")
        if key is not None and key in blocked:
            continue
        guard, patch, lease = _claim_parts(spec, row, now=now)
        item: ClaimItem = (lease.task_id, lease.attempt, guard, patch)
        if key is None:
            plain.append((position, lease, item))
            continue
        blocked.add(key)  # stays blocked for the rest of the pass
        try:
            async with tx.savepoint():
                [(result, updated)] = await apply(
                    tx, spec.claim_moves([item], now), returning=("*",)
                )
        except LostToConcurrencyKey:
            continue
        if result.applied and not result.replayed and updated is not None:
            claimed_at.append((position, Claimed(lease=lease, row=updated)))
    if plain:
        # One set-based compare-and-swap for all of them, each on its own guard, then every
        # fact and event in one round (transitions.apply).
        moves = spec.claim_moves([item for *_, item in plain], now)
        applied = await apply(tx, moves, returning=("*",))
        for (position, lease, _), (result, updated) in zip(plain, applied, strict=True):
            if result.applied and not result.replayed and updated is not None:
                claimed_at.append((position, Claimed(lease=lease, row=updated)))
    claimed_at.sort(key=lambda pair: pair[0])  # claim order: affinity, then oldest
    return [claim for _, claim in claimed_at]


async def claim_rows(
    db: StateDB,
    spec: WorkerSpec,
    *,
    limit: int = CLAIM_CAP,
    now: float | None = None,
    group: GroupCommit | None = None,
) -> list[Claimed]:
    """Claim up to ``min(limit, 20)`` runs this worker can serve; never blocks.

    One transaction: its time is the pass's (R9: the store's clock, once); one round trip reads
    this worker's heartbeat and the attempt ceiling (R6); then candidates are paged and claimed.
    A lost claim or a concurrent cancel is skipped and not retried in this pass.

    With ``group`` the whole pass — reads and writes — runs as one unit of a shared group
    commit, so a worker's claims and its acknowledgements share commits (on SQLite, fsyncs);
    the pass's time is then the shared transaction's. Any error sends the pass down the
    ordinary path, unchanged.
    """
    limit = min(limit, CLAIM_CAP)
    if limit <= 0:
        return []
    if group is not None and now is None:
        return await group.run(
            lambda tx: claim_pass(tx, spec, limit),
            fallback=lambda: claim_rows(db, spec, limit=limit),
        )
    async with db.transaction(now=now) as tx:
        return await claim_pass(tx, spec, limit)


def _contended(got: Sequence[Claimed], candidates: Sequence[Row], wanted: int) -> bool:
    """Fewer claims than the candidates allowed: concurrent claimers took rows of this scan
    first (or they changed under it). More queued rows may lie beyond it."""
    return len(got) < min(wanted, len(candidates))


async def claim_pass(tx: Tx, spec: WorkerSpec, limit: int) -> list[Claimed]:
    """One claim pass of at most ``limit`` (<= 20) inside an open transaction: its own, a group
    commit's, or the one that completes the tasks whose slots it fills (LocalTaskSource).

    A worker without affinity ranking first has its first page claimed in one statement where
    the store runs one (``transitions.claim.claim_first_page``); the paged pass below takes over
    for what that leaves (rows behind a serialization key, rows past a page that concurrent
    claimers held), and for everything where it does not.
    """
    limit = min(limit, CLAIM_CAP)
    if limit <= 0:
        return []
    call = pass_call(spec, limit, tx.now)
    batch = None
    if call is not None:
        batch = await claim_first_page(tx, call.template, call.params, limit=call.limit)
    if call is None or batch is None:
        return await _claim_paged(tx, spec, limit)
    claimed_now, more = pass_claimed(spec, tx.now, call, batch)
    if len(claimed_now) < limit and more:
        claimed_now += await _claim_paged(tx, spec, limit - len(claimed_now))
    return claimed_now


class PassCall(NamedTuple):
    """A claim pass's first page as one statement, prepared but not sent (``pass_call``)."""

    template: dict[str, Any]
    params: dict[str, Any]
    limit: int
    page_size: int


def pass_call(spec: WorkerSpec, limit: int, now: float) -> PassCall | None:
    """The page and lease parameters of ``claim_pass``'s one statement for at most ``limit``
    (<= 20) at ``now``, for ``transitions.claim.claim_first_page`` or a caller that sends it
    with other statements (``transitions.finish.together``) and reads it with
    ``pass_claimed``; None for a worker with affinity ranking (it always pages)."""
    limit = min(limit, CLAIM_CAP)
    template = None if spec.ranked else spec.claim_template
    if limit <= 0 or template is None:
        return None
    page_size = _first_page_size(spec, limit)
    params = {
        "worker_id": spec.worker_id,
        "heartbeat_ttl": spec.heartbeat_ttl,
        "now": now,
        **spec.page_filter,
        "default_max_attempts": DEFAULT_MAX_ATTEMPTS,
        "page_size": page_size,
        "lock": limit,
        # R5, as _claim_parts computes it in Python.
        "default_timeout_s": spec.default_timeout_s,
        "max_timeout_s": MAX_TASK_TIMEOUT_SECONDS,
        "lease_ttl": spec.lease_ttl,
        "lease_slack_s": spec.lease_slack_s,
    }
    return PassCall(template, params, limit, page_size)


def pass_calls(spec: WorkerSpec, wanted: int, now: float) -> list[PassCall]:
    """The one statements of claim passes of at most 20 (``CLAIM_CAP``) for ``wanted`` freed
    slots (31: passes of 20 and 11); none for a worker with affinity ranking."""
    calls = [
        pass_call(spec, min(CLAIM_CAP, wanted - start), now)
        for start in range(0, wanted, CLAIM_CAP)
    ]
    passes = [call for call in calls if call is not None]
    return passes if len(passes) == len(calls) else []


def pass_claimed(
    spec: WorkerSpec, now: float, call: PassCall, batch: ClaimedRows
) -> tuple[list[Claimed], bool]:
    """The leases of what the one statement claimed for ``call``, and whether the paged pass may
    find more: a locked row with a serialization key stopped it (R7: those are claimed one by
    one), or the page was full (rows beyond it, or rows in it another claimer held)."""
    if batch.stale:
        return [], False  # a known worker with a stale heartbeat claims nothing (ADR-0071 D4)
    got = [
        Claimed(
            lease=Lease(
                task_id=row["id"],
                leased_by=spec.worker_id,
                attempt=row["lease_attempts"],
                lease_expires_at=row["lease_expires_at"],
                deadline_at=row["deadline_at"],
                claimed_at=now,
                action_kind=row["action_kind"],
                concurrency_key=row["concurrency_key"],
            ),
            row=row,
        )
        for row in batch.rows
    ]
    return got, batch.keyed or batch.page_rows >= call.page_size


async def _claim_paged(tx: Tx, spec: WorkerSpec, limit: int) -> list[Claimed]:
    """The paged pass: candidates page by page (affinity-ranked, serialization keys one by
    one), then their claims set-based (``_claim_in``)."""
    # The context and the first page in one round trip: the page reads the stored ceiling
    # itself, the same value the context reports (R6).
    [context], first_page = await tx.fetchall_batch(
        [
            ("claim_context", {"worker_id": spec.worker_id, "now": tx.now}),
            (
                "run_claim_page",
                _page_params(spec, None, (None, None), _first_page_size(spec, limit), limit),
            ),
        ]
    )
    last = context["last_heartbeat_at"]
    if last is not None and tx.now - float(last) > spec.heartbeat_ttl:
        return []  # a known worker with a stale heartbeat claims nothing (ADR-0071 D4)
    max_attempts = int(context["max_attempts"] or DEFAULT_MAX_ATTEMPTS)
    claimed: list[Claimed] = []
    blocked: set[str] | None = None
    after: Cursor | None = (None, None)
    page: list[Row] | None = first_page
    for _ in range(CONTENDED_RESCANS + 1):
        wanted = limit - len(claimed)
        candidates, after = await _find(
            tx,
            spec,
            limit=wanted,
            max_attempts=max_attempts,
            after=after or (None, None),
            first_page=page,
        )
        page = None
        if not candidates:
            break
        if blocked is None and any(r.get("concurrency_key") for r in candidates):
            rows = await tx.fetchall("run_running_concurrency_keys")
            blocked = {r["concurrency_key"] for r in rows}
        got = await _claim_in(tx, spec, candidates, blocked or set(), limit=wanted)
        claimed += got
        if not _contended(got, candidates, wanted) or after is None:
            break
    return claimed


async def claim_runs(
    db: StateDB, spec: WorkerSpec, *, limit: int = CLAIM_CAP, now: float | None = None
) -> list[Lease]:
    """Like ``claim_rows``, returning only the leases."""
    return [c.lease for c in await claim_rows(db, spec, limit=limit, now=now)]
