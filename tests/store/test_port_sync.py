"""The synchronous client's store (``port.SyncStatements``, ``store.open.open_sync_db``), on both
dialects: the async store's named statements, each its own transaction, from a thread without
an event loop, with errors translated as the async store translates them. (The client built on
it, ``taskward.SyncClient``, is tested in tests/integration/test_sync_client.py.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from taskward.errors import StoreError, StoreUnavailable
from taskward.store.migrate import load_migrations
from taskward.store.open import open_sync_db
from taskward.store.port import StateDB, SyncStatements
from tests.store.rows import ARGS, CAPABILITIES, fact_params, run_params


@pytest.fixture
def sync_db(db: StateDB, db_url: str) -> Iterator[SyncStatements]:
    store = open_sync_db(db_url)
    yield store
    store.close()


async def test_sync_statements_answer_as_the_async_stores_do(
    db: StateDB, sync_db: SyncStatements
) -> None:
    """``execute`` returns the rows a write wrote (0 for a taken key); ``fetchone`` None or a
    dict with its JSON columns decoded; ``fetchall`` every row in the statement's order; the
    store names the async store's dialect."""
    assert sync_db.dialect == db.dialect
    params = run_params()
    assert await asyncio.to_thread(sync_db.execute, "run_insert_if_new", params) == 1
    assert sync_db.execute("run_insert_if_new", {**params, "id": "other"}) == 0
    assert sync_db.fetchone("run_get", {"id": "no-such-run"}) is None
    run = sync_db.fetchone("run_get", {"id": params["id"]})
    assert run is not None
    assert (run["action_args"], run["required_capabilities"]) == (ARGS, CAPABILITIES)
    facts = [fact_params(params["id"]) for _ in range(3)]
    for fact in facts:
        assert sync_db.fetchone("fact_insert", fact) == {"id": fact["id"]}
    listed = sync_db.fetchall("fact_list", {"entity_id": params["id"]})
    assert [f["id"] for f in listed] == [f["id"] for f in facts]
    assert listed[0]["metadata"] == {"m": 1}


async def test_each_sync_statement_is_its_own_committed_transaction(
    db: StateDB, sync_db: SyncStatements
) -> None:
    """Each statement commits on its own: the async store reads it at once. It is stamped with
    the store's clock (PostgreSQL: the server's), one reading for every ``:now``, unless the
    caller gives ``now``."""
    before = await db.now()
    params = run_params()
    sync_db.execute("run_insert_if_new", params)
    after = await db.now()
    run = await db.fetchone("run_get", {"id": params["id"]})
    assert run is not None
    assert run["created_at"] == run["fired_at"] == run["queued_at"]
    assert before - 0.001 <= run["created_at"] <= after + 0.001
    given = run_params(now=42.0)
    sync_db.execute("run_insert_if_new", given)
    assert (await db.fetchone("run_get", {"id": given["id"]}) or {})["created_at"] == 42.0


def test_a_refused_sync_statement_is_a_store_error(sync_db: SyncStatements) -> None:
    """A statement the database refuses is ``StoreError`` (not ``StoreUnavailable``), as on
    the async store, and stores nothing."""
    params = run_params(action_args="{not json")
    with pytest.raises(StoreError) as caught:
        sync_db.execute("run_insert_if_new", params)
    assert not isinstance(caught.value, StoreUnavailable)
    assert sync_db.fetchone("run_get", {"id": params["id"]}) is None


def test_schema_version_is_the_newest_migration(sync_db: SyncStatements) -> None:
    """``schema_version``: the newest migration applied (the store was opened migrated)."""
    dialect = "sqlite" if sync_db.dialect == "sqlite" else "postgres"
    assert sync_db.schema_version() == len(load_migrations(dialect))


def test_a_closed_sync_store_refuses_calls(db_url: str) -> None:
    """``close()`` is safe to call twice; afterwards a statement is ``StoreError``, not
    ``StoreUnavailable`` (nothing to wait for)."""
    store = open_sync_db(db_url)
    store.fetchone("setting_get", {"name": "max_attempts"})
    store.close()
    store.close()
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        store.fetchone("setting_get", {"name": "max_attempts"})
    assert not isinstance(caught.value, StoreUnavailable)
    assert time.monotonic() - started < 2.0
