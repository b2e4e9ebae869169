"""``taskward outbox list|retry|purge`` driven as an operator drives it: in-process (``clirun``)
against a real store, on SQLite and PostgreSQL. Rows are set up through the library."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from taskward.cli.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK
from taskward.outbox import (
    DeliveryFailed,
    OutboxConfig,
    OutboxDeliverer,
    enqueue_notification,
    get_notification,
    list_notifications,
)
from taskward.store.port import StateDB
from tests.acceptance.clirun import Run, run_cli
from tests.integration.helpers import move, submit

T0 = 1_000_000.0  # 1970: older than any --older-than the tests use


Taskward = Callable[..., Run]


@pytest.fixture
def taskward(db_url: str, tmp_path: Path) -> Taskward:
    """``taskward --db <db_url> ARGS`` in-process (``clirun``), without TASKWARD_*."""

    def run(*args: str, env: Mapping[str, str] | None = None) -> Run:
        done = run_cli(db_url, *args, env=env, cwd=tmp_path)
        assert "Traceback" not in done.stderr, done.stderr
        return done

    return run


class Target:
    def __init__(self, *, ok: bool) -> None:
        self.ok = ok
        self.name = "rec"
        self.timeout_s = 5.0

    async def deliver(self, payload: bytes, row: Mapping[str, Any]) -> None:
        if not self.ok:
            raise DeliveryFailed("receiver down")


async def deliver_once(db: StateDB, *, ok: bool, now: float | None = T0) -> dict[str, int]:
    config = OutboxConfig(targets=(Target(ok=ok),))
    return await OutboxDeliverer(db, config, owner="test").run_once(now=now)


async def test_list_shows_a_cancelled_tasks_notification(db: StateDB, taskward: Taskward) -> None:
    empty = taskward("outbox", "list")
    assert empty.code == EXIT_OK and "no notifications" in empty.stdout
    assert taskward("outbox", "list", "--json").json() == {
        "notifications": [],
        "next_cursor": None,
    }
    task_id = await submit(db, now=T0)
    await move(db, task_id, "queued", "cancelled", now=T0)
    other = await submit(db, now=T0)
    await move(db, other, "queued", "skipped", now=T0)

    listed = taskward("outbox", "list", "--task", task_id, "--json")
    assert listed.code == EXIT_OK, listed.stderr
    (row,) = listed.json()["notifications"]
    assert row["schedule_run_id"] == task_id and row["status"] == "pending"
    assert row["kind"] == "task_terminal" and row["dedup_key"].startswith("task-terminal:")
    assert row["body"]["status"] == "cancelled"

    table = taskward("outbox", "list")
    assert table.code == EXIT_OK, table.stderr
    lines = table.stdout.splitlines()
    at = next(i for i, ln in enumerate(lines) if row["id"] in ln)
    assert lines[at].split()[:4] == [row["id"], "pending", "task_terminal", "0/10"]
    assert lines[at + 1].strip() == task_id  # the task, under the notification's id

    assert (
        taskward("outbox", "list", "--status", "delivered", "--json").json()["notifications"] == []
    )
    page = taskward("outbox", "list", "--limit", "1", "--json").json()
    assert len(page["notifications"]) == 1 and page["next_cursor"]
    rest = taskward("outbox", "list", "--limit", "1", "--cursor", page["next_cursor"], "--json")
    assert len(rest.json()["notifications"]) == 1
    assert rest.json()["notifications"][0]["id"] != page["notifications"][0]["id"]

    bad = taskward("outbox", "list", "--status", "lost")
    assert bad.code == EXIT_BAD_INPUT and "lost" in bad.stderr


async def test_retry_returns_a_dead_letter_to_pending(db: StateDB, taskward: Taskward) -> None:
    await enqueue_notification(db, kind="custom", dedup_key="d1", body={}, max_attempts=1, now=T0)
    assert (await deliver_once(db, ok=False))["dead_letter"] == 1
    ((row,), _) = await list_notifications(db)

    retried = taskward("outbox", "retry", row["id"])
    assert retried.code == EXIT_OK, retried.stderr
    assert retried.stdout.strip() == f"{row['id']} pending (due now)"
    now_row = await get_notification(db, row["id"])
    assert now_row["status"] == "pending" and now_row["attempts"] == 0
    assert now_row["last_error"] == "rec: receiver down"

    again = taskward("outbox", "retry", row["id"])
    assert again.code == EXIT_BAD_INPUT
    assert "is pending; only dead_letter or expired" in again.stderr

    missing = taskward("outbox", "retry", "no-such-id", "--json")
    assert missing.code == EXIT_FAILURE
    assert json.loads(missing.stderr)["error"] == "NotificationNotFound"

    assert (await deliver_once(db, ok=True, now=None))["delivered"] == 1
    assert (await get_notification(db, row["id"]))["status"] == "delivered"


async def test_purge_deletes_only_finished_notifications(db: StateDB, taskward: Taskward) -> None:
    await enqueue_notification(db, kind="custom", dedup_key="done", body={}, now=T0)
    assert (await deliver_once(db, ok=True))["delivered"] == 1
    await enqueue_notification(db, kind="custom", dedup_key="waiting", body={}, now=T0)

    purged = taskward("outbox", "purge", "--older-than", "3600")
    assert purged.code == EXIT_OK, purged.stderr
    assert purged.stdout.strip() == "deleted 1 finished notification(s)"
    again = taskward("outbox", "purge", "--older-than", "0", "--json")
    assert again.json() == {"deleted": 0, "older_than_s": 0.0}
    rows, _ = await list_notifications(db)
    assert [r["dedup_key"] for r in rows] == ["waiting"]

    assert taskward("outbox", "purge").code == EXIT_BAD_INPUT  # --older-than is required
    assert taskward("outbox", "purge", "--older-than", "-5").code == EXIT_BAD_INPUT


def test_outbox_help_lists_its_commands(taskward: Taskward) -> None:
    shown = taskward("outbox", "--help")
    assert shown.code == EXIT_OK
    for command in ("list", "retry", "purge"):
        assert command in shown.stdout
