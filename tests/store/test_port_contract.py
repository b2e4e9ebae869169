"""The StateDB port's contract, one test per promise, on both dialects (issue 24, item 5).

As River's driver tests: every operation of ``store.port`` (``StateDB``, ``Tx``) is exercised
through named statements alone, on a fresh SQLite file and a fresh PostgreSQL schema (the
``db`` fixture). Each docstring states the promise, quoted from the port where it says it.
The rest of the port is in this package: guarded updates, ``auditing()`` and transition keys
(test_port_guarded.py), wake-ups (test_port_signals.py), the synchronous client's store
(test_port_sync.py).

Tested elsewhere, not repeated here: both dialects name the same statements
(tests/unit/test_queries.py), migrations are applied once and a second ``migrate`` is a no-op
(tests/migrations/test_migrations.py; ``taskward migrate`` twice: tests/acceptance/test_cli.py),
the append-only triggers against a raw connection (tests/migrations), an unreachable or refused
server is ``StoreUnavailable`` / ``StoreError`` (tests/migrations, tests/integration).
"""

from __future__ import annotations

import sqlite3
import time

import psycopg
import pytest

import taskward
from taskward.errors import StoreError, StoreUnavailable
from taskward.store.port import JSON_COLUMNS, StateDB
from tests.store.rows import ARGS, CAPABILITIES, event_params, fact_params, insert_run, run_params

# -- transaction(): all or nothing, one time ---------------------------------------------------


async def test_a_transaction_commits_every_statement_together(db: StateDB, db_url: str) -> None:
    """Every statement of a transaction that ends normally is committed: another store opened
    on the same URL reads them all."""
    async with db.transaction() as tx:
        run_id = await insert_run(tx)
        assert await tx.fetchone("fact_insert", fact_params(run_id)) is not None
        await tx.execute("setting_put", {"name": "probe", "value": "1"})
    async with taskward.open_db(db_url) as other:
        assert (await other.fetchone("run_get", {"id": run_id})) is not None
        assert len(await other.fetchall("fact_list", {"entity_id": run_id})) == 1
        assert await other.fetchone("setting_get", {"name": "probe"}) == {"value": "1"}


async def test_an_exception_inside_a_transaction_rolls_back_every_statement(db: StateDB) -> None:
    """An exception raised inside ``transaction()`` propagates, and none of the transaction's
    statements stays, whichever came first."""
    run_id = ""
    with pytest.raises(RuntimeError, match="caller"):
        async with db.transaction() as tx:
            run_id = await insert_run(tx)
            await tx.fetchone("fact_insert", fact_params(run_id))
            await tx.execute("setting_put", {"name": "probe", "value": "1"})
            raise RuntimeError("the caller changed its mind")
    assert await db.fetchone("run_get", {"id": run_id}) is None
    assert await db.fetchall("fact_list", {"entity_id": run_id}) == []
    assert await db.fetchone("setting_get", {"name": "probe"}) is None


async def test_a_failed_statement_rolls_back_the_statements_before_it(db: StateDB) -> None:
    """A statement the store refuses raises ``StoreError`` (not the driver's error) out of the
    transaction, which keeps none of its earlier writes."""
    run_id = ""
    with pytest.raises(StoreError) as caught:
        async with db.transaction() as tx:
            run_id = await insert_run(tx)
            event = event_params(run_id)
            await tx.execute("event_insert", event)
            await tx.execute("event_insert", event)  # the same primary key again
    assert not isinstance(caught.value, StoreUnavailable)  # a bug, not a store away: no retry
    assert await db.fetchone("run_get", {"id": run_id}) is None
    assert await db.fetchall("event_list", {"task_id": run_id}) == []


async def test_a_savepoint_rolls_back_only_its_own_writes(db: StateDB) -> None:
    """``Tx.savepoint()``: an exception inside rolls back only the scope's writes; the
    transaction's other statements commit."""
    async with db.transaction() as tx:
        kept = await insert_run(tx)
        with pytest.raises(RuntimeError):
            async with tx.savepoint():
                dropped = await insert_run(tx)
                raise RuntimeError("undo the scope")
        after = await insert_run(tx)
    assert await db.fetchone("run_get", {"id": dropped}) is None
    for run_id in (kept, after):
        assert await db.fetchone("run_get", {"id": run_id}) is not None


