"""PostgreSQL's hot connection: calls that follow one another reuse one pool connection,
concurrent calls take others from the pool, and a connection left in doubt (an error, a
cancellation, a terminated backend) goes back to the pool instead of serving the next call."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from taskward.errors import StoreUnavailable
from taskward.store.port import StateDB
from tests.conftest import PG_URL

pytestmark = pytest.mark.usefixtures("db")


@pytest.fixture
def pg(db: StateDB) -> StateDB:
    if db.dialect != "postgresql":
        pytest.skip("the hot connection is PostgreSQL's")
    return db


async def backend_pid(db: StateDB) -> int:
    async with db.connection() as conn:  # type: ignore[attr-defined]
        row = await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone()
    return int(row["pid"])


async def test_calls_in_sequence_share_one_connection_and_concurrent_ones_do_not(
    pg: StateDB,
) -> None:
    first = await backend_pid(pg)
    assert await backend_pid(pg) == first
    await pg.fetchall("run_status", {"id": "nothing"})
    assert await backend_pid(pg) == first
    async with pg.connection() as held:  # type: ignore[attr-defined]
        mine = await (await held.execute("SELECT pg_backend_pid() AS pid")).fetchone()
        assert mine["pid"] == first
        assert await backend_pid(pg) != first  # the hot one is busy: the pool serves
    assert await backend_pid(pg) == first


async def test_an_error_in_a_transaction_leaves_no_transaction_open_for_the_next_call(
    pg: StateDB,
) -> None:
    with pytest.raises(RuntimeError):
        async with pg.transaction() as tx:
            await tx.fetchall("run_status", {"id": "nothing"})
            raise RuntimeError("the caller's own error, mid-transaction")
    async with pg.connection() as conn:  # type: ignore[attr-defined]
        assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert await pg.fetchall("run_status", {"id": "nothing"}) == []


async def test_a_cancelled_statement_does_not_poison_the_next_call(pg: StateDB) -> None:
    async def slow() -> None:
        async with pg.connection() as conn:  # type: ignore[attr-defined]
            await conn.execute("SELECT pg_sleep(30)")

    job = asyncio.ensure_future(slow())
    await asyncio.sleep(0.2)
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    started = asyncio.get_running_loop().time()
    assert await pg.fetchall("run_status", {"id": "nothing"}) == []
    assert asyncio.get_running_loop().time() - started < 5


async def test_a_terminated_hot_backend_fails_one_call_and_is_replaced(pg: StateDB) -> None:
    victim = await backend_pid(pg)
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (victim,))
    with pytest.raises(StoreUnavailable):
        await pg.fetchall("run_status", {"id": "nothing"})
    replacement = await backend_pid(pg)
    assert replacement != victim
    assert await backend_pid(pg) == replacement


async def test_a_transactions_notifications_go_out_with_its_commit_and_not_before(
    pg: StateDB,
) -> None:
    """The NOTIFYs travel with the COMMIT (one round trip): a listener hears every channel the
    transaction named once it commits, and nothing from one that rolled back.

    Channels are the database's, not a schema's: other tests' stores (pytest-xdist workers on
    the same database) notify them too, so only this store's backends are heard (``pid``)."""

    async def pid_of(tx: Any) -> int:
        cursor = await tx._conn.execute("SELECT pg_backend_pid() AS pid")
        return int((await cursor.fetchone())["pid"])

    pids: set[int] = set()
    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as listener:
        await listener.execute("LISTEN taskward_queued")
        await listener.execute("LISTEN taskward_cancel")
        with pytest.raises(RuntimeError):
            async with pg.transaction() as tx:
                pids.add(await pid_of(tx))
                tx.notify("queued")
                raise RuntimeError("rolled back")
        async with pg.transaction() as tx:
            pids.add(await pid_of(tx))
            tx.notify("cancel")
        async with pg.transaction() as tx:
            pids.add(await pid_of(tx))
            tx.notify("queued")
            tx.notify("cancel")
            tx.notify("queued")
        heard: list[str] = []
        async with asyncio.timeout(10):
            async for note in listener.notifies():
                if note.pid in pids:
                    heard.append(note.channel)
                if len(heard) == 3:
                    break
        # In commit order; the rolled-back transaction's would have come first.
        assert heard[0] == "taskward_cancel"
        assert sorted(heard[1:]) == ["taskward_cancel", "taskward_queued"]
    async with pg.transaction() as tx:
        with pytest.raises(ValueError, match="unknown channel"):
            tx.notify("queued; DROP TABLE schedule_runs")


async def test_json_columns_read_back_as_fresh_python_values_whatever_their_text(
    pg: StateDB,
) -> None:
    """The connections' own JSON loader: empty documents are new objects each time (a caller
    may mutate what it read), and non-ASCII text and nesting survive."""
    async with pg.connection() as conn:  # type: ignore[attr-defined]
        cur = await conn.execute(
            "SELECT '{}'::jsonb AS a, '{}'::jsonb AS b, '[]'::jsonb AS c, 'null'::jsonb AS d,"
            ' \'{"k": [1, 2.5, "\u00e9\u6f22\\n"], "n": {"t": true}}\'::jsonb AS e,'
            " '[ ]'::json AS f"
        )
        row = await cur.fetchone()
    assert row["a"] == {} and row["b"] == {} and row["a"] is not row["b"]
    row["a"]["mutated"] = True
    assert row["b"] == {}
    assert row["c"] == [] and row["d"] is None and row["f"] == []
    assert row["e"] == {"k": [1, 2.5, "\u00e9\u6f22\n"], "n": {"t": True}}


