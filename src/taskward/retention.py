"""``taskward prune`` (DESIGN.md R23): dead workers, finished notifications and old events.

Nothing admission promises is deleted here: runs and their facts stay (``archive`` moves
terminal ones, with their keys kept as tombstones). What goes:

- workers that stopped cleanly, or whose heartbeat is stale for longer than the age
  (``heartbeat.prune_workers``; never one holding a live lease);
- finished notifications (delivered, dead_letter, expired) last changed before the age
  (``outbox.purge_notifications``; pending and delivering ones never);
- events (``task_events``) created before the age. They are the lifecycle feed; a task's
  history is its facts, which stay. The invariant checker takes ``events_pruned=True`` then.

Each table goes in batches, each batch its own transaction, and ``progress(table, n)`` is told
every batch, so a long prune shows it moves and an interrupted one keeps what it did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from taskward.errors import TaskValidationError
from taskward.heartbeat import PRUNE_BATCH as WORKER_BATCH
from taskward.heartbeat import prune_workers
from taskward.outbox import purge_notifications
from taskward.store.port import StateDB

# The most rows of one table one prune transaction deletes.
MAX_BATCH: Final = 10_000
DEFAULT_BATCH: Final = 5_000
TABLES: Final = ("workers", "notifications", "events")

Progress = Callable[[str, int], None]


@dataclass
class PruneReport:
    """What ``prune`` deleted, or in a dry run would delete, per table (``TABLES``)."""

    dry_run: bool
    older_than_s: float
    before: float
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TABLES, 0))
    workers: list[str] = field(default_factory=list)


def check_age(field_name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e12:
        raise TaskValidationError(field_name, value, "a number of seconds >= 0")
    return float(value)


def check_batch(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH:
        raise TaskValidationError("batch", value, f"1..{MAX_BATCH}")
    return value


async def prune(
    db: StateDB,
    *,
    older_than_s: float,
    heartbeat_ttl: float,
    dry_run: bool = False,
    batch: int = DEFAULT_BATCH,
    progress: Progress | None = None,
    now: float | None = None,
) -> PruneReport:
    """Delete dead workers, finished notifications and events older than ``older_than_s``
    (R23); ``dry_run`` deletes nothing and counts what would go. Returns the counts."""
    older_than_s = check_age("older_than_s", older_than_s)
    batch = check_batch(batch)
    if now is None:
        now = await db.now()  # one cut-off for every batch of every table
    before = now - older_than_s
    report = PruneReport(dry_run=dry_run, older_than_s=older_than_s, before=before)

    def told(table: str) -> Callable[[int], None]:
        def tell(n: int) -> None:
            report.counts[table] += n
            if progress is not None:
                progress(table, n)

        return tell

    tell_workers = told("workers")
    while True:
        gone = await prune_workers(
            db,
            older_than_s=older_than_s,
            heartbeat_ttl=heartbeat_ttl,
            dry_run=dry_run,
            limit=min(batch, WORKER_BATCH),
            now=now,
        )
        report.workers += [w.worker_id for w in gone]
        if gone:
            tell_workers(len(gone))
        if dry_run or len(gone) < min(batch, WORKER_BATCH):
            break

    notifications = await purge_notifications(
        db,
        older_than_s=older_than_s,
        now=now,
        batch=batch,
        dry_run=dry_run,
        progress=None if dry_run else told("notifications"),
    )
    if dry_run and notifications:
        told("notifications")(notifications)

    tell_events = told("events")
    if dry_run:
        row = await db.fetchone("event_count_before", {"before": before})
        if row and int(row["n"]):
            tell_events(int(row["n"]))
        return report
    while True:
        async with db.transaction(now=now) as tx:
            deleted = await tx.execute("event_prune_batch", {"before": before, "limit": batch})
        if deleted:
            tell_events(deleted)
        if deleted < batch:
            return report
