"""``taskward.SyncClient``: synchronous admission with ``submit_task``'s semantics exactly, on
both backends (ADR-0072 D1/D2, R8), from several threads and across fork()."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import select
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import taskward
from taskward import SyncClient, TaskApplication
from taskward.adapters import AdapterConfig, build_registry
from taskward.errors import (
    AdapterNotRegistered,
    StoreError,
    StoreUnavailable,
    TaskIdempotencyConflict,
    TaskValidationError,
)
from taskward.store.port import StateDB
from tests.conftest import StoreFactory

REGISTRY = build_registry(AdapterConfig(command_allowlist=frozenset({"true", "echo"})))
# Every column an admission writes that does not depend on the id, the key or the time.
SAME_COLUMNS = (
    "schedule_id",
    "invocation_id",
    "trigger_context",
    "action_kind",
    "action_args",
    "status",
    "chain_depth",
    "concurrency_key",
    "required_capabilities",
    "execution_target",
    "library_ref",
    "library_content_hash",
    "application_hash",
    "admission_source",
    "lease_attempts",
    "leased_by",
    "lease_expires_at",
)


def app(**changes: object) -> TaskApplication:
    base = TaskApplication(
        action_kind="command",
        args={"argv": ["echo", "hi"]},
        execution_target="host",
        idempotency_key="key-1",
        required_capabilities=["gpu", "docker"],
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


async def test_a_submission_writes_the_row_submit_task_writes(db: StateDB, db_url: str) -> None:
    with SyncClient(db_url, registry=REGISTRY) as client:
        ours = await asyncio.to_thread(client.submit_task, app(idempotency_key="sync"), now=500.0)
    theirs = await taskward.submit_task(
        db, app(idempotency_key="async"), registry=REGISTRY, now=500.0
    )
    row, other = await taskward.get_task(db, ours), await taskward.get_task(db, theirs)
    assert {c: row[c] for c in SAME_COLUMNS} == {c: other[c] for c in SAME_COLUMNS}
    assert row["status"] == "queued" and row["idempotency_key"] == "sync"
    assert row["fired_at"] == row["created_at"] == row["queued_at"] == 500.0
    assert await taskward.list_transitions(db, ours) == []  # admission writes no fact


async def test_a_replayed_key_returns_the_original_and_a_changed_one_conflicts(
    db: StateDB, db_url: str
) -> None:
    first = await taskward.submit_task(db, app(), registry=REGISTRY)
    client = SyncClient(db_url, registry=REGISTRY)
    try:
        again = await asyncio.to_thread(client.admit_task, app())
        assert again.task_id == first and again.created is False
        changed = app(args={"argv": ["echo", "other"]})
        with pytest.raises(TaskIdempotencyConflict) as caught:
            await asyncio.to_thread(client.submit_task, changed)
        assert caught.value.existing_task_id == first
        fresh = await asyncio.to_thread(client.admit_task, app(idempotency_key="key-2"))
        assert fresh.created is True and fresh.task_id != first
    finally:
        client.close()
    rows, _ = await taskward.list_tasks(db, limit=10)
    assert len(rows) == 2


async def test_invalid_applications_write_nothing(db: StateDB, db_url: str) -> None:
    with SyncClient(db_url, registry=REGISTRY) as client:
        with pytest.raises(TaskValidationError):
            client.submit_task(app(idempotency_key="  "))
        with pytest.raises(TaskValidationError):
            client.submit_task(app(execution_target="moon"))
        with pytest.raises(TaskValidationError):
            client.submit_task(app(), admission_source="carrier pigeon")
        with pytest.raises(AdapterNotRegistered):
            client.submit_task(app(action_kind="no_such_kind"))
    rows, _ = await taskward.list_tasks(db, limit=10)
    assert rows == []


async def test_threads_sharing_one_client_each_admit_once_per_key(db: StateDB, db_url: str) -> None:
    """8 threads, 30 distinct keys each, and all of them racing on 10 shared keys: every key is
    one row, and every thread got that row's id for a shared key."""
    client = SyncClient(db_url, registry=REGISTRY)

    def work(thread: int) -> dict[str, str]:
        ids = {}
        for i in range(30):
            key = f"t{thread}-{i}"
            ids[key] = client.submit_task(app(idempotency_key=key))
            shared = f"shared-{i % 10}"
            ids[shared] = client.submit_task(app(idempotency_key=shared))
        return ids

    try:
        with ThreadPoolExecutor(8) as pool:
            results = await asyncio.to_thread(lambda: list(pool.map(work, range(8))))
    finally:
        client.close()
    rows, cursor = await taskward.list_tasks(db, limit=500)
    assert cursor is None
    by_key = {row["idempotency_key"]: row["id"] for row in rows}
    assert len(rows) == 8 * 30 + 10
    for ids in results:
        for key, task_id in ids.items():
            assert by_key[key] == task_id


