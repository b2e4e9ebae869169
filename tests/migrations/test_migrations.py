"""Migrations: applied on open under a lock, a second run is a no-op, schema as expected."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import psycopg
import pytest

import taskward
from taskward.errors import StoreError
from taskward.store.migrate import load_migrations
from taskward.store.port import StateDB
from tests.conftest import StoreFactory

EXPECTED_RUN_COLUMNS = {
    # ADR-0071 D2
    "id",
    "schedule_id",
    "invocation_id",
    "trigger_context",
    "action_kind",
    "action_args",
    "status",
    "exit_code",
    "chain_parent_id",
    "chain_depth",
    "fired_at",
    "ended_at",
    "error_detail",
    "created_at",
    "updated_at",
    "status_reason_code",
    "status_reason_summary",
    "status_evidence_refs",
    "queued_at",
    "leased_by",
    "lease_expires_at",
    "concurrency_key",
    "lease_attempts",
    "required_capabilities",
    "execution_target",
    "library_ref",
    "library_content_hash",
    # ADR-0072 D2 and D3/D5
    "idempotency_key",
    "application_hash",
    "admission_source",
    "retry_at",
    "deadline_at",
    "cancel_requested_at",
    "cancel_requested_by",
    # DESIGN.md R15-R18, R20 (migration 0011); claim_rank is -priority, generated
    "run_after",
    "priority",
    "claim_rank",
    "max_attempts",
    "limit_key",
    "has_dependents",
    "trace_context",  # issue 28: the admission span's W3C context
}
EXPECTED_FACT_COLUMNS = {
    "id",
    "entity_type",
    "entity_id",
    "previous_status",
    "status",
    "reason_code",
    "reason_summary",
    "evidence_refs",
    "source",
    "actor",
    "created_at",
    "metadata",
    "idempotency_key",
    "request_hash",
    "event_id",
    "lease_id",
}
EXPECTED_INDEXES = {
    "idx_schedule_runs_queue",
    "idx_schedule_runs_concurrency",
    "idx_schedule_runs_idempotency",
    "idx_schedule_runs_running_concurrency",
    "idx_status_transitions_idempotency",
    "idx_schedule_runs_claim_rank",
    "idx_task_dependencies_on",
}


async def _columns(db: StateDB, url: str, table: str) -> set[str]:
    if db.dialect == "sqlite":
        import sqlite3

        path = url.split("?", 1)[0][len("sqlite:///") :]
        with sqlite3.connect(path) as conn:
            # table_xinfo: generated columns too (table_info leaves them out)
            return {r[1] for r in conn.execute(f"PRAGMA table_xinfo({table})")}
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
            "AND table_schema = current_schema()",
            (table,),
        )
        return {r[0] for r in await cur.fetchall()}


async def _indexes(db: StateDB, url: str) -> set[str]:
    if db.dialect == "sqlite":
        import sqlite3

        path = url.split("?", 1)[0][len("sqlite:///") :]
        with sqlite3.connect(path) as conn:
            return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
        )
        return {r[0] for r in await cur.fetchall()}


async def test_schema_has_every_column_and_index_of_the_records(db: StateDB, db_url: str) -> None:
    assert await _columns(db, db_url, "schedule_runs") == EXPECTED_RUN_COLUMNS
    facts = await _columns(db, db_url, "status_transitions") - {"seq"}
    assert facts == EXPECTED_FACT_COLUMNS
    assert await _indexes(db, db_url) >= EXPECTED_INDEXES
    assert {
        "worker_id",
        "advertised_capabilities",
        "execution_targets",
        "last_heartbeat_at",
        "leased_run_id",
    } <= await _columns(db, db_url, "workers")


async def test_second_migrate_is_a_no_op(db: StateDB) -> None:
    assert await db.migrate() == []


async def test_first_open_applies_every_migration(stores: StoreFactory) -> None:
    url = stores.new_url()
    sep = "&" if "?" in url else "?"
    async with taskward.open_db(f"{url}{sep}migrate=false") as db:
        applied = await db.migrate()
    assert applied == [
        f"{m.version:04d}_{m.name}"
        for m in load_migrations("sqlite" if url.startswith("sqlite") else "postgres")
    ]


async def test_concurrent_openers_migrate_once(stores: StoreFactory) -> None:
    url = stores.new_url()
    sep = "&" if "?" in url else "?"
    dbs = [await taskward.open_db(f"{url}{sep}migrate=false") for _ in range(4)]
    try:
        results = await asyncio.gather(*(db.migrate() for db in dbs))
    finally:
        for db in dbs:
            await db.close()
    assert sorted(len(r) for r in results) == [0, 0, 0, len(load_migrations("sqlite"))]


async def test_status_transitions_refuse_update_and_delete(db: StateDB, db_url: str) -> None:
    from tests.integration.helpers import move, submit

    task_id = await submit(db)
    await move(db, task_id, "queued", "skipped")
    if db.dialect == "sqlite":
        import sqlite3

        path = db_url[len("sqlite:///") :]
        with sqlite3.connect(path) as conn:
            for sql in (
                "UPDATE status_transitions SET status = 'queued'",
                "DELETE FROM status_transitions",
            ):
                with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                    conn.execute(sql)
    else:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            for sql in (
                "UPDATE status_transitions SET status = 'queued'",
                "DELETE FROM status_transitions",
                "TRUNCATE status_transitions",
            ):
                with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                    await conn.execute(sql)
    assert len(await taskward.list_transitions(db, task_id)) == 1


async def test_status_check_constraint_refuses_unknown_states(db: StateDB, db_url: str) -> None:
    from tests.integration.helpers import submit

    task_id = await submit(db)
    if db.dialect == "sqlite":
        import sqlite3

        with (
            sqlite3.connect(db_url[len("sqlite:///") :]) as conn,
            pytest.raises(sqlite3.IntegrityError),
        ):
            conn.execute("UPDATE schedule_runs SET status = 'leased' WHERE id = ?", (task_id,))
    else:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            with pytest.raises(psycopg.errors.CheckViolation):
                await conn.execute(
                    "UPDATE schedule_runs SET status = 'leased' WHERE id = %s", (task_id,)
                )


async def test_sqlite_connections_carry_the_documented_settings(tmp_path: Path) -> None:
    """Durability (issue 7: ``synchronous=FULL`` unless the URL says NORMAL), WAL, foreign keys
    and temporary storage in memory (``store.sqlite.connection``: statement journals in
    temporary files made a group commit's claims cost 40 us a row instead of 29)."""

    def settings(db: Any) -> tuple[Any, ...]:
        conn = db._connection()
        return tuple(
            conn.execute(f"PRAGMA {name}").fetchone()[name]
            for name in ("journal_mode", "synchronous", "foreign_keys", "temp_store")
        )

    async with taskward.open_db(f"sqlite:///{tmp_path / 'full.db'}") as db:
        assert settings(db) == ("wal", 2, 1, 2)  # synchronous 2: FULL; temp_store 2: MEMORY
    async with taskward.open_db(f"sqlite:///{tmp_path / 'normal.db'}?synchronous=NORMAL") as db:
        assert settings(db) == ("wal", 1, 1, 2)
    # The synchronous client's connections (one per thread) carry the same settings.
    from taskward.store.open import open_sync_db

    for name, query, expected in (("full", "", 2), ("normal", "?synchronous=NORMAL", 1)):
        sync_db = open_sync_db(f"sqlite:///{tmp_path / name}.db{query}")
        try:
            assert settings(sync_db) == ("wal", expected, 1, 2)
        finally:
            sync_db.close()


async def test_bad_urls_are_validation_errors() -> None:
    with pytest.raises(ValueError, match="url"):
        await taskward.open_db("mysql://x")
    with pytest.raises(ValueError, match="synchronous"):
        await taskward.open_db("sqlite:///x.db?synchronous=SOMETIMES")
    with pytest.raises(ValueError, match="unknown sqlite URL options"):
        await taskward.open_db("sqlite:///x.db?journal=off")


@pytest.mark.parametrize(
    ("query", "words"),
    [
        # libpq's own refusal, not a reconnect loop that looks like an unreachable server
        ("schema=probe", r'invalid PostgreSQL URL .*invalid URI query parameter: "schema"'),
        ("pool_min=many", r"pool_min 'many' is invalid; allowed: a whole number of at least 0"),
        (
            "pool_min=4&pool_max=2",
            r"pool_max .2. is invalid; allowed: a whole number of at least 4",
        ),
        ("pool_max=0", r"pool_max '0' is invalid; allowed: a whole number of at least 1"),
        ("open_timeout_s=-1", r"open_timeout_s '-1' is invalid; allowed: a positive number"),
        ("open_timeout_s=soon", r"open_timeout_s 'soon' is invalid"),
        ("open_timeout_s=nan", r"open_timeout_s 'nan' is invalid"),
        ("reconnect_timeout_s=inf", r"reconnect_timeout_s 'inf' is invalid"),
    ],
)
async def test_a_bad_postgres_url_is_refused_at_once(query: str, words: str) -> None:
    began = asyncio.get_running_loop().time()
    with pytest.raises(taskward.TaskValidationError, match=words):
        # A reachable server: were the URL not checked first, the pool would retry its
        # connection until open_timeout_s (10 s by default) and then call the server away.
        await taskward.open_db(f"postgresql://127.0.0.1/test?{query}")
    assert asyncio.get_running_loop().time() - began < 2.0


async def test_a_refused_url_never_shows_its_password() -> None:
    # libpq quotes the token it cannot read, here the password with a stray %
    with pytest.raises(taskward.TaskValidationError) as caught:
        await taskward.open_db("postgresql://alice:s3%zzcret@127.0.0.1/test")
    assert "zzcret" not in str(caught.value)
    assert "invalid percent-encoded token" in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


async def test_a_pool_that_cannot_open_says_why() -> None:
    # libpq checks an option's value only when it connects: the pool keeps retrying until
    # open_timeout_s, and the error then names the cause, not only the pool's timeout.
    with pytest.raises(taskward.StoreUnavailable, match=r"connecting: .*invalid sslmode value"):
        await taskward.open_db("postgresql://127.0.0.1/test?sslmode=bogus&open_timeout_s=0.3")


async def test_unreachable_postgres_is_store_unavailable() -> None:
    with pytest.raises(StoreError, match=r"connecting: .*refused"):
        await taskward.open_db(
            "postgresql://postgres@127.0.0.1:1/nope?connect_timeout=1&open_timeout_s=0.5"
        )
