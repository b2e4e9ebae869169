"""Lease renewal (DESIGN.md R25, ADR-0037 protocol version two): the running owner moves its
lease's expiry forward by compare-and-swap on the lease id.

Not a transition: the row stays ``running``, so there is no fact and no event (every status
change has both; this is none), and ``transitions`` is not involved. The write is one named,
guarded statement of the store, ``run_renew_lease``, never SQL of its own. Its rule: the expiry
becomes ``now + lease_ttl``, never past ``deadline_at + lease_slack_s`` (so a renewed lease still
ends with its deadline, as a claim's does, ``spec.lease_expiry``) and never earlier than it was.
What wins a race with it is decided by the row (R4): a reaper guards the expiry it saw, so a
renewal that lands first wins; once the reaper or a claimant changed the row, the renewal loses.
"""

from __future__ import annotations

from taskward.groupcommit import GroupCommit
from taskward.store.port import StateDB, Tx


async def _renew_in(tx: Tx, params: dict[str, object]) -> float | None:
    row = await tx.fetchone("run_renew_lease", params)
    return None if row is None else float(row["lease_expires_at"])


async def renew_lease(
    db: StateDB,
    task_id: str,
    leased_by: str,
    attempt: int,
    *,
    lease_ttl: float,
    lease_slack_s: float,
    now: float | None = None,
    group: GroupCommit | None = None,
) -> float | None:
    """Renew ``leased_by``'s lease of ``task_id`` on ``attempt`` (the lease id, R4) at ``now``
    (R9: else the store's clock, once).

    With ``group`` (and no ``now``) the renewal shares a commit with the other units of the
    group (a worker's acknowledgements and claims), its time the shared transaction's.

    Returns:
        The new expiry, or None when the row is not ``running`` under that lease (reaped,
        reclaimed, finished, cancelled or unknown): nothing was written.
    """
    params: dict[str, object] = {
        "id": task_id,
        "leased_by": leased_by,
        "lease_attempts": attempt,
        "lease_ttl": lease_ttl,
        "lease_slack_s": lease_slack_s,
    }
    if group is not None and now is None:
        return await group.run(
            lambda tx: _renew_in(tx, params),
            fallback=lambda: renew_lease(
                db,
                task_id,
                leased_by,
                attempt,
                lease_ttl=lease_ttl,
                lease_slack_s=lease_slack_s,
            ),
        )
    async with db.transaction(now=now) as tx:
        return await _renew_in(tx, params)


__all__ = ["renew_lease"]
