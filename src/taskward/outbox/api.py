"""Producers and operators: enqueue a notification, and list, get, count, retry and purge
``dispatch_outbox`` rows (R11, R12). Nothing here changes a task."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Final

from taskward.canonical import dumps
from taskward.cursors import decode_cursor, encode_cursor
from taskward.errors import NotificationNotFound, NotificationNotRetryable, TaskValidationError
from taskward.ids import new_id
from taskward.outbox.targets import ENV_COMMAND, ENV_WEBHOOK_URL, _validate_timeout
from taskward.store.port import Row, StateDB

# The row states of R12. Finished rows are the only ones purge deletes (R11).
OUTBOX_STATUSES: Final = ("pending", "delivering", "delivered", "dead_letter", "expired")
FINISHED_STATUSES: Final = frozenset({"delivered", "dead_letter", "expired"})
RETRYABLE_STATUSES: Final = frozenset({"dead_letter", "expired"})

# Defaults a producer gets when it passes none; outbox_enqueue repeats them in SQL (a test
# checks they agree), so a terminal transition needs no import from this module.
DEFAULT_MAX_ATTEMPTS: Final = 10
DEFAULT_TTL_S: Final = 7 * 24 * 3600.0
MAX_LIST_LIMIT: Final = 500
# Statuses only a deliverer with a target ever writes: any row in one shows that one ran.
_ATTEMPTED_STATUSES: Final = ("delivering", "delivered", "dead_letter")


def targets_configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment names a delivery target (what ``OutboxConfig.from_env`` reads:
    ``TASKWARD_WEBHOOK_URL`` or ``TASKWARD_NOTIFY_COMMAND``); their values are not checked."""
    env = os.environ if environ is None else environ
    return bool(env.get(ENV_WEBHOOK_URL, "").strip() or env.get(ENV_COMMAND, "").strip())


def no_target_notice(counts: Mapping[str, int], *, configured: bool) -> str | None:
    """What an operator must be told when nothing delivers: this process's environment names no
    target and no row was ever attempted (``counts``: ``count_notifications``). None when a
    target is configured here or some row shows a deliverer with one ran elsewhere.

    ADR-0072 D6 keeps writing the rows (a terminal transition's notification commits with it,
    whoever may deliver it later): they are held, not lost, until a target is configured or
    they expire (docs/outbox.md, "No delivery target")."""
    if configured or any(counts.get(status, 0) for status in _ATTEMPTED_STATUSES):
        return None
    held, expired = counts.get("pending", 0), counts.get("expired", 0)
    if not held and not expired:
        return None
    days = DEFAULT_TTL_S / 86400
    text = (
        f"No delivery target is configured: {held} notification{'s' * (held != 1)} held, "
        f"each expiring {days:g} days after its task ended"
    )
    if expired:
        text += f"; {expired} expired without being sent"
    return (
        f"{text}. Set {ENV_WEBHOOK_URL} (with TASKWARD_WEBHOOK_SECRET) or {ENV_COMMAND} where "
        "the workers run to deliver them (docs/outbox.md)."
    )


# The most rows one purge transaction deletes (R23: progress, and no transaction of millions).
PURGE_BATCH: Final = 10_000


async def enqueue_notification(
    db: StateDB,
    *,
    kind: str,
    dedup_key: str,
    body: Mapping[str, Any],
    schedule_run_id: str | None = None,
    transition_id: str | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ttl_s: float = DEFAULT_TTL_S,
    now: float | None = None,
) -> bool:
    """Enqueue one notification unless ``dedup_key`` exists (D6 ``enqueue_dispatch``); returns
    whether a row was inserted. Terminal transitions enqueue in their own transaction instead."""
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise TaskValidationError("max_attempts", max_attempts, "an integer >= 1")
    ttl_s = _validate_timeout("ttl_s", ttl_s)
    async with db.transaction(now=now) as tx:
        inserted = await tx.execute(
            "outbox_enqueue",
            {
                "id": new_id(),
                "kind": kind,
                "dedup_key": dedup_key,
                "schedule_run_id": schedule_run_id,
                "transition_id": transition_id,
                "body": dumps(dict(body)),
                "max_attempts": max_attempts,
                "ttl_s": ttl_s,
            },
        )
    return inserted == 1


