"""Migration 0015 (issue 27, CPU per task): the rows a task writes build no temporary b-tree.

SQLite evaluates ``x IN ('a', 'b', 'c')`` of three or more constants through a b-tree it fills
for each row an INSERT writes (a CHECK, a partial index's WHERE): ~30,000 instructions a row.
0015 spells those lists as comparisons. Here: the per-row inserts of a drain compile to no
``OpenEphemeral``, the constraints still refuse what they refused, a store migrated from 0014
with rows keeps every row, and the finished-outbox index still serves the statements that read
it. Constraints run on both backends; the compiled-program checks are SQLite's alone.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from pathlib import Path

import psycopg
import pytest

import taskward
from taskward.errors import StoreError
from taskward.store.migrate import MIGRATIONS_TABLE, load_migrations
from taskward.store.port import StateDB
from taskward.store.queries import load_queries
from taskward.store.sqlite.db import _split_statements
from tests.conftest import StoreFactory

# The statements that run once for every row they write (admission's insert; a task's facts,
# events, summary, outbox row): none may open an ephemeral table.
PER_ROW_INSERTS = (
    "run_insert_if_new",
    "fact_insert_many",
    "event_insert_many",
    "summary_insert_many",
    "outbox_enqueue_many",
)


def _sqlite_path(url: str) -> str:
    return url.split("?", 1)[0][len("sqlite:///") :]


def _opcodes(conn: sqlite3.Connection, sql: str) -> list[str]:
    params = {name: None for name in _param_names(sql)}
    return [row[1] for row in conn.execute("EXPLAIN " + sql, params)]


def _param_names(sql: str) -> list[str]:
    return re.findall(r"(?<!:):(\w+)", sql)


async def _migrated_sqlite_file(stores: StoreFactory, why: str) -> str:
    """The path of a fresh, migrated SQLite store (the test skips on PostgreSQL: ``why``)."""
    if stores.backend != "sqlite":
        pytest.skip(why)
    url = stores.new_url()
    async with taskward.open_db(url):
        pass
    return _sqlite_path(url)


async def test_per_row_inserts_build_no_temporary_btree(stores: StoreFactory) -> None:
    path = await _migrated_sqlite_file(
        stores, "the compiled program is SQLite's (PostgreSQL evaluates IN lists in place)"
    )
    queries = load_queries("sqlite")
    with sqlite3.connect(path) as conn:
        for name in PER_ROW_INSERTS:
            opcodes = _opcodes(conn, queries[name])
            assert "Insert" in opcodes or "IdxInsert" in opcodes, name  # it is an insert
            assert "OpenEphemeral" not in opcodes, f"{name} builds a temporary b-tree per row"


async def test_finished_outbox_statements_use_their_index(stores: StoreFactory) -> None:
    path = await _migrated_sqlite_file(stores, "SQLite's partial-index matching")
    queries = load_queries("sqlite")
    with sqlite3.connect(path) as conn:
        for name in ("outbox_purge_finished", "outbox_count_finished"):
            sql = queries[name]
            plan = " ".join(
                row[3]
                for row in conn.execute(
                    "EXPLAIN QUERY PLAN " + sql, {p: None for p in _param_names(sql)}
                )
            )
            assert "idx_dispatch_outbox_finished" in plan, (name, plan)


async def test_event_kind_and_outbox_status_checks_still_refuse(db: StateDB, db_url: str) -> None:
    event = (
        "INSERT INTO task_events (id, task_id, kind, transition_id, status, payload, created_at) "
        "VALUES ('e1', 't1', {kind}, NULL, 'queued', '{{}}', 1.0)"
    )
    outbox = (
        "INSERT INTO dispatch_outbox (id, kind, dedup_key, body, status, max_attempts, "
        "next_attempt_at, created_at, updated_at) VALUES "
        "({id}, 'task.ended', {id}, '{{}}', {status}, 3, 1.0, 1.0, 1.0)"
    )
    refused = [event.format(kind="'renamed'"), outbox.format(id="'o1'", status="'lost'")]
    accepted = [
        event.format(kind="'stale_result'"),
        outbox.format(id="'o2'", status="'expired'"),
    ]
    if db.dialect == "sqlite":
        with sqlite3.connect(_sqlite_path(db_url)) as conn:
            for sql in refused:
                with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
                    conn.execute(sql)
            for sql in accepted:
                conn.execute(sql)
    else:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            for sql in refused:
                with pytest.raises(psycopg.errors.CheckViolation):
                    await conn.execute(sql)
            for sql in accepted:
                await conn.execute(sql)


def _store_at_0014(path: Path) -> sqlite3.Connection:
    """A store at ``path`` as migrations 0001-0014 left it (recorded as applied), open in
    autocommit (foreign keys off, SQLite's default for a bare connection)."""
    migrations = load_migrations("sqlite")
    assert migrations[14].name == "lean_row_writes"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(
        f"CREATE TABLE {MIGRATIONS_TABLE} ("
        "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
    )
    for migration in migrations[:14]:
        for statement in _split_statements(migration.sql):
            conn.execute(statement)
        conn.execute(
            f"INSERT INTO {MIGRATIONS_TABLE} VALUES (?, ?, 0)", (migration.version, migration.name)
        )
    return conn


def _run_row(i: int, parent: str | None) -> tuple[object, ...]:
    statuses = ("queued", "running", "retry_wait", "completed", "failed", "cancelled")
    status = statuses[i % len(statuses)]
    running = status == "running"
    return (
        f"r{i:02d}",
        "noop",
        f'{{"i":{i}}}',
        status,
        parent,
        float(i),
        float(i),
        "w1" if running else None,
        100.0 + i if running else None,
        1 if running else 0,
        f"key-{i}",
        "sha256:x",
        "library",
        i % 5 - 2,
    )


def test_a_store_at_0014_keeps_its_rows_through_0015(tmp_path: Path) -> None:
    """A store made by 0001-0014 with runs (a chain of parents, a worker holding one), events
    and outbox rows in every status: after 0015 the same rows with the same rowids, the same
    indexes by name, every reference intact, and the constraints in force."""
    path = tmp_path / "old.db"
    conn = _store_at_0014(path)
    conn.execute("PRAGMA foreign_keys=ON")
    for i in range(24):
        conn.execute(
            "INSERT INTO schedule_runs (id, action_kind, action_args, status, chain_parent_id, "
            "fired_at, created_at, leased_by, lease_expires_at, lease_attempts, idempotency_key, "
            "application_hash, admission_source, priority) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            _run_row(i, f"r{i - 1:02d}" if i % 3 else None),
        )
    conn.execute("DELETE FROM schedule_runs WHERE id = 'r23'")  # a gap in the rowids
    conn.execute(
        "INSERT INTO workers (worker_id, last_heartbeat_at, leased_run_id) "
        "VALUES ('w1', 1.0, 'r01')"
    )
    kinds = ("transition", "cancel_requested", "stale_result")
    for i in range(30):
        conn.execute(
            "INSERT INTO task_events (id, task_id, kind, transition_id, status, payload, "
            "created_at) VALUES (?, ?, ?, NULL, 'queued', ?, ?)",
            (f"e{i:02d}", f"t{i % 4}", kinds[i % 3], f'{{"i":{i}}}', float(i)),
        )
    conn.execute("DELETE FROM task_events WHERE id = 'e05'")
    statuses = ("pending", "delivering", "delivered", "dead_letter", "expired")
    for i, status in enumerate(statuses * 3):
        conn.execute(
            "INSERT INTO dispatch_outbox (id, kind, dedup_key, schedule_run_id, body, status, "
            "max_attempts, next_attempt_at, lease_owner, lease_expires_at, created_at, "
            "updated_at, delivered_at) "
            "VALUES (?, 'task.ended', ?, ?, '{}', ?, 5, ?, ?, ?, ?, ?, ?)",
            (
                f"o{i:02d}",
                f"k{i}",
                f"t{i % 4}",
                status,
                float(i),
                "w" if status == "delivering" else None,
                9.0 if status == "delivering" else None,
                float(i),
                float(i),
                float(i) if status == "delivered" else None,
            ),
        )

    def snapshot() -> tuple[list[tuple[object, ...]], ...]:
        return (
            conn.execute("SELECT rowid, * FROM schedule_runs ORDER BY rowid").fetchall(),
            conn.execute("SELECT * FROM workers").fetchall(),
            conn.execute("SELECT rowid, * FROM task_events ORDER BY rowid").fetchall(),
            conn.execute("SELECT rowid, * FROM dispatch_outbox ORDER BY rowid").fetchall(),
            sorted(
                conn.execute(
                    "SELECT name, tbl_name FROM sqlite_master WHERE type = 'index' "
                    "AND tbl_name IN ('task_events', 'dispatch_outbox', 'schedule_runs')"
                ).fetchall()
            ),
        )

    before = snapshot()
    assert len(before[0]) == 23 and len(before[4]) == 23  # 13 of runs, 2 of events, 8 of outbox
    conn.close()

    async def reopen() -> tuple[list[str], int]:
        async with taskward.open_db(f"sqlite:///{path}") as db:
            foreign_keys = db._connection().execute("PRAGMA foreign_keys").fetchone()  # type: ignore[attr-defined]
            return await db.migrate(), foreign_keys["foreign_keys"]

    # open_db applied 0015 (a second migrate has nothing) and left foreign keys on.
    assert asyncio.run(reopen()) == ([], 1)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys=ON")
    try:
        assert snapshot() == before
        assert conn.execute(f"SELECT max(version) FROM {MIGRATIONS_TABLE}").fetchone() == (15,)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
            conn.execute("UPDATE workers SET leased_run_id = 'nothing' WHERE worker_id = 'w1'")
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
            conn.execute("DELETE FROM schedule_runs WHERE id = 'r01'")  # a worker and r02 hold it
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute("UPDATE schedule_runs SET status = 'leased' WHERE id = 'r00'")
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute("UPDATE task_events SET kind = 'other' WHERE id = 'e00'")
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute("UPDATE dispatch_outbox SET status = 'sent' WHERE id = 'o00'")
        finished = conn.execute(
            "SELECT count(*) FROM dispatch_outbox INDEXED BY idx_dispatch_outbox_finished "
            "WHERE status NOT IN ('pending', 'delivering') AND updated_at < 100"
        ).fetchone()
        assert finished == (9,)  # delivered, dead_letter and expired, three of each
    finally:
        conn.close()


def test_a_migration_that_leaves_a_dangling_reference_is_rolled_back(tmp_path: Path) -> None:
    """The runner's foreign-key check before COMMIT: a store whose rows already refer to a run
    that does not exist (foreign keys were off when it was written) is refused at 0015, with
    the count, and left at 0014."""
    path = tmp_path / "dangling.db"
    conn = _store_at_0014(path)
    conn.execute(  # foreign keys are off on this connection: nothing refuses it
        "INSERT INTO workers (worker_id, last_heartbeat_at, leased_run_id) VALUES ('w1', 1, 'gone')"
    )
    conn.close()

    async def reopen() -> None:
        async with taskward.open_db(f"sqlite:///{path}"):
            pass

    with pytest.raises(StoreError, match="1 row"):
        asyncio.run(reopen())
    conn = sqlite3.connect(path)
    try:
        assert conn.execute(f"SELECT max(version) FROM {MIGRATIONS_TABLE}").fetchone() == (14,)
        assert (
            "status IN"
            in conn.execute(
                "SELECT sql FROM sqlite_master WHERE name = 'schedule_runs'"
            ).fetchone()[0]
        )
    finally:
        conn.close()