async def test_now_inside_a_transaction_is_the_injected_time(db: StateDB) -> None:
    """``transaction(now=t)``: ``tx.now`` is ``t``, and every statement of the transaction that
    takes ``:now`` is stamped with it (R9: time is injected, never read by the SQL)."""
    async with db.transaction(now=1_000.25) as tx:
        assert tx.now == 1_000.25
        run_id = await insert_run(tx)
        fact = await tx.fetchone("fact_insert", fact_params(run_id))
    run = await db.fetchone("run_get", {"id": run_id})
    assert run is not None and fact is not None
    assert (run["created_at"], run["fired_at"], run["queued_at"]) == (1_000.25,) * 3
    [stored] = await db.fetchall("fact_list", {"entity_id": run_id})
    assert stored["created_at"] == 1_000.25


async def test_now_of_a_transaction_is_the_store_clock_read_once(db: StateDB) -> None:
    """``transaction()`` without ``now``: ``tx.now`` is the store's clock (PostgreSQL: the
    server's) read once when the transaction starts, and every statement in it is stamped with
    that one reading, however long the transaction lasts (R9)."""
    before = time.time()
    async with db.transaction() as tx:
        began = tx.now
        first = await insert_run(tx)
        await db.now()  # time passes between the two statements
        second = await insert_run(tx)
    after = time.time()
    assert before - 0.5 <= began <= after + 0.5  # one host: the server's clock is ours
    for run_id in (first, second):
        run = await db.fetchone("run_get", {"id": run_id})
        assert run is not None and run["created_at"] == began


async def test_a_statement_alone_is_stamped_with_one_reading_of_the_store_clock(
    db: StateDB,
) -> None:
    """``StateDB.execute`` without ``now``: the statement is stamped with the store's clock
    (PostgreSQL: the server's, read by the statement itself), one reading for every ``:now`` of
    it; an explicit ``now`` is used as given."""
    before = await db.now()
    run_id = await insert_run(db)
    after = await db.now()
    run = await db.fetchone("run_get", {"id": run_id})
    assert run is not None
    assert run["created_at"] == run["fired_at"] == run["queued_at"]
    assert before - 0.001 <= run["created_at"] <= after + 0.001
    given = await insert_run(db, now=77.5)
    assert (await db.fetchone("run_get", {"id": given}) or {})["created_at"] == 77.5


async def test_now_is_the_store_clock(db: StateDB) -> None:
    """``StateDB.now()``: the store's clock (PostgreSQL's on PostgreSQL, the local clock on
    SQLite), in seconds since the epoch; it moves forward."""
    before = time.time()
    first = await db.now()
    second = await db.now()
    after = time.time()
    assert isinstance(first, float)
    assert before - 0.5 <= first <= second <= after + 0.5  # one host: one clock


# -- reads ---------------------------------------------------------------------------------------


async def test_fetchone_is_none_or_a_dict_with_its_json_columns_decoded(db: StateDB) -> None:
    """``fetchone``: None when the statement returns no row; else the first row as a dict keyed
    by column name, each column of ``JSON_COLUMNS`` decoded, every other column as stored (a
    text that looks like JSON stays text)."""
    assert await db.fetchone("run_get", {"id": "no-such-run"}) is None
    run_id = await insert_run(db)
    run = await db.fetchone("run_get", {"id": run_id})
    assert isinstance(run, dict)
    assert run["id"] == run_id and run["status"] == "queued"
    assert run["action_args"] == ARGS
    assert run["required_capabilities"] == CAPABILITIES
    assert run["trigger_context"] == {}
    assert {"action_args", "required_capabilities", "trigger_context"} <= JSON_COLUMNS
    await db.execute("setting_put", {"name": "probe", "value": "[1, 2]"})
    assert await db.fetchone("setting_get", {"name": "probe"}) == {"value": "[1, 2]"}


async def test_fetchall_is_every_row_in_the_statements_order(db: StateDB) -> None:
    """``fetchall``: every row the statement returns, in its order (``fact_list``: insertion
    order), as ``fetchone`` returns a row; an empty list when there is none."""
    run_id = await insert_run(db)
    assert await db.fetchall("fact_list", {"entity_id": run_id}) == []
    ids = []
    for status in ("running", "retry_wait", "queued"):
        params = fact_params(run_id, status=status)
        await db.fetchone("fact_insert", params)
        ids.append(params["id"])
    facts = await db.fetchall("fact_list", {"entity_id": run_id})
    assert [f["id"] for f in facts] == ids
    assert all(f["metadata"] == {"m": 1} and f["evidence_refs"] == ["ref:1"] for f in facts)


async def test_a_transaction_reads_its_own_writes(db: StateDB) -> None:
    """``Tx.fetchone`` / ``Tx.fetchall`` read inside the transaction: they see its uncommitted
    writes, decoded as ``StateDB``'s reads are."""
    async with db.transaction() as tx:
        run_id = await insert_run(tx)
        run = await tx.fetchone("run_get", {"id": run_id})
        assert run is not None and run["action_args"] == ARGS
        await tx.fetchone("fact_insert", fact_params(run_id))
        assert len(await tx.fetchall("fact_list", {"entity_id": run_id})) == 1