async def get_notification(db: StateDB, notification_id: str) -> Row:
    """One dispatch_outbox row; raises NotificationNotFound."""
    row = await db.fetchone("outbox_get", {"id": notification_id})
    if row is None:
        raise NotificationNotFound(notification_id)
    return row


async def list_notifications(
    db: StateDB,
    *,
    status: str | None = None,
    task_id: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[list[Row], str | None]:
    """Notifications newest first; returns ``(rows, next_cursor)`` (None on the last page)."""
    if status is not None and status not in OUTBOX_STATUSES:
        raise TaskValidationError("status", status, OUTBOX_STATUSES)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
        raise TaskValidationError("limit", limit, f"1..{MAX_LIST_LIMIT}")
    cursor_at, cursor_id = decode_cursor(cursor) if cursor else (None, None)
    rows = await db.fetchall(
        "outbox_list",
        {
            "status": status,
            "schedule_run_id": task_id,
            "cursor_created_at": cursor_at,
            "cursor_id": cursor_id,
            "limit": limit + 1,
        },
    )
    next_cursor = encode_cursor(rows[limit - 1]) if len(rows) > limit else None
    return rows[:limit], next_cursor


async def count_notifications(db: StateDB) -> dict[str, int]:
    """Rows per outbox status (every status present, zero when none)."""
    counts = dict.fromkeys(OUTBOX_STATUSES, 0)
    for row in await db.fetchall("outbox_count_by_status"):
        counts[row["status"]] = int(row["n"])
    return counts


async def retry_notification(
    db: StateDB, notification_id: str, *, ttl_s: float = DEFAULT_TTL_S, now: float | None = None
) -> Row:
    """Operator retry (R12): ``dead_letter``/``expired`` -> ``pending``, attempts reset, due
    now, expiring ``ttl_s`` from now. Targets that acknowledged it before are not sent it again.

    Raises:
        NotificationNotFound: no row has this id.
        NotificationNotRetryable: the row is pending, delivering or delivered (nothing written).
    """
    ttl_s = _validate_timeout("ttl_s", ttl_s)
    async with db.transaction(now=now) as tx:
        row = await tx.fetchone("outbox_retry", {"id": notification_id, "ttl_s": ttl_s})
        current = (
            None if row is not None else await tx.fetchone("outbox_get", {"id": notification_id})
        )
    if row is not None:
        return row
    if current is None:
        raise NotificationNotFound(notification_id)
    raise NotificationNotRetryable(notification_id, current["status"])


async def purge_notifications(
    db: StateDB,
    *,
    older_than_s: float,
    now: float | None = None,
    batch: int = PURGE_BATCH,
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Delete finished rows (delivered, dead_letter, expired) whose last change is more than
    ``older_than_s`` before now; pending and delivering rows are never touched (R11). Returns
    the number deleted.

    Rows go in batches of at most ``batch``, each its own transaction, and ``progress`` is told
    each batch's count (R23: ``taskward prune`` prints them). ``dry_run`` deletes nothing and
    returns how many would go."""
    if (
        isinstance(older_than_s, bool)
        or not isinstance(older_than_s, int | float)
        or not (0 <= older_than_s < float("inf"))
    ):
        raise TaskValidationError("older_than_s", older_than_s, "a number of seconds >= 0")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= PURGE_BATCH:
        raise TaskValidationError("batch", batch, f"1..{PURGE_BATCH}")
    if now is None:
        now = await db.now()  # one cut-off for every batch
    params = {"older_than_s": float(older_than_s), "now": now}
    if dry_run:
        row = await db.fetchone("outbox_count_finished", params)
        return int(row["n"]) if row else 0
    total = 0
    while True:
        async with db.transaction(now=now) as tx:
            deleted = await tx.execute("outbox_purge_finished", {**params, "limit": batch})
        total += deleted
        if progress is not None and deleted:
            progress(deleted)
        if deleted < batch:
            return total
