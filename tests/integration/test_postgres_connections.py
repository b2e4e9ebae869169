"""PostgreSQL's hot connection: calls that follow one another reuse one pool connection,
concurrent calls take others from the pool, and a connection left in doubt (an error, a
cancellation, a terminated backend) goes back to the pool instead of serving the next call."""

from __future__ import annotations

import asyncio

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
    transaction named once it commits, and nothing from one that rolled back."""
    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as listener:
        await listener.execute("LISTEN taskward_queued")
        await listener.execute("LISTEN taskward_cancel")
        with pytest.raises(RuntimeError):
            async with pg.transaction() as tx:
                tx.notify("queued")
                raise RuntimeError("rolled back")
        async with pg.transaction() as tx:
            tx.notify("cancel")
        async with pg.transaction() as tx:
            tx.notify("queued")
            tx.notify("cancel")
            tx.notify("queued")
        heard: list[str] = []
        async with asyncio.timeout(10):
            async for note in listener.notifies():
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
