"""A worker's heartbeat row (ADR-0071 D4): what it advertises, the time that says it is alive,
the clean stop that says it is gone, and the pruning of dead workers (issue 28, R23).

Written by ``taskward worker`` (``runtime.WorkerRuntime``) and by the ADR-0071 call of that name
(``taskward.worker.register_heartbeat``, re-exported from ``taskward``); read by claims (a known
worker with a stale heartbeat claims nothing), the deadline reaper and ``placement``.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from taskward.errors import TaskValidationError
from taskward.store.port import StateDB

# The most workers one prune_workers call removes (a batch of ``taskward prune``).
PRUNE_BATCH: Final = 500


async def register_heartbeat(
    db: StateDB,
    *,
    worker_id: str,
    advertised_capabilities: list[str] | None = None,
    execution_targets: list[str] | None = None,
    now: float | None = None,
    served_kinds: Sequence[str] = (),
    concurrency: int | None = None,
    leased_run_id: str | None = None,
) -> None:
    """Upsert the worker's heartbeat row with what it advertises (default target ``host``)."""
    async with db.transaction(now=now) as tx:
        await tx.execute(
            "worker_heartbeat",
            {
                "worker_id": worker_id,
                "advertised_capabilities": json.dumps(sorted(set(advertised_capabilities or []))),
                "execution_targets": json.dumps(sorted(set(execution_targets or ["host"]))),
                "served_kinds": json.dumps(sorted(set(served_kinds))),
                "leased_run_id": leased_run_id,
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "concurrency": concurrency,
            },
        )


async def mark_worker_stopped(db: StateDB, *, worker_id: str, now: float | None = None) -> None:
    """Record a clean stop: the worker shows ``stopped`` (``reads.list_workers``), not
    ``stale``, and may be pruned (``prune_workers``). A later heartbeat of the id clears it."""
    async with db.transaction(now=now) as tx:
        await tx.execute("worker_stop", {"worker_id": worker_id})


@dataclass(frozen=True)
class PrunedWorker:
    """A worker ``prune_workers`` removed (or, in a dry run, would remove)."""

    worker_id: str
    last_heartbeat_at: float
    stopped_at: float | None


async def prune_workers(
    db: StateDB,
    *,
    older_than_s: float,
    heartbeat_ttl: float,
    worker_id: str | None = None,
    dry_run: bool = False,
    limit: int = PRUNE_BATCH,
    now: float | None = None,
) -> list[PrunedWorker]:
    """Delete dead workers (issue 28, R23), at most ``limit``: every stopped one, and every
    one whose heartbeat is stale (older than ``heartbeat_ttl``) for longer than
    ``older_than_s``, i.e. last seen before ``now - max(older_than_s, heartbeat_ttl)``. Never
    a worker holding a live lease (a running task whose lease has not expired). ``worker_id``
    limits it to that worker; ``dry_run`` deletes nothing and returns what would go.

    A worker deleted while it still runs (a partitioned host) writes its row again with its next
    heartbeat; nothing else refers to a worker row.
    """
    if not 1 <= limit <= PRUNE_BATCH:
        raise TaskValidationError("limit", limit, f"1..{PRUNE_BATCH}")
    for name, value in (("older_than_s", older_than_s), ("heartbeat_ttl", heartbeat_ttl)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise TaskValidationError(name, value, "a number of seconds >= 0")
    async with db.transaction(now=now) as tx:
        params = {
            "worker_id": worker_id,
            "stale_before": tx.now - max(float(older_than_s), float(heartbeat_ttl)),
            "limit": limit,
        }
        rows = await tx.fetchall("worker_prunable", params)
        found = [
            PrunedWorker(
                worker_id=row["worker_id"],
                last_heartbeat_at=float(row["last_heartbeat_at"]),
                stopped_at=None if row["stopped_at"] is None else float(row["stopped_at"]),
            )
            for row in rows
        ]
        if dry_run:
            return found
        gone = []
        for worker in found:
            if await tx.execute(
                "worker_delete_prunable", {**params, "worker_id": worker.worker_id}
            ):
                gone.append(worker)
        return gone
