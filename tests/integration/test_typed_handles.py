"""Typed task handles (issue 29) on both backends: ``@taskward.task`` functions validate their
arguments by their type hints at admission (every binding) and again in the worker, and submit
themselves into a store, a ``SyncClient`` or the caller's own transaction (R24)."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

import taskward
from taskward import TaskApplication, TaskValidationError
from taskward.adapters import AdapterConfig, build_registry
from taskward.runtime import WorkerConfig, WorkerRuntime
from taskward.store.port import StateDB
from tests.fixtures import typed_tasks
from tests.fixtures.typed_tasks import untyped, weekly

MODULE = "tests.fixtures.typed_tasks"
REGISTRY = build_registry(AdapterConfig(imports=(MODULE,)))
WHEN = datetime(2026, 12, 5, 9, 30, tzinfo=UTC)


async def drain(db: StateDB) -> None:
    config = WorkerConfig(
        concurrency=2,
        idle_wait_s=0.02,
        run_scheduler=False,
        deliver_outbox=False,
        exit_when_idle=True,
    )
    assert await asyncio.wait_for(WorkerRuntime(db, REGISTRY, config).run(), 60) == 0


async def test_a_handle_admits_json_values_and_the_worker_calls_with_the_declared_types(
    db: StateDB,
) -> None:
    task_id = await weekly.submit(db, key="w48", week="48", when=WHEN, tags=["a"])
    row = await taskward.get_task(db, task_id)
    assert row["action_kind"] == "weekly"
    assert row["action_args"] == {"week": 48, "when": "2026-12-05T09:30:00Z", "tags": ["a"]}
    assert await weekly.submit(db, key="w48", week=48, when=WHEN, tags=["a"]) == task_id
    await drain(db)
    assert await taskward.get_task_result(db, task_id) == {
        "week": 48,
        "week_type": "int",
        "when": "2026-12-05T09:30:00+00:00",
        "when_type": "datetime",
        "tags": ["a"],
    }


async def test_a_wrong_type_is_refused_naming_the_argument_and_nothing_is_stored(
    db: StateDB,
) -> None:
    with pytest.raises(TaskValidationError) as by_handle:
        await weekly.submit(db, key="bad", week="x")
    assert by_handle.value.field == "args.week"
    assert "valid integer" in str(by_handle.value)
    # the same check at every binding's admission: an application built by hand
    with pytest.raises(TaskValidationError) as by_hand:
        await taskward.submit_task(
            db,
            TaskApplication(
                action_kind="weekly",
                args={"week": 1, "tags": "not-a-list"},
                execution_target="host",
                idempotency_key="bad-2",
            ),
            registry=REGISTRY,
        )
    assert by_hand.value.field == "args.tags"
    for key in ("bad", "bad-2"):
        assert await db.fetchone("run_get_by_key", {"idempotency_key": key}) is None


async def test_the_worker_checks_again_before_the_call(db: StateDB, db_url: str) -> None:
    """A row whose args no longer fit (admitted before the kind's types changed: here
    rewritten under the store) fails its attempt naming the argument, and is not retried."""
    task_id = await weekly.submit(db, key="drift", week=1)
    sql = 'UPDATE schedule_runs SET action_args = \'{"week": "soon"}\' WHERE id = '
    if db_url.startswith("sqlite"):
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            conn.execute(sql + "?", (task_id,))
    else:
        with psycopg.connect(db_url, autocommit=True) as pg:
            pg.execute(sql + "%s", (task_id,))
    await drain(db)
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["lease_attempts"]) == ("failed", 1)
    assert "args.week" in row["error_detail"]


def test_untyped_parameters_are_checked_by_name_only() -> None:
    app = untyped.application(key="k", a={"any": "thing"})
    assert app.args == {"a": {"any": "thing"}}
    assert untyped(1) == [1, 2]  # calling it runs it here, as before


def test_the_kinds_json_schema_names_each_typed_argument() -> None:
    adapter = REGISTRY.resolve("weekly")[1]
    schema = adapter.args_schema()  # type: ignore[attr-defined]
    assert schema["required"] == ["week"]
    assert schema["properties"]["week"]["type"] == "integer"
    assert set(schema["properties"]) == {"week", "when", "tags"}
    loose = REGISTRY.resolve("loose")[1].args_schema()  # type: ignore[attr-defined]
    assert loose == {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a"]}


async def test_submit_sync_through_a_client_and_a_callers_transaction(
    db: StateDB, db_url: str
) -> None:
    def scenario() -> tuple[str, str]:
        with taskward.SyncClient(db_url) as client:  # its own registry lacks the kind
            by_client = weekly.submit_sync(client, key="sync-1", week=2)
        if db_url.startswith("sqlite"):
            conn: Any = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        else:
            conn = psycopg.connect(db_url)
        try:
            by_conn = weekly.submit_sync(conn, key="sync-2", week=3)
            conn.rollback()
            weekly.submit_sync(conn, key="sync-3", week=4)
            conn.commit()
        finally:
            conn.close()
        return by_client, by_conn

    by_client, _ = await asyncio.to_thread(scenario)
    assert (await taskward.get_task(db, by_client))["action_args"] == {"week": 2}
    assert await db.fetchone("run_get_by_key", {"idempotency_key": "sync-2"}) is None
    assert await db.fetchone("run_get_by_key", {"idempotency_key": "sync-3"}) is not None


def test_the_fixture_module_is_what_the_registry_imported() -> None:
    assert REGISTRY.resolve("weekly")[1].fn is typed_tasks.weekly  # type: ignore[attr-defined]
