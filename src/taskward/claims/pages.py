"""A claim pass's candidates (ADR-0071 D5, R7): ``run_claim_page`` read page by page on a
``(claim_rank, queued_at, id)`` keyset (R17: priority first, then oldest), only rows due at the
pass's time (R16), at most ``CLAIM_SCAN_CAP`` rows a scan, and ordered by affinity within what
was read. Reads only: the pass that claims them is ``passes``.
"""

from __future__ import annotations

from typing import Any, Final

from taskward.capabilities import affinity_score
from taskward.claims.limits import PassLimits
from taskward.claims.spec import WorkerSpec
from taskward.store.port import Row, StateDB, Tx

CLAIM_PAGE_SIZE: Final = 50
CLAIM_SCAN_CAP: Final = 5000

# Where the next page starts: the last row's (claim_rank, queued_at, id); all None: the start.
Cursor = tuple[int | None, float | None, str | None]
START: Final[Cursor] = (None, None, None)
NO_LIMITS: Final = "[]"


async def find_candidates(
    db: StateDB | Tx, spec: WorkerSpec, *, limit: int, now: float
) -> list[Row]:
    """Eligible queued rows due at ``now``, in claim order (affinity first, then priority, then
    oldest), leaving out the rows of limit keys held now (R20: paused, full or at their rate),
    as a claim pass would."""
    held = await db.fetchall("limit_state", {"keys": None, "now": now, "held_only": True})
    limits = PassLimits.of(bool(held), held)
    page_filter = limits.page_filter(spec) if limits is not None else None
    if page_filter is not None and page_filter["kinds"] == "[]":
        return []
    candidates, _ = await _find(db, spec, limit=limit, now=now, page_filter=page_filter)
    return candidates


async def _find(
    db: StateDB | Tx,
    spec: WorkerSpec,
    *,
    limit: int,
    now: float,
    after: Cursor = START,
    first_page: list[Row] | None = None,
    page_filter: dict[str, Any] | None = None,
) -> tuple[list[Row], Cursor | None]:
    """``find_candidates`` from ``after`` on; also returns where the next scan would start
    (None when the queue was read to its end). ``first_page``: the first page, already read
    (``_page_params`` with ``_first_page_size``); ``page_filter``: the spec's, less what limits
    hold (``claims.limits``)."""
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
            params = _page_params(
                spec, now, cursor, page_size, limit - len(candidates), page_filter
            )
            page = await db.fetchall("run_claim_page", params)
        scanned += len(page)
        # Only the rows the page locked for this pass: the others are held by another claimer,
        # or the worker cannot serve them (serves() is the SQL filter's Python twin, kept as a
        # check), or they lie beyond the rows it asked to lock.
        candidates.extend(row for row in page if row["locked"] and spec.serves(row))
        if page:
            last = page[-1]
            cursor = (last["claim_rank"], last["queued_at"], last["id"])
        if len(page) < page_size:
            more = False
            break
        page_size = CLAIM_PAGE_SIZE
    # Stable sort: descending affinity, the SQL's priority-then-oldest order kept for ties.
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
    spec: WorkerSpec,
    now: float,
    cursor: Cursor,
    page_size: int,
    wanted: int,
    page_filter: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``run_claim_page``'s parameters at ``now`` (R16: only rows due then).

    The page locks at most ``wanted`` rows, the first this worker serves; a worker that ranks
    by affinity locks every row of the page it serves, as it may claim any of them."""
    return {
        "now": now,
        **(spec.page_filter if page_filter is None else page_filter),
        "held": NO_LIMITS if page_filter is None else page_filter.get("held", NO_LIMITS),
        "cursor_rank": cursor[0],
        "cursor_queued_at": cursor[1],
        "cursor_id": cursor[2],
        "page_size": page_size,
        "lock": page_size if spec.ranked else wanted,
    }
