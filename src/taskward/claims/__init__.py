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

- ``spec``: what a worker serves (``WorkerSpec``), the ``Lease`` and ``Claimed`` a pass hands
  back, and the lease arithmetic of one claim (R5);
- ``pages``: the candidates, page by page, and their order (reads only);
- ``passes``: the pass itself (``claim_rows``, ``claim_pass``) and its one-statement first page
  (``pass_call``, ``pass_claimed``); its claims are moves that ``taskward.transitions`` writes;
- ``renewal``: a running owner's renewal of its lease (``renew_lease``, R25), no transition.

Imports point one way: ``passes`` -> ``pages`` -> ``spec``; ``renewal`` imports none of them.
Every name ``taskward.claims`` had as one module is still importable here, the private
``_page_params`` and ``_claim_parts`` too (tests name them). The constants live with the code
that reads them (a test that bounds the scan sets ``pages.CLAIM_SCAN_CAP``).
"""

from taskward.claims.pages import (
    CLAIM_PAGE_SIZE,
    CLAIM_SCAN_CAP,
    Cursor,
    find_candidates,
)
from taskward.claims.pages import _page_params as _page_params
from taskward.claims.passes import (
    CLAIM_CAP,
    CONTENDED_RESCANS,
    PassCall,
    claim_pass,
    claim_rows,
    claim_runs,
    pass_call,
    pass_calls,
    pass_claimed,
)
from taskward.claims.renewal import renew_lease
from taskward.claims.spec import (
    DEFAULT_HEARTBEAT_TTL_SECONDS,
    DEFAULT_LEASE_SLACK_SECONDS,
    DEFAULT_LEASE_TTL_SECONDS,
    DEFAULT_TASK_TIMEOUT_SECONDS,
    MAX_TASK_TIMEOUT_SECONDS,
    MIN_RENEWABLE_LEASE_TTL_SECONDS,
    RENEWALS_PER_LEASE,
    Claimed,
    Lease,
    WorkerSpec,
    lease_expiry,
    new_worker_id,
)
from taskward.claims.spec import _claim_parts as _claim_parts

__all__ = [
    "CLAIM_CAP",
    "CLAIM_PAGE_SIZE",
    "CLAIM_SCAN_CAP",
    "CONTENDED_RESCANS",
    "DEFAULT_HEARTBEAT_TTL_SECONDS",
    "DEFAULT_LEASE_SLACK_SECONDS",
    "DEFAULT_LEASE_TTL_SECONDS",
    "DEFAULT_TASK_TIMEOUT_SECONDS",
    "MAX_TASK_TIMEOUT_SECONDS",
    "MIN_RENEWABLE_LEASE_TTL_SECONDS",
    "RENEWALS_PER_LEASE",
    "Claimed",
    "Cursor",
    "Lease",
    "PassCall",
    "WorkerSpec",
    "claim_pass",
    "claim_rows",
    "claim_runs",
    "find_candidates",
    "lease_expiry",
    "new_worker_id",
    "pass_call",
    "pass_calls",
    "pass_claimed",
    "renew_lease",
]