def _connection_in_use(client: SyncClient) -> object:
    """The connection this thread's calls went through (white-box: the invariant is that a
    forked child never goes through its parent's)."""
    db: Any = client._db
    return db._local.conn if db.dialect == "sqlite" else db._hot


def _in_child(work: Callable[[], str], timeout_s: float = 30.0) -> str:
    """fork(); the child runs ``work`` and exits at once (``os._exit``: no finalisers, as a
    pre-forking server's worker may die); returns what it said. A child that hangs (waiting on
    something of its parent's) is killed after ``timeout_s`` and fails the test."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_end)
        code = 0
        try:
            said = work()
        except BaseException as exc:
            said, code = f"child failed: {exc!r}", 3
        os.write(write_end, said.encode())
        os._exit(code)
    os.close(write_end)
    ready, _, _ = select.select([read_end], [], [], timeout_s)
    if not ready:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_end)
        pytest.fail(f"the child did not answer within {timeout_s:g} s")
    with os.fdopen(read_end, "rb") as pipe:
        said = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, said
    return said


def _fork_and_submit(client: SyncClient, key: str) -> str:
    """The child admits ``key`` through ``client``, never through its parent's connection."""
    inherited = _connection_in_use(client)
    assert inherited is not None

    def work() -> str:
        task_id = client.submit_task(app(idempotency_key=key))
        if _connection_in_use(client) is inherited:
            raise AssertionError("the child used its parent's connection")
        return task_id

    return _in_child(work)


async def test_a_forked_child_uses_connections_of_its_own(db: StateDB, db_url: str) -> None:
    """The client was used before fork(); the child admits through it and exits; the parent's
    connection still works afterwards (the child never used or closed it)."""
    client = SyncClient(db_url, registry=REGISTRY)
    try:
        before = client.submit_task(app(idempotency_key="parent-1"))
        from_child = _fork_and_submit(client, "child")
        after = client.submit_task(app(idempotency_key="parent-2"))
    finally:
        client.close()
    for task_id in (before, from_child, after):
        assert (await taskward.get_task(db, task_id))["status"] == "queued"


async def test_a_submission_wakes_an_idle_worker_of_another_store(db: StateDB, db_url: str) -> None:
    """An idle worker waits on its store's ``queued`` signal: NOTIFY in the statement on
    PostgreSQL, the data_version poll on SQLite, as for any other process's admission."""
    signal = db.signal("queued")
    with SyncClient(db_url, registry=REGISTRY) as client:
        # The watcher's (or the LISTEN connection's) first reading may come after the first
        # commit: a later submission must then wake it. Bounded, and each wait ends early.
        for attempt in range(20):
            seen = signal.seq
            await asyncio.to_thread(client.submit_task, app(idempotency_key=f"wake-{attempt}"))
            if await signal.wait(seen, 2.0):
                break
        else:
            pytest.fail("no submission woke the idle worker's signal")
        # Now the watcher is reading (or LISTEN is in place): this one submission must wake it.
        seen = signal.seq
        await asyncio.to_thread(client.submit_task, app(idempotency_key="wake-now"))
        assert await signal.wait(seen, 10.0) is True


def test_a_bad_url_is_refused_before_anything_connects(tmp_path: Path) -> None:
    with pytest.raises(TaskValidationError):
        SyncClient(f"sqlite:///{tmp_path / 'x.db'}?synchronous=SOMETIMES")
    with pytest.raises(TaskValidationError):
        SyncClient("postgresql://127.0.0.1:5432/test?schema=x")
    with pytest.raises(TaskValidationError):
        SyncClient("mysql://localhost/db")
    assert not (tmp_path / "x.db").exists()


def test_a_closed_client_refuses_calls(stores: StoreFactory) -> None:
    client = SyncClient(stores.new_url(), registry=REGISTRY)
    client.submit_task(app())
    client.close()
    client.close()  # twice is fine
    with pytest.raises(StoreError, match="closed"):
        client.submit_task(app(idempotency_key="later"))


def test_a_fresh_store_is_migrated_on_first_use(stores: StoreFactory) -> None:
    with SyncClient(stores.new_url(), registry=REGISTRY) as client:
        assert client.admit_task(app()).created is True


def test_migrate_false_refuses_a_store_behind_this_version(stores: StoreFactory) -> None:
    url = stores.new_url()
    joiner = "&" if "?" in url else "?"
    client = SyncClient(f"{url}{joiner}migrate=false", registry=REGISTRY)
    with pytest.raises(StoreError, match="taskward migrate"):
        client.open()
    client.close()


def test_an_unreachable_server_is_store_unavailable_naming_the_cause() -> None:
    client = SyncClient("postgresql://postgres@127.0.0.1:1/test?open_timeout_s=1")
    with pytest.raises(StoreUnavailable, match=r"connecting: .*127\.0\.0\.1"):
        client.open()
    client.close()


