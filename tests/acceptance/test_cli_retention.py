"""``taskward worker list|prune``, ``taskward prune`` and ``taskward archive`` in process
(click's CliRunner, ``clirun``) on both backends: 80-column tables, --json, --dry-run and
progress lines."""

from __future__ import annotations

import time
from typing import Any

import taskward
from taskward.heartbeat import mark_worker_stopped
from taskward.reads import count_by_status, list_workers
from taskward.store.port import StateDB
from tests.acceptance.clirun import Run, arun_cli
from tests.integration.helpers import REGISTRY, move


async def run(db_url: str, *args: str) -> Run:
    """The command in process (``clirun``), 80 columns wide; it must succeed."""
    result = await arun_cli(db_url, *args, env={"COLUMNS": "80"})
    assert result.code == 0, (result.stdout, result.stderr)
    return result


def json_of(result: Run) -> Any:
    return result.json()


async def test_worker_list_fits_80_columns_and_prune_removes_the_dead(
    db: StateDB, db_url: str
) -> None:
    now = await db.now()
    await taskward.register_heartbeat(
        db, worker_id="host:live0001", now=now, concurrency=8, leased_run_id=None
    )
    await taskward.register_heartbeat(db, worker_id="host:gone0001", now=now - 600)
    await mark_worker_stopped(db, worker_id="host:gone0001", now=now - 590)
    await taskward.register_heartbeat(db, worker_id="host:lost0001", now=now - 7200)

    table = (await run(db_url, "worker", "list")).stdout
    assert all(len(line) <= 80 for line in table.splitlines()), table
    lines = {line.split()[0]: line.split() for line in table.splitlines()[2:] if line.strip()}
    assert lines["host:live0001"][1:2] == ["live"] and lines["host:live0001"][4] == "0/8"
    assert lines["host:gone0001"][1] == "stopped"
    assert lines["host:lost0001"][1:3] == ["stale", "2h"]
    listed = json_of(await run(db_url, "worker", "list", "--json"))["workers"]
    assert {w["worker_id"]: w["state"] for w in listed} == {
        "host:live0001": "live",
        "host:gone0001": "stopped",
        "host:lost0001": "stale",
    }

    dry = (await run(db_url, "worker", "prune", "--older-than", "1h", "--dry-run")).stdout
    assert "would remove host:gone0001 (stopped)" in dry
    assert "would remove host:lost0001 (stale)" in dry
    assert len(await list_workers(db, heartbeat_ttl=90)) == 3
    gone = json_of(await run(db_url, "worker", "prune", "--older-than", "3h", "--json"))
    assert [w["worker_id"] for w in gone["workers"]] == ["host:gone0001"]
    await run(db_url, "worker", "prune", "--older-than", "1h")
    left = await list_workers(db, heartbeat_ttl=90)
    assert [w["worker_id"] for w in left] == ["host:live0001"]


async def test_prune_and_archive_with_dry_run_json_and_progress(db: StateDB, db_url: str) -> None:
    old = time.time() - 40 * 86400
    ids = []
    for n in range(5):
        task_id = await taskward.submit_task(
            db,
            taskward.TaskApplication(
                action_kind="command",
                args={"argv": ["true"]},
                execution_target="host",
                idempotency_key=f"cli-retention-{n}",
            ),
            registry=REGISTRY,
            now=old,
        )
        await move(db, task_id, "queued", "cancelled", now=old + 1)
        ids.append(task_id)
    # The deliverer would have expired their notifications long ago.
    await taskward.outbox.OutboxDeliverer(db).run_once(now=old + 8 * 86400)

    dry = json_of(await run(db_url, "prune", "--older-than", "30d", "--dry-run", "--json"))
    assert dry["would_delete"] == {"workers": 0, "notifications": 5, "events": 5}
    result = await run(db_url, "prune", "--older-than", "30d", "--batch", "2")
    assert result.stdout.splitlines() == [
        "workers: deleted 0",
        "notifications: deleted 5",
        "events: deleted 5",
    ]
    assert result.stderr.count("taskward: events: deleted") == 3  # batches of 2, 2 and 1

    dry = json_of(await run(db_url, "archive", "--older-than", "30d", "--dry-run", "--json"))
    assert (dry["ready"], dry["held"]) == (5, 0)
    assert sum((await count_by_status(db)).values()) == 5
    result = await run(db_url, "archive", "--older-than", "30d", "--batch", "2")
    assert result.stdout.strip() == "archived 5 task(s) in 3 batch(es)"
    assert "archived 2 task(s) (4 so far)" in result.stderr
    assert sum((await count_by_status(db)).values()) == 0
    shown = json_of(await run(db_url, "task", "show", ids[0], "--json"))
    assert shown["archived"] is True and shown["status"] == "cancelled"
