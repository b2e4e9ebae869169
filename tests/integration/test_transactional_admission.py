"""Transactional admission (DESIGN.md R24) on both backends: ``submit_task`` inside the caller's
own open transaction -- psycopg (async and sync), sqlite3, SQLAlchemy (sync and async) -- commits
with it or not at all, keeps the key's semantics, and wakes workers only once it commits.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

import taskward
from taskward import TaskApplication, TaskIdempotencyConflict, TaskValidationError
from taskward.store.port import StateDB
from tests.integration.helpers import REGISTRY, submit


def app(key: str | None = None, **changes: Any) -> TaskApplication:
    fields: dict[str, Any] = {
        "action_kind": "command",
        "args": {"argv": ["true"]},
        "execution_target": "host",
        "idempotency_key": key or f"tx-{uuid.uuid4()}",
    }
    fields.update(changes)
    return TaskApplication(**fields)


def sqlite_path(db_url: str) -> str:
    return db_url.removeprefix("sqlite:///").split("?", 1)[0]


@contextmanager
def sync_connection(db_url: str) -> Iterator[Any]:
    """The caller's own synchronous connection to the store, outside any transaction."""
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(db_url), timeout=30)
        try:
            yield conn
        finally:
            conn.close()
    else:
        with psycopg.connect(db_url) as conn:
            yield conn


async def by_key(db: StateDB, key: str) -> Any:
    return await db.fetchone("run_get_by_key", {"idempotency_key": key})


def orders_table(conn: Any) -> None:
    """The caller's own table, created and committed before the scenario."""
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY)")
    conn.commit()


# -- synchronous connections: sqlite3 and psycopg ----------------------------------------------


async def test_a_committed_transaction_leaves_the_row_and_the_callers_write(
    db: StateDB, db_url: str
) -> None:
    def scenario() -> str:
        with sync_connection(db_url) as conn:
            orders_table(conn)
            conn.execute("INSERT INTO orders (id) VALUES ('o-1')")
            task_id = taskward.submit_task_sync(conn, app("order:o-1"), registry=REGISTRY)
            conn.commit()
            return task_id

    task_id = await asyncio.to_thread(scenario)
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["idempotency_key"]) == ("queued", "order:o-1")


async def test_a_rolled_back_transaction_leaves_nothing(db: StateDB, db_url: str) -> None:
    a = await submit(db)

    def scenario() -> None:
        with sync_connection(db_url) as conn:
            orders_table(conn)
            conn.execute("INSERT INTO orders (id) VALUES ('o-2')")
            taskward.submit_task_sync(conn, app("order:o-2"), registry=REGISTRY)
            taskward.submit_task_sync(conn, app("order:o-2b", depends_on=[a]), registry=REGISTRY)
            conn.rollback()
            assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 0

    await asyncio.to_thread(scenario)
    assert await by_key(db, "order:o-2") is None
    assert await by_key(db, "order:o-2b") is None
    assert (await taskward.task_dependencies(db, a))["children"] == []


async def test_the_keys_semantics_hold_inside_the_transaction(db: StateDB, db_url: str) -> None:
    earlier = await taskward.submit_task(db, app("kept"), registry=REGISTRY)

    def scenario() -> tuple[str, str]:
        with sync_connection(db_url) as conn:
            orders_table(conn)
            conn.execute("INSERT INTO orders (id) VALUES ('o-3')")
            replayed = taskward.submit_task_sync(conn, app("kept"), registry=REGISTRY)
            with pytest.raises(TaskIdempotencyConflict):
                taskward.submit_task_sync(
                    conn, app("kept", args={"argv": ["echo", "other"]}), registry=REGISTRY
                )
            with pytest.raises(TaskValidationError) as missing:
                taskward.submit_task_sync(
                    conn, app("dangling", depends_on=["no-such-task"]), registry=REGISTRY
                )
            assert missing.value.field == "depends_on"
            # the caller's transaction is still usable: its own write and a new task commit
            fresh = taskward.submit_task_sync(conn, app("fresh"), registry=REGISTRY)
            conn.commit()
            assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 1
            return replayed, fresh

    replayed, fresh = await asyncio.to_thread(scenario)
    assert replayed == earlier
    assert (await taskward.get_task(db, fresh))["status"] == "queued"
    assert await by_key(db, "dangling") is None