@pytest.mark.parametrize(
    ("pg_type", "values"),
    [
        ("text", ["a", None, '\u00e9\u6f22 "quoted" {braces}, commas', ""]),
        ("text", []),
        ("text", [None, None]),
        ("text", ["done", "done", None, "done", "é", "é", "", "", "x"]),  # runs are reused
        ("jsonb", ['{"k": [1, 2]}', None, "[]"]),
        ("integer", [0, -1, 2**31 - 1, -(2**31), None, 3.0]),
        ("float8", [1.5, None, 2, -0.0, 1e308, 1763000000.123456]),
        # One value in every row: one element repeated (pgarrays._repeated)
        ("text", ["completed"] * 5),
        ("text", ["\u00e9\u6f22", "\u00e9\u6f22"]),
        ("jsonb", ['{"k": 1}'] * 3),
        ("integer", [1, 1.0, True, 1]),
        ("float8", [1763000000.5] * 4),
        ("float8", [None, None, None]),
    ],
)
async def test_binary_arrays_built_by_taskward_read_back_exactly_as_sent(
    pg: StateDB, pg_type: str, values: list[object]
) -> None:
    """store.pgarrays builds the binary array format itself; the server must read every
    element back as sent (NULLs, non-ASCII text, empty arrays, int4 limits, floats)."""
    from taskward.store.pgarrays import pg_array

    async with pg.connection() as conn:  # type: ignore[attr-defined]
        cur = await conn.execute(f"SELECT %b::{pg_type}[] AS a", (pg_array(pg_type, values),))
        row = await cur.fetchone()
    expected: list[object] = [
        None
        if v is None
        else int(v)
        if pg_type == "integer"
        else float(v)
        if pg_type == "float8"
        else v
        for v in values
    ]
    if pg_type == "jsonb":
        import json

        expected = [None if v is None else json.loads(str(v)) for v in values]
    assert row["a"] == expected


async def test_an_integer_beyond_int4_is_refused_before_it_is_sent() -> None:
    import struct

    from taskward.store.pgarrays import pg_array

    with pytest.raises(struct.error):
        pg_array("integer", [2**31])
    with pytest.raises(ValueError, match="no binary array encoding"):
        pg_array("bytea", [b""])


async def test_transactions_find_rows_by_key_even_on_a_table_never_analyzed(pg: StateDB) -> None:
    """A table filled moments ago has no statistics. Inside taskward's transactions the claim's
    set-based compare-and-swap still finds its rows through the primary key: before BEGIN
    carried ``enable_seqscan = off``, the planner nested the arrays under a scan of the whole
    table (28-44 ms a claim of 20 among 3,000 fresh rows), and JIT must stay off beside it."""
    from taskward import AdapterConfig, build_registry
    from taskward.admission import submit_tasks
    from taskward.models import TaskApplication
    from taskward.store.guarded import build_run_update_many
    from taskward.store.queries import to_pyformat

    registry = build_registry(AdapterConfig(command_allowlist=frozenset({"true"})))
    apps = [
        TaskApplication(
            action_kind="command",
            args={"argv": ["true"]},
            execution_target="host",
            idempotency_key=f"k{i}",
        )
        for i in range(3000)
    ]
    ids: list[str] = []
    for offset in range(0, len(apps), 1000):
        ids += await submit_tasks(pg, apps[offset : offset + 1000], registry=registry)
    items = [
        (
            run_id,
            "queued",
            {"status": "running", "updated_at": 1.0, "leased_by": "w", "lease_attempts": 1},
            {"leased_by": None, "lease_attempts": 0, "cancel_requested_at": None},
        )
        for run_id in ids[:20]
    ]
    sql, params = build_run_update_many(items, ("*",), dialect="postgresql")
    async with pg.transaction() as tx:
        conn = tx._conn  # type: ignore[attr-defined]
        settings = await (
            await conn.execute(
                "SELECT current_setting('enable_seqscan') AS s, current_setting('jit') AS j"
            )
        ).fetchone()
        assert (settings["s"], settings["j"]) == ("off", "off")
        plan = await (await conn.execute("EXPLAIN " + to_pyformat(sql), params)).fetchall()
    text = "\n".join(row["QUERY PLAN"] for row in plan)
    assert "Seq Scan on schedule_runs" not in text, text
    assert "schedule_runs_pkey" in text, text
    async with pg.connection() as conn:  # type: ignore[attr-defined]
        outside = await (await conn.execute("SHOW enable_seqscan")).fetchone()
    assert outside["enable_seqscan"] == "on"  # SET LOCAL: the transaction's alone
