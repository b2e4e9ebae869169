"""``taskward prune`` and ``taskward archive`` (DESIGN.md R23): what an operator runs to keep
the store from growing forever. Both work in batches, each its own transaction, print each
batch as it lands (on stderr, so ``--json`` on stdout stays one document), and take
``--dry-run``. Nothing admission promises is deleted: ``archive`` keeps every key's tombstone.
"""

from __future__ import annotations

from typing import Any

import click

from taskward.archive import DEFAULT_BATCH as ARCHIVE_BATCH
from taskward.archive import MAX_BATCH as ARCHIVE_MAX_BATCH
from taskward.archive import archive_runs
from taskward.cli.common import CliState, json_option, pass_state, with_db
from taskward.cli.workers_cmd import heartbeat_ttl_option, older_than_option
from taskward.retention import DEFAULT_BATCH as PRUNE_BATCH
from taskward.retention import MAX_BATCH as PRUNE_MAX_BATCH
from taskward.retention import prune as prune_store

AGE_HELP = "an age: 90 (seconds), 30s, 5m, 2h or 30d"


@click.command("prune")
@older_than_option(f"Remove what is older than AGE ({AGE_HELP}).")
@heartbeat_ttl_option
@click.option(
    "--batch",
    type=click.IntRange(1, PRUNE_MAX_BATCH),
    default=PRUNE_BATCH,
    show_default=True,
    help="Rows deleted per transaction.",
)
@click.option("--dry-run", is_flag=True, help="Count what would go; delete nothing.")
@json_option
@pass_state
def prune(
    state: CliState, older_than: float, heartbeat_ttl: float, batch: int, dry_run: bool
) -> None:
    """Remove dead workers, finished notifications and events older than --older-than.

    Dead workers: stopped ones, and ones whose heartbeat is stale for longer than AGE (never
    one holding a live lease). Finished notifications: delivered, dead_letter and expired ones
    last changed before AGE (pending ones never). Events: task_events created before AGE (a
    task's history, its facts, stays). Tasks are never deleted: see `taskward archive`.
    """
    out = state.output

    def progress(table: str, n: int) -> None:
        out.notice(f"{table}: deleted {n}")

    report = with_db(
        state.db_url,
        lambda db: prune_store(
            db,
            older_than_s=older_than,
            heartbeat_ttl=heartbeat_ttl,
            batch=batch,
            dry_run=dry_run,
            progress=None if dry_run else progress,
        ),
    )
    if out.is_json:
        out.json(
            {
                "dry_run": dry_run,
                "older_than_s": older_than,
                "before": report.before,
                "deleted" if not dry_run else "would_delete": report.counts,
                "workers": report.workers,
            }
        )
        return
    verb = "would delete" if dry_run else "deleted"
    for table, n in report.counts.items():
        out.line(f"{table}: {verb} {n}")


@click.command("archive")
@older_than_option(f"Archive tasks that ended more than AGE ago ({AGE_HELP}).")
@click.option(
    "--batch",
    type=click.IntRange(1, ARCHIVE_MAX_BATCH),
    default=ARCHIVE_BATCH,
    show_default=True,
    help="Tasks moved per transaction.",
)
@click.option("--dry-run", is_flag=True, help="Count what would move; move nothing.")
@json_option
@pass_state
def archive(state: CliState, older_than: float, batch: int, dry_run: bool) -> None:
    """Move ended tasks older than --older-than to archive storage (DESIGN.md R23).

    Each task moves with its facts, events, summaries, results, dependency links and finished
    notifications, in batches of --batch, each batch all or nothing. Its key stays: the same
    key with the same application still returns its id, and another application is still a
    conflict. `taskward task show ID` and `task history ID` still find it. A task another live
    task refers to (a retry, a dependent) waits for it; one with a pending notification waits
    for the notification.
    """
    out = state.output

    def progress(moved: int, total: int) -> None:
        out.notice(f"archived {moved} task(s) ({total} so far)")

    report = with_db(
        state.db_url,
        lambda db: archive_runs(
            db,
            older_than_s=older_than,
            batch=batch,
            dry_run=dry_run,
            progress=None if dry_run else progress,
        ),
    )
    result: dict[str, Any] = {
        "dry_run": dry_run,
        "older_than_s": older_than,
        "before": report.before,
    }
    if dry_run:
        result.update(ready=report.ready, held=report.held)
    else:
        result.update(archived=report.archived, batches=report.batches)
    if out.is_json:
        out.json(result)
    elif dry_run:
        out.line(
            f"would archive {report.ready} task(s) now; {report.held} more ended before then "
            "but are held by a live task that refers to them or a pending notification"
        )
    else:
        out.line(f"archived {report.archived} task(s) in {report.batches} batch(es)")