async def test_dependencies_are_linked_in_the_callers_transaction(db: StateDB, db_url: str) -> None:
    a = await submit(db)

    def scenario() -> str:
        with sync_connection(db_url) as conn:
            task_id = taskward.submit_task_sync(
                conn, app("after-a", depends_on=[a]), registry=REGISTRY
            )
            conn.commit()
            return task_id

    task_id = await asyncio.to_thread(scenario)
    assert (await taskward.get_task(db, task_id))["status"] == "waiting_dependency"
    assert [p["id"] for p in (await taskward.task_dependencies(db, task_id))["parents"]] == [a]


async def test_an_autocommit_connection_outside_a_transaction_is_refused(
    db: StateDB, db_url: str
) -> None:
    def scenario() -> None:
        if db_url.startswith("sqlite"):
            conn: Any = sqlite3.connect(sqlite_path(db_url), isolation_level=None)
        else:
            conn = psycopg.connect(db_url, autocommit=True)
        try:
            with pytest.raises(TaskValidationError) as refused:
                taskward.submit_task_sync(conn, app("alone"), registry=REGISTRY)
            assert refused.value.field == "connection"
            assert "autocommit" in str(refused.value)
            # inside an explicit transaction it is admitted, with it
            if isinstance(conn, sqlite3.Connection):
                conn.execute("BEGIN")
                taskward.submit_task_sync(conn, app("alone"), registry=REGISTRY)
                conn.execute("COMMIT")
            else:
                with conn.transaction():
                    taskward.submit_task_sync(conn, app("alone"), registry=REGISTRY)
        finally:
            conn.close()

    await asyncio.to_thread(scenario)
    assert await by_key(db, "alone") is not None


def test_what_is_not_a_connection_is_refused_by_name() -> None:
    with pytest.raises(TaskValidationError) as refused:
        taskward.submit_task_sync(object(), app(), registry=REGISTRY)
    assert refused.value.field == "connection"


# -- concurrent transactions with one key --------------------------------------------------------


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
@pytest.mark.parametrize("same", [True, False], ids=["same-application", "another"])
async def test_two_transactions_with_one_key_wait_then_replay_conflict_or_insert(
    db: StateDB, db_url: str, first_ends: str, same: bool
) -> None:
    """The second transaction's admission waits for the first to end (the key's unique index on
    PostgreSQL, the write lock on SQLite), then returns the first's task (same application),
    conflicts (another application) -- or, if the first rolled back, inserts its own."""
    key = f"race-{first_ends}-{same}"
    first_admitted = threading.Event()
    results: dict[str, Any] = {}

    def first() -> None:
        with sync_connection(db_url) as conn:
            results["first"] = taskward.submit_task_sync(conn, app(key), registry=REGISTRY)
            first_admitted.set()
            threading.Event().wait(0.3)  # hold the transaction open while the second waits
            if first_ends == "commit":
                conn.commit()
            else:
                conn.rollback()

    def second() -> None:
        assert first_admitted.wait(30)
        application = app(key) if same else app(key, args={"argv": ["echo", "other"]})
        with sync_connection(db_url) as conn:
            try:
                results["second"] = taskward.submit_task_sync(conn, application, registry=REGISTRY)
            except TaskIdempotencyConflict as exc:
                results["second"] = exc
            conn.commit()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    row = await by_key(db, key)
    if first_ends == "rollback":  # the second transaction's own task holds the key
        assert row["id"] == results["second"] != results["first"]
    elif same:
        assert row["id"] == results["first"] == results["second"]
    else:
        assert row["id"] == results["first"]
        assert isinstance(results["second"], TaskIdempotencyConflict)


# -- async: psycopg AsyncConnection and the wake-up -------------------------------------------


