"""A claim pass (ADR-0071 D4/D5, R5-R7): claim up to ``CLAIM_CAP`` of the candidates ``pages``
finds, first in one statement where the store runs one (``transitions.claim.claim_first_page``),
then paged. It writes nothing itself: every claim is a move handed to ``transitions.apply``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NamedTuple

from taskward.claims.limits import PassLimits
from taskward.claims.pages import START, Cursor, _find, _first_page_size, _page_params
from taskward.claims.spec import (
    MAX_TASK_TIMEOUT_SECONDS,
    Claimed,
    Lease,
    WorkerSpec,
    _claim_parts,
)
from taskward.groupcommit import GroupCommit
from taskward.store.port import Row, StateDB, Tx
from taskward.transitions import LostToConcurrencyKey, apply
from taskward.transitions.claim import ClaimedRows, ClaimItem, claim_first_page

CLAIM_CAP: Final = 20
# A pass whose candidates concurrent claimers took first scans on past them this many times
# (each scan starts after the last row of the previous one) before it reports what it got.
CONTENDED_RESCANS: Final = 3


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
        # Every claim's guard and patch have the same columns, and its guard the same NULLs
        # (``spec._claim_parts``): one shape, one statement.
        applied = await apply(tx, moves, returning=("*",), one_shape=True)
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
        "page_size": page_size,
        "lock": limit,
        # R5 and R25, as _claim_parts computes them in Python (spec.lease_expiry).
        "default_timeout_s": spec.default_timeout_s,
        "max_timeout_s": MAX_TASK_TIMEOUT_SECONDS,
        "lease_ttl": spec.lease_ttl,
        "lease_slack_s": spec.lease_slack_s,
        "renews": spec.renews,
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
    one, limits counted under their keys' locks), then their claims set-based (``_claim_in``)."""
    # The context, the first page and the limit keys held now in one round trip (R20:
    # task_limits is usually empty, and then nothing below changes).
    now = tx.now
    [context], first_page, held_rows = await tx.fetchall_batch(
        [
            ("claim_context", {"worker_id": spec.worker_id, "now": now}),
            (
                "run_claim_page",
                _page_params(spec, now, START, _first_page_size(spec, limit), limit),
            ),
            ("limit_state", {"keys": None, "now": now, "held_only": True}),
        ]
    )
    last = context["last_heartbeat_at"]
    if last is not None and now - float(last) > spec.heartbeat_ttl:
        return []  # a known worker with a stale heartbeat claims nothing (ADR-0071 D4)
    limits = PassLimits.of(bool(context["limited"]), held_rows)
    page_filter = None
    page: list[Row] | None = first_page
    claimed: list[Claimed] = []
    blocked: set[str] | None = None
    after: Cursor | None = START
    for _ in range(CONTENDED_RESCANS + 1):
        if limits is not None:
            narrowed = limits.page_filter(spec)
            if narrowed is not None and narrowed != page_filter:
                # The held keys' rows are left out in SQL from now on, and the scan starts
                # again: the rows of the pages read so far that were passed over (not locked,
                # or behind a held row) come first, in claim order (R17).
                page_filter, page, after = narrowed, None, START
            if page_filter is not None and page_filter["kinds"] == "[]":
                break  # every kind this worker serves is paused or at its limit
        wanted = limit - len(claimed)
        candidates, after = await _find(
            tx,
            spec,
            limit=wanted,
            now=now,
            after=after or START,
            first_page=page,
            page_filter=page_filter,
        )
        page = None
        found = len(candidates)
        if limits is not None:
            candidates = await limits.admit(tx, candidates, wanted=wanted)
        # A limit that held some candidates: rows of other keys may follow them, so the pass
        # reads on (the next scan leaves the held keys out).
        held_some = len(candidates) < found
        got: list[Claimed] = []
        if candidates:
            if blocked is None and any(r.get("concurrency_key") for r in candidates):
                rows = await tx.fetchall("run_running_concurrency_keys")
                blocked = {r["concurrency_key"] for r in rows}
            got = await _claim_in(tx, spec, candidates, blocked or set(), limit=wanted)
            if limits is not None:
                await limits.record(tx, [claim.row for claim in got])
            claimed += got
        if len(claimed) >= limit or (after is None and not held_some):
            break
        if not held_some and (not candidates or not _contended(got, candidates, wanted)):
            break
    return claimed


async def claim_runs(
    db: StateDB, spec: WorkerSpec, *, limit: int = CLAIM_CAP, now: float | None = None
) -> list[Lease]:
    """Like ``claim_rows``, returning only the leases."""
    return [c.lease for c in await claim_rows(db, spec, limit=limit, now=now)]
