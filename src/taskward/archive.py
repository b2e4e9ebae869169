"""``taskward archive`` (DESIGN.md R23): terminal tasks leave the live tables, their keys stay.

A task that ended before the age moves, with its facts, events, summaries, results, dependency
links and finished notifications, into ``archived_runs`` as one JSON document (the ``retention``
migration says why archive storage is in the same database). Its key stays in the live store as a
tombstone ``(idempotency_key, application_hash, task_id)`` in ``task_key_tombstones``, which
admission's one insert statement consults (``run_insert_if_new`` refuses a key found there and
``run_get_by_key`` answers from it): the same key with the same application still returns the
original id, forever, and a different application is still ``TaskIdempotencyConflict``.
``reads.get_task`` and ``reads.list_transitions`` still find an archived task (``archived``
is then true).

A batch is two transactions:

1. the tombstones of the batch's keys, committed first. On PostgreSQL an admission racing the
   move could otherwise find neither: its insert waits on the run row the move deletes, then
   succeeds once the move commits, while its own snapshot predates the tombstone. Committed
   before the move starts, a tombstone is in every later snapshot; until the move commits the
   run row still holds the key. A tombstone of a task that then does not move (the move failed,
   or the task was held back) is harmless: it names the task that holds the key.
2. the move, all or nothing: the batch's tasks are read again under lock with the rule that
   chose them, each one's document is written, then its rows are deleted, dependents' links,
   facts (which the append-only trigger lets go only once the document is there) and the run
   last.

Which tasks: terminal, last changed before the age, and referred to by nothing live -- no run
names one as its chain parent (an operator retry, R19, by foreign key), no dependency link names
one (R21: a dependency goes after its dependents, whose links move with them) and no notification
of one is pending or delivering. Oldest first; passes repeat until none is left.

Known limits: a task can no longer be named in a new task's ``depends_on`` or retried once
archived (admission finds no such task). On PostgreSQL a retry admitted at the very moment its
parent moves makes that batch fail on the foreign key (nothing is written; run it again).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from taskward.canonical import canonical_json
from taskward.errors import TaskValidationError
from taskward.lifecycle import TERMINAL
from taskward.store.port import Row, StateDB, Tx

MAX_BATCH: Final = 5_000
DEFAULT_BATCH: Final = 500

# The parts of an archived task's document, each the rows of one table, in insertion order.
PARTS: Final = {
    "facts": ("archive_facts_of", "entity_id"),
    "events": ("archive_events_of", "task_id"),
    "summaries": ("archive_summaries_of", "task_id"),
    "results": ("archive_results_of", "task_id"),
    "dependencies": ("archive_links_of", "task_id"),
    "notifications": ("archive_notifications_of", "schedule_run_id"),
}
# What the move deletes, in this order: the run last (foreign keys point at it), the facts
# after the documents are written (the append-only trigger checks for them).
DELETES: Final = (
    "archive_delete_events",
    "archive_delete_summaries",
    "archive_delete_results",
    "archive_delete_links",
    "archive_delete_notifications",
    "archive_delete_facts",
    "archive_release_workers",
    "archive_delete_runs",
)


@dataclass
class ArchiveReport:
    """What ``archive_runs`` moved, or in a dry run: ``ready`` tasks it would move now and
    ``held`` old terminal tasks a live task or notification holds back (for the moment)."""

    dry_run: bool
    older_than_s: float
    before: float
    archived: int = 0
    batches: int = 0
    ready: int = 0
    held: int = 0


def _terminal() -> str:
    return canonical_json(sorted(s.value for s in TERMINAL))


async def archive_runs(
    db: StateDB,
    *,
    older_than_s: float,
    batch: int = DEFAULT_BATCH,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
    now: float | None = None,
) -> ArchiveReport:
    """Archive every terminal task last changed more than ``older_than_s`` ago that nothing
    live refers to, ``batch`` tasks a transaction (R23). ``progress(moved, total)`` is told
    after each batch. ``dry_run`` moves nothing and counts.

    Raises:
        TaskValidationError: ``older_than_s`` not a number of seconds >= 0, or ``batch``
            outside 1..MAX_BATCH.
    """
    if (
        isinstance(older_than_s, bool)
        or not isinstance(older_than_s, int | float)
        or not 0 <= older_than_s < 1e12
    ):
        raise TaskValidationError("older_than_s", older_than_s, "a number of seconds >= 0")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise TaskValidationError("batch", batch, f"1..{MAX_BATCH}")
    if now is None:
        now = await db.now()  # one cut-off for every batch
    before = now - float(older_than_s)
    report = ArchiveReport(dry_run=dry_run, older_than_s=float(older_than_s), before=before)
    if dry_run:
        row = await db.fetchone("archive_counts", {"terminal": _terminal(), "before": before})
        old = int(row["old"] or 0) if row else 0
        report.ready = int(row["ready"] or 0) if row else 0
        report.held = old - report.ready
        return report
    while True:
        moved = await archive_batch(db, before=before, limit=batch, now=now)
        if not moved:
            return report
        report.archived += moved
        report.batches += 1
        if progress is not None:
            progress(moved, report.archived)


async def archive_batch(db: StateDB, *, before: float, limit: int, now: float | None = None) -> int:
    """One batch: at most ``limit`` tasks chosen, their tombstones committed, then moved in one
    transaction. Returns how many moved (0: none is left to archive)."""
    terminal = _terminal()
    chosen = [
        row["id"]
        for row in await db.fetchall(
            "archive_candidates", {"terminal": terminal, "before": before, "limit": limit}
        )
    ]
    if not chosen:
        return 0
    ids = canonical_json(chosen)
    async with db.transaction(now=now) as tx:
        await tx.execute("archive_tombstones", {"ids": ids})
    async with db.transaction(now=now) as tx:
        runs = await tx.fetchall(
            "archive_lock", {"ids": ids, "terminal": terminal, "before": before}
        )
        if not runs:
            return 0
        ids = canonical_json([run["id"] for run in runs])
        documents = await _documents(tx, runs, ids)
        await tx.write_many([("archived_run_insert_many", documents)])
        for name in DELETES:
            await tx.execute(name, {"ids": ids})
    return len(runs)


async def _documents(tx: Tx, runs: Sequence[Row], ids: str) -> list[dict[str, Any]]:
    """Each run's archived_runs row: its document holds the run and the rows of ``PARTS``."""
    parts = await tx.fetchall_batch([(query, {"ids": ids}) for query, _ in PARTS.values()])
    by_task: dict[str, dict[str, list[Row]]] = {run["id"]: {} for run in runs}
    for (part, (_, column)), rows in zip(PARTS.items(), parts, strict=True):
        for row in rows:
            by_task[row[column]].setdefault(part, []).append(row)
    return [
        {
            "id": run["id"],
            "status": run["status"],
            "action_kind": run["action_kind"],
            "created_at": run["created_at"],
            "ended_at": run.get("ended_at"),
            "document": _json({"run": run, **{p: by_task[run["id"]].get(p, []) for p in PARTS}}),
        }
        for run in runs
    ]


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def archived_document(row: Mapping[str, Any]) -> dict[str, Any]:
    """An ``archived_run_get`` row's document as a dict (SQLite returns its text)."""
    document = row["document"]
    return json.loads(document) if isinstance(document, str) else dict(document)
