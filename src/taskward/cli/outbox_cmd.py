"""``taskward outbox list|retry|purge``: the notification outbox as an operator sees it.

Delivery state only (ADR-0072 D6): nothing here changes a task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import click

from taskward.cli.common import CliState, json_option, pass_state, with_db
from taskward.cli.output import ID_WIDTH, cell, first_line, new_table, short_time, stacked
from taskward.outbox import (
    DEFAULT_TTL_S,
    MAX_LIST_LIMIT,
    OUTBOX_STATUSES,
    list_notifications,
    purge_notifications,
    retry_notification,
)

DEFAULT_LIST_LIMIT = 20


def _render(state: CliState, rows: Sequence[Mapping[str, Any]], next_cursor: str | None) -> None:
    """Each notification is its id with its task and last error under it, then its status,
    kind, attempts (made/allowed) and its next attempt or delivery (UTC): 80 columns fit."""
    out = state.output
    if not rows:
        out.line("no notifications")
    else:
        table = new_table()
        table.add_column("id / task / last error", no_wrap=True, max_width=ID_WIDTH)
        table.add_column("status", no_wrap=True)
        table.add_column("kind", overflow="fold")
        table.add_column("tries", justify="right", no_wrap=True)
        table.add_column("next/done", no_wrap=True)
        for row in rows:
            when = row["delivered_at"] if row["status"] == "delivered" else row["next_attempt_at"]
            if row["status"] in ("dead_letter", "expired"):
                when = None
            error = first_line(row["last_error"])
            table.add_row(
                stacked(row["id"], row["schedule_run_id"], f"error: {error}" if error else ""),
                cell(row["status"]),
                cell(row["kind"]),
                cell(f"{row['attempts']}/{row['max_attempts']}"),
                cell(None if when is None else short_time(when)[:-3]),
            )
        out.out.print(table, width=out.width)
    if next_cursor:
        out.line(f"next page: --cursor {next_cursor}")


@click.group("outbox")
def outbox() -> None:
    """Inspect, retry and purge task notifications (webhooks, notify command)."""


@outbox.command("list")
@click.option("--status", type=click.Choice(OUTBOX_STATUSES), help="Only this status.")
@click.option("--task", "task_id", metavar="ID", help="Only notifications of this task.")
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LIST_LIMIT),
    default=DEFAULT_LIST_LIMIT,
    show_default=True,
    help="Page size.",
)
@click.option("--cursor", help="Continue after a previous page.")
@json_option
@pass_state
def outbox_list(
    state: CliState, status: str | None, task_id: str | None, limit: int, cursor: str | None
) -> None:
    """List notifications, newest first."""
    rows, next_cursor = with_db(
        state.db_url,
        lambda db: list_notifications(
            db, status=status, task_id=task_id, limit=limit, cursor=cursor
        ),
    )
    if state.output.is_json:
        state.output.json({"notifications": rows, "next_cursor": next_cursor})
    else:
        _render(state, rows, next_cursor)


@outbox.command("retry")
@click.argument("notification_id", metavar="ID")
@click.option(
    "--ttl",
    "ttl_s",
    type=click.FloatRange(min=1.0),
    default=DEFAULT_TTL_S,
    show_default=True,
    help="Seconds from now until the retried notification expires.",
)
@json_option
@pass_state
def outbox_retry(state: CliState, notification_id: str, ttl_s: float) -> None:
    """Return a dead_letter or expired notification to pending, attempts reset."""
    row = with_db(state.db_url, lambda db: retry_notification(db, notification_id, ttl_s=ttl_s))
    if state.output.is_json:
        state.output.json(row)
    else:
        state.output.line(f"{row['id']} pending (due now)")


@outbox.command("purge")
@click.option(
    "--older-than",
    "older_than_s",
    type=click.FloatRange(min=0.0),
    required=True,
    metavar="SECONDS",
    help="Delete finished notifications (delivered, dead_letter, expired) last changed more "
    "than SECONDS ago. Pending and delivering ones are never deleted.",
)
@json_option
@pass_state
def outbox_purge(state: CliState, older_than_s: float) -> None:
    """Delete finished notifications older than --older-than seconds."""
    deleted = with_db(state.db_url, lambda db: purge_notifications(db, older_than_s=older_than_s))
    if state.output.is_json:
        state.output.json({"deleted": deleted, "older_than_s": older_than_s})
    else:
        state.output.line(f"deleted {deleted} finished notification(s)")