async def test_an_async_psycopg_transaction_commits_the_row_and_then_wakes(
    db: StateDB, db_url: str
) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("psycopg: PostgreSQL only")
    listener = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
    await listener.execute("LISTEN taskward_queued")
    try:
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            async with conn.transaction():
                task_id = await taskward.submit_task(conn, app("async-1"), registry=REGISTRY)
                pid = conn.info.backend_pid
                assert await _notified(listener, 0.3, pid) is False  # nothing before the commit
            assert await _notified(listener, 10.0, pid) is True
            async with conn.transaction():
                await taskward.submit_task(conn, app("async-2"), registry=REGISTRY)
                raise psycopg.Rollback()  # leaves the block, rolling the transaction back
            assert await _notified(listener, 0.3, pid) is False  # a rolled back row wakes no one
    finally:
        await listener.close()
    assert (await taskward.get_task(db, task_id))["status"] == "queued"
    assert await by_key(db, "async-2") is None


async def _notified(conn: psycopg.AsyncConnection[Any], timeout: float, pid: int) -> bool:
    """Whether a notification from the session ``pid`` arrives within ``timeout`` (channels are
    per database: other stores' tests notify it too)."""

    async def first() -> bool:
        async for notify in conn.notifies():
            if notify.pid == pid:
                return True
        return False

    try:
        return await asyncio.wait_for(first(), timeout)
    except TimeoutError:
        return False


async def test_submit_task_sync_refuses_an_async_connection(db: StateDB, db_url: str) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("psycopg: PostgreSQL only")
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        with pytest.raises(TaskValidationError) as refused:
            taskward.submit_task_sync(conn, app(), registry=REGISTRY)
    assert "await taskward.submit_task" in str(refused.value)


# -- SQLAlchemy -----------------------------------------------------------------------------


def sqlalchemy_url(db_url: str, *, asynchronous: bool = False) -> str:
    if db_url.startswith("sqlite"):
        driver = "sqlite+aiosqlite" if asynchronous else "sqlite"
        return f"{driver}:///{sqlite_path(db_url)}"
    return db_url.replace("postgresql://", "postgresql+psycopg://", 1)


async def test_a_sqlalchemy_session_admits_with_its_transaction(db: StateDB, db_url: str) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    def scenario() -> str:
        engine = create_engine(sqlalchemy_url(db_url))
        try:
            with Session(engine) as session:
                session.execute(text("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY)"))
                session.commit()
            with Session(engine) as session:
                session.execute(text("INSERT INTO orders (id) VALUES ('sa-1')"))
                taskward.submit_task_sync(session, app("sa:rolled-back"), registry=REGISTRY)
                session.rollback()
            with Session(engine) as session, session.begin():
                session.execute(text("INSERT INTO orders (id) VALUES ('sa-2')"))
                return taskward.submit_task_sync(session, app("sa:kept"), registry=REGISTRY)
        finally:
            engine.dispose()

    task_id = await asyncio.to_thread(scenario)
    assert await by_key(db, "sa:rolled-back") is None
    assert (await by_key(db, "sa:kept"))["id"] == task_id


async def test_a_sqlalchemy_async_session_admits_with_its_transaction(
    db: StateDB, db_url: str
) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    # PostgreSQL through psycopg's AsyncConnection; SQLite through aiosqlite, whose connection
    # lives in a thread of its own (admission runs there)
    engine = create_async_engine(sqlalchemy_url(db_url, asynchronous=True))
    try:
        async with AsyncSession(engine) as session:
            await taskward.submit_task(session, app("sa-async:rolled-back"), registry=REGISTRY)
            await session.rollback()
        async with AsyncSession(engine) as session, session.begin():
            task_id = await taskward.submit_task(session, app("sa-async:kept"), registry=REGISTRY)
        async with engine.connect() as conn, conn.begin():
            await taskward.submit_task(conn, app("sa-async:conn"), registry=REGISTRY)
    finally:
        await engine.dispose()
    assert await by_key(db, "sa-async:rolled-back") is None
    assert (await by_key(db, "sa-async:kept"))["id"] == task_id
    assert await by_key(db, "sa-async:conn") is not None