async def test_fetchone_each_runs_the_statement_once_per_parameter_set(db: StateDB) -> None:
    """``Tx.fetchone_each``: the named statement once per parameter set, each run's first row
    (None where it has none), in the order of the parameter sets."""
    first, second = await insert_run(db), await insert_run(db)
    async with db.transaction() as tx:
        rows = await tx.fetchone_each(
            "run_get", [{"id": second}, {"id": "no-such-run"}, {"id": first}]
        )
    assert [row and row["id"] for row in rows] == [second, None, first]
    assert rows[0] is not None and rows[0]["action_args"] == ARGS


async def test_fetch_batch_runs_statements_in_order(db: StateDB) -> None:
    """``Tx.fetch_batch`` / ``fetchall_batch``: several named statements run in order (a read
    sees the writes before it), answering each statement's first row (None when it returns
    none) or every row of each."""
    run_id = await insert_run(db)
    fact = fact_params(run_id)
    async with db.transaction() as tx:
        first = await tx.fetch_batch(
            [
                ("fact_list", {"entity_id": run_id}),
                ("event_insert", event_params(run_id)),  # returns no row
                ("fact_insert", fact),
                ("fact_list", {"entity_id": run_id}),
            ]
        )
        every = await tx.fetchall_batch(
            [
                ("fact_insert", fact_params(run_id)),
                ("fact_list", {"entity_id": run_id}),
                ("run_get", {"id": "no-such-run"}),
            ]
        )
    assert first[0] is None and first[1] is None
    assert first[2] == {"id": fact["id"]}
    assert first[3] is not None and first[3]["metadata"] == {"m": 1}
    assert [len(rows) for rows in every] == [1, 2, 0]


# -- execute: the row count ----------------------------------------------------------------------


async def test_execute_returns_the_rows_a_write_wrote(db: StateDB) -> None:
    """``StateDB.execute`` / ``Tx.execute``: the statement's row count, the rows an INSERT or
    UPDATE wrote (0 for an insert its ON CONFLICT skipped, or an update that matched none)."""
    params = run_params()
    assert await db.execute("run_insert_if_new", params) == 1
    assert await db.execute("run_insert_if_new", {**params, "id": "other"}) == 0  # key taken
    assert await db.execute("run_request_cancel", {"id": params["id"], "by": "op"}) == 0
    async with db.transaction() as tx:
        assert await tx.execute("setting_put", {"name": "probe", "value": "1"}) == 1
        assert await tx.execute("run_request_cancel", {"id": params["id"], "by": "op"}) == 0
        assert await tx.execute("session_revocations_purge") == 0
        await tx.execute("session_revoke", {"session_id": "s1", "expires_at": 0.0})
        await tx.execute("session_revoke", {"session_id": "s2", "expires_at": 0.0})
        assert await tx.execute("session_revocations_purge") == 2


async def test_execute_of_a_select_returns_the_rows_it_returned(db: StateDB) -> None:
    """``StateDB.execute`` of a SELECT: "the rows ... a SELECT returned", the rows themselves
    left unread."""
    await insert_run(db)
    await insert_run(db)
    assert await db.execute("run_list", _list_params()) == 2
    assert await db.execute("run_get", {"id": "no-such-run"}) == 0


def _list_params() -> dict[str, object]:
    return {
        "status": None,
        "action_kind": None,
        "execution_target": None,
        "cursor_created_at": None,
        "cursor_id": None,
        "limit": 10,
        "full_args": True,
        "args_inline_bytes": 1000,
        "args_head_chars": 100,
    }


# -- write_many ----------------------------------------------------------------------------------


async def test_write_many_writes_every_row_and_counts_per_statement(db: StateDB) -> None:
    """``Tx.write_many``: the statements in order, many rows each; per statement the rows it
    wrote (a row its ON CONFLICT skipped counts 0: each ``<name>_many`` keeps its one-row
    statement's semantics); a statement with no rows writes nothing and counts 0."""
    taken = run_params()
    await db.execute("run_insert_if_new", taken)
    runs = [
        run_params(),
        run_params(),
        {**run_params(), "idempotency_key": taken["idempotency_key"]},
    ]
    async with db.transaction(now=500.0) as tx:
        counts = await tx.write_many(
            [
                ("run_insert_many_if_new", runs),
                ("event_insert_many", []),
                (
                    "fact_insert_many",
                    [fact_params(runs[0]["id"]), fact_params(runs[1]["id"])],
                ),
            ]
        )
    assert counts == [2, 0, 2]
    for params in runs[:2]:
        run = await db.fetchone("run_get", {"id": params["id"]})
        assert run is not None and run["action_args"] == ARGS and run["created_at"] == 500.0
        [fact] = await db.fetchall("fact_list", {"entity_id": params["id"]})
        assert fact["metadata"] == {"m": 1} and fact["created_at"] == 500.0
    assert await db.fetchone("run_get", {"id": runs[2]["id"]}) is None