def test_a_sqlite_lock_held_past_lock_timeout_s_is_store_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    url = f"sqlite:///{path}"
    with SyncClient(url, registry=REGISTRY) as client:
        client.submit_task(app())  # migrated
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with (
            SyncClient(f"{url}?lock_timeout_s=0.2", registry=REGISTRY) as client,
            pytest.raises(StoreUnavailable, match="locked"),
        ):
            client.submit_task(app(idempotency_key="blocked"))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with SyncClient(url, registry=REGISTRY) as client:
        assert client.admit_task(app(idempotency_key="blocked")).created is True


def test_a_client_opened_inside_a_running_event_loop_still_migrates(
    stores: StoreFactory,
) -> None:
    """The migration runs on a thread of its own, so a caller inside a loop is not refused."""

    async def inside() -> bool:
        with SyncClient(stores.new_url(), registry=REGISTRY) as client:
            return client.admit_task(app()).created

    assert asyncio.run(inside()) is True


def test_threads_see_one_store_on_sqlite(tmp_path: Path) -> None:
    """Each thread has its own SQLite connection; all of them write the one file."""
    url = f"sqlite:///{tmp_path / 'threads.db'}"
    barrier = threading.Barrier(4)
    with SyncClient(url, registry=REGISTRY) as client:

        def work(n: int) -> str:
            barrier.wait()
            return client.submit_task(app(idempotency_key=f"k{n}"))

        with ThreadPoolExecutor(4) as pool:
            ids = list(pool.map(work, range(4)))
    conn = sqlite3.connect(tmp_path / "threads.db")
    try:
        stored = {r[0] for r in conn.execute("SELECT id FROM schedule_runs")}
    finally:
        conn.close()
    assert stored == set(ids) and len(ids) == 4


def test_a_terminated_connection_costs_one_call_then_the_client_recovers(
    stores: StoreFactory,
) -> None:
    """The server ends the hot connection's session (a restart, an operator): the next call is
    StoreUnavailable (safe to retry with its key), and the one after runs on a new connection."""
    if stores.backend != "postgres":
        pytest.skip("sessions are a PostgreSQL matter")
    import psycopg

    from tests.conftest import PG_URL

    url = stores.new_url()
    with SyncClient(url, registry=REGISTRY) as client:
        client.submit_task(app(idempotency_key="before"))
        db: Any = client._db
        pid = db._hot.info.backend_pid
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            # Until the session is gone (a database condition, bounded), not a fixed sleep.
            deadline = time.monotonic() + 10
            while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
                assert time.monotonic() < deadline, "the terminated session stayed"
        with pytest.raises(StoreUnavailable):
            client.submit_task(app(idempotency_key="during"))
        assert client.admit_task(app(idempotency_key="during")).created is True
        assert db._hot.info.backend_pid != pid


async def test_bulk_reads_and_cancellation_are_the_async_api_behind_the_client(
    db: StateDB, db_url: str
) -> None:
    """The portal runs the async functions themselves: the same answers, the same errors."""

    def scenario() -> tuple[list[str], list[str], Any, Any, list[Any], list[Any]]:
        with SyncClient(db_url, registry=REGISTRY) as client:
            apps = [app(idempotency_key=f"bulk-{i}") for i in range(5)]
            ids = client.submit_tasks(apps)
            again = client.submit_tasks([*apps[:2], app(idempotency_key="bulk-new")])
            with pytest.raises(TaskIdempotencyConflict):
                client.submit_tasks([app(idempotency_key="bulk-0", args={"argv": ["true"]})])
            with pytest.raises(taskward.TaskNotFound):
                client.get_task("no-such-task")
            cancel = client.request_task_cancel(
                ids[0], actor=taskward.Actor(type="operator", id="ops"), idempotency_key="c-1"
            )
            row = client.get_task(ids[0])
            facts = client.list_transitions(ids[0])
            rows, cursor = client.list_tasks(status="queued", limit=100)
            assert cursor is None
            return ids, again, cancel, row, facts, rows

    ids, again, cancel, row, facts, rows = await asyncio.to_thread(scenario)
    assert len(set(ids)) == 5 and again[:2] == ids[:2] and again[2] not in ids
    assert cancel.state == "cancelled" and row["status"] == "cancelled"
    assert [(f["previous_status"], f["status"]) for f in facts] == [("queued", "cancelled")]
    assert {r["id"] for r in rows} == set(ids[1:]) | {again[2]}
    assert (await taskward.get_task(db, ids[0]))["status"] == "cancelled"


async def test_a_forked_child_runs_a_portal_of_its_own(db: StateDB, db_url: str) -> None:
    client = SyncClient(db_url, registry=REGISTRY)
    try:
        [first] = client.submit_tasks([app(idempotency_key="portal-parent")])
        inherited = client._portal

        def work() -> str:
            status: str = client.get_task(first)["status"]
            if client._portal is inherited:
                raise AssertionError("the child used its parent's portal")
            return status

        assert _in_child(work, timeout_s=20.0) == "queued"
        assert client.get_task(first)["status"] == "queued"  # the parent's portal still works
    finally:
        client.close()