async def test_write_many_that_fails_leaves_no_row_of_any_statement(db: StateDB) -> None:
    """``Tx.write_many`` is all rows or none: when one row is refused (here a duplicate primary
    key in the second statement) it raises ``StoreError`` and, the transaction rolled back, no
    row of any of its statements stays."""
    runs = [run_params(), run_params()]
    event = event_params(runs[0]["id"])
    with pytest.raises(StoreError):
        async with db.transaction() as tx:
            await tx.write_many(
                [
                    ("run_insert_many_if_new", runs),
                    ("event_insert_many", [event, event_params(runs[1]["id"]), event]),
                ]
            )
    for params in runs:
        assert await db.fetchone("run_get", {"id": params["id"]}) is None
        assert await db.fetchall("event_list", {"task_id": params["id"]}) == []


# -- errors at the boundary ----------------------------------------------------------------------


async def test_a_refused_statement_is_a_store_error_with_the_drivers_cause(db: StateDB) -> None:
    """Driver errors are translated at the port: a statement the database refuses (action
    arguments that are not JSON) raises ``StoreError`` (not ``StoreUnavailable``: nothing to
    wait for) whose ``__cause__`` is the driver's error, and stores nothing."""
    params = run_params(action_args="{not json")
    with pytest.raises(StoreError) as caught:
        await db.execute("run_insert_if_new", params)
    assert not isinstance(caught.value, StoreUnavailable)
    assert isinstance(caught.value.__cause__, sqlite3.Error | psycopg.Error)
    assert await db.fetchone("run_get", {"id": params["id"]}) is None


async def test_facts_refuse_update_and_delete_through_the_port(db: StateDB) -> None:
    """``status_transitions`` is append-only (ADR-0072 D3) on both dialects: the named UPDATE
    and DELETE of a fact (the checker's probes) raise ``StoreError``, and the fact is
    unchanged."""
    run_id = await insert_run(db)
    fact = fact_params(run_id)
    await db.fetchone("fact_insert", fact)
    for name in ("check_fact_probe_update", "check_fact_probe_delete"):
        with pytest.raises(StoreError, match="append-only"):
            await db.execute(name, {"id": fact["id"]})
        async with db.transaction() as tx:
            with pytest.raises(StoreError, match="append-only"):
                async with tx.savepoint():
                    await tx.execute(name, {"id": fact["id"]})
    [stored] = await db.fetchall("fact_list", {"entity_id": run_id})
    assert stored["id"] == fact["id"] and stored["reason_summary"] == ""


async def test_a_closed_store_refuses_every_operation(db_url: str) -> None:
    """After ``close()`` (safe to call twice) every operation raises ``StoreError``, not
    ``StoreUnavailable``: a closed store will not come back, so no retry loop may wait for
    it (``store.retry`` retries only ``StoreUnavailable``). (``now()`` is left out: SQLite's
    is the local clock, which needs no store.)"""
    store = await taskward.open_db(db_url)
    await store.close()
    await store.close()
    calls = {
        "execute": lambda: store.execute("setting_put", {"name": "probe", "value": "1"}),
        "fetchone": lambda: store.fetchone("setting_get", {"name": "max_attempts"}),
        "fetchall": lambda: store.fetchall("run_count_by_status"),
        "migrate": store.migrate,
    }
    for what, call in calls.items():
        try:
            await call()
        except StoreError as exc:
            assert not isinstance(exc, StoreUnavailable), what
        else:
            pytest.fail(f"{what} answered on a closed store")
    with pytest.raises(StoreError) as caught:
        async with store.transaction():
            pass
    assert not isinstance(caught.value, StoreUnavailable)


async def test_the_store_names_its_dialect_and_url(db: StateDB, db_url: str) -> None:
    """``dialect``, ``url`` and ``supports_listen_notify``: what the store is, so the one
    documented difference (LISTEN/NOTIFY on PostgreSQL, polling on SQLite) can be told."""
    assert db.url == db_url
    assert (db.dialect, db.supports_listen_notify, db.concurrent_writers) in {
        ("sqlite", False, False),
        ("postgresql", True, True),
    }
    assert db.dialect == ("sqlite" if db_url.startswith("sqlite") else "postgresql")
