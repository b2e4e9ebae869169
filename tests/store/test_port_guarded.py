"""The port's guarded updates, transition keys and ``auditing()``, on both dialects.

``Tx.run_update_if`` / ``Tx.run_update_many`` are the compare-and-swap every status change goes
through (R3); a second running row of a serialization key is ``ConcurrencyKeyBusy`` (R7); a
transition key already holding a fact inserts nothing, or, in PostgreSQL's one-statement
batches, raises ``KeyAlreadyUsed`` (ADR-0072 D3). ``auditing()`` is the one documented
difference: None on SQLite, an ``AuditingTx`` on PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest

from taskward.ids import new_id
from taskward.store.port import (
    AuditingTx,
    ConcurrencyKeyBusy,
    KeyAlreadyUsed,
    StateDB,
    Tx,
)
from tests.store.rows import fact_params, insert_run, lease

NOW = 1_000.0


async def _run(db: StateDB, run_id: str) -> dict[str, Any]:
    row = await db.fetchone("run_get", {"id": run_id})
    assert row is not None
    return row


async def _leased(db: StateDB, worker: str = "w1", **changes: Any) -> str:
    """A run taken by ``worker`` (through the port's own compare-and-swap)."""
    run_id = await insert_run(db, **changes)
    async with db.transaction(now=NOW) as tx:
        taken = await tx.run_update_if(run_id, "queued", lease(worker, NOW + 30), {})
    assert taken == {"id": run_id}
    return run_id


# -- run_update_if -------------------------------------------------------------------------------


async def test_run_update_if_applies_only_when_status_and_every_guard_match(db: StateDB) -> None:
    """``run_update_if``: sets ``values`` where the id, the status and every guard column
    match; a None guard means IS NULL. A miss on any one of them changes nothing and returns
    None; a match returns the ``returning`` columns of the updated row (JSON decoded)."""
    run_id = await _leased(db)
    before = await _run(db, run_id)
    done = {
        "status": "completed",
        "updated_at": NOW + 1,
        "ended_at": NOW + 1,
        "status_evidence_refs": '["log:1"]',
    }
    guard = {"leased_by": "w1", "lease_attempts": 1, "lease_expires_at": NOW + 30}
    misses: list[tuple[str, str, dict[str, Any]]] = [
        ("no-such-run", "running", guard),
        (run_id, "queued", guard),  # the status
        (run_id, "running", {**guard, "leased_by": "w2"}),  # one guard column
        (run_id, "running", {**guard, "lease_attempts": 2}),
        (run_id, "running", {**guard, "leased_by": None}),  # None: IS NULL, and it is set
        (run_id, "running", {**guard, "cancel_requested_at": 5.0}),  # NULL is no value
    ]
    async with db.transaction(now=NOW + 1) as tx:
        for target, status, attempt in misses:
            assert await tx.run_update_if(target, status, done, attempt) is None, attempt
    assert await _run(db, run_id) == before
    async with db.transaction(now=NOW + 1) as tx:
        row = await tx.run_update_if(
            run_id,
            "running",
            done,
            {**guard, "cancel_requested_at": None},
            returning=("id", "status", "status_evidence_refs", "lease_attempts"),
        )
    assert row == {
        "id": run_id,
        "status": "completed",
        "status_evidence_refs": ["log:1"],
        "lease_attempts": 1,
    }
    after = await _run(db, run_id)
    assert (after["status"], after["ended_at"], after["leased_by"]) == ("completed", NOW + 1, "w1")


async def test_run_update_if_refuses_columns_outside_the_allowlist(db: StateDB) -> None:
    """Columns come only from the allowlists (``RUN_PATCH_COLUMNS``, ``RUN_GUARD_COLUMNS``):
    any other set, guarded or returned column is a ValueError before any SQL, and the row is
    unchanged."""
    run_id = await insert_run(db)
    before = await _run(db, run_id)
    attempts: list[tuple[dict[str, Any], dict[str, Any], tuple[str, ...]]] = [
        ({"action_args": "{}"}, {}, ()),
        ({"status": "running"}, {"status": "queued"}, ()),
        ({"status": "running"}, {}, ("action_args; DROP TABLE schedule_runs",)),
    ]
    async with db.transaction() as tx:
        for values, guard, returning in attempts:
            with pytest.raises(ValueError, match="allowlist"):
                await tx.run_update_if(run_id, "queued", values, guard, returning)
            with pytest.raises(ValueError, match="allowlist"):
                await tx.run_update_many([(run_id, "queued", values, guard)], returning)
    assert await _run(db, run_id) == before


# -- run_update_many -----------------------------------------------------------------------------


async def test_run_update_many_matches_each_run_on_its_own_guard(db: StateDB) -> None:
    """``run_update_many``: one compare-and-swap per item, each matched on its own id, status
    and guard values; returns ``id`` and the ``returning`` columns of the rows that matched
    (in no particular order) and leaves the others as they were."""
    runs = [await insert_run(db) for _ in range(5)]
    async with db.transaction(now=NOW) as tx:
        assert await tx.run_update_if(runs[2], "queued", lease("w0", NOW + 5), {})
        items = [
            (
                run_id,
                "queued",
                lease(f"w{k}", NOW + 30 + k),
                {"leased_by": None, "lease_attempts": 0},
            )
            for k, run_id in enumerate(runs)
        ]
        # runs[2] is leased by w0 now; runs[3] is not in retry_wait; runs[4] has no attempt 7
        items[3] = (runs[3], "retry_wait", *items[3][2:])
        items[4] = (runs[4], "queued", items[4][2], {"leased_by": None, "lease_attempts": 7})
        rows = await tx.run_update_many(items, returning=("leased_by", "lease_expires_at"))
    by_id = {row["id"]: row for row in rows}
    assert set(by_id) == {runs[0], runs[1]}
    assert by_id[runs[1]] == {"id": runs[1], "leased_by": "w1", "lease_expires_at": NOW + 31}
    assert (await _run(db, runs[2]))["leased_by"] == "w0"
    for run_id in runs[3:]:
        assert (await _run(db, run_id))["status"] == "queued"
    async with db.transaction(now=NOW) as tx:
        assert await tx.run_update_many([items[0]]) == []  # already taken: nothing matches


async def test_run_update_many_refuses_mixed_shapes_and_repeated_runs(db: StateDB) -> None:
    """The items of one ``run_update_many`` share one ``update_shape`` and name distinct
    runs: otherwise a ValueError before any SQL."""
    first, second = await insert_run(db), await insert_run(db)
    async with db.transaction(now=NOW) as tx:
        with pytest.raises(ValueError, match="shapes"):
            await tx.run_update_many(
                [
                    (first, "queued", lease("w1", NOW), {"leased_by": None}),
                    (second, "queued", lease("w1", NOW), {}),
                ]
            )
        with pytest.raises(ValueError, match="twice"):
            await tx.run_update_many(
                [(first, "queued", lease("w1", NOW), {}), (first, "queued", lease("w2", NOW), {})]
            )
    assert (await _run(db, first))["status"] == (await _run(db, second))["status"] == "queued"


# -- ConcurrencyKeyBusy (R7) ---------------------------------------------------------------------


@pytest.mark.parametrize("many", [False, True], ids=["run_update_if", "run_update_many"])
async def test_a_second_running_row_of_a_key_is_concurrency_key_busy(
    db: StateDB, many: bool
) -> None:
    """A guarded update that would make a second row of one serialization key ``running``
    raises ``ConcurrencyKeyBusy`` (the unique index refuses it, R7); the transaction rolls back
    and the row stays queued. Another key is unaffected."""
    await _leased(db, concurrency_key="k1")
    waiting = await insert_run(db, concurrency_key="k1")
    other = await insert_run(db, concurrency_key="k2")

    async def take(tx: Tx, run_id: str) -> object:
        values = lease("w2", NOW + 40)
        if many:
            return await tx.run_update_many([(run_id, "queued", values, {"leased_by": None})])
        return await tx.run_update_if(run_id, "queued", values, {"leased_by": None})

    with pytest.raises(ConcurrencyKeyBusy):
        async with db.transaction(now=NOW) as tx:
            await tx.execute("setting_put", {"name": "probe", "value": "1"})
            await take(tx, waiting)
    assert (await _run(db, waiting))["status"] == "queued"
    assert await db.fetchone("setting_get", {"name": "probe"}) is None
    async with db.transaction(now=NOW) as tx:
        assert await take(tx, other)
    assert (await _run(db, other))["status"] == "running"


# -- transition keys (ADR-0072 D3) ---------------------------------------------------------------


async def test_a_taken_transition_key_inserts_no_fact(db: StateDB) -> None:
    """A fact whose ``(entity_id, idempotency_key)`` already has one inserts nothing:
    ``fact_insert`` returns no row and ``fact_insert_many`` counts it 0 (the caller rolls back
    and replays, R3). The same key on another run is free."""
    run_id, other = await insert_run(db), await insert_run(db)
    first = fact_params(run_id, idempotency_key="claim:1")
    assert await db.fetchone("fact_insert", first) == {"id": first["id"]}
    assert await db.fetchone("fact_insert", fact_params(run_id, idempotency_key="claim:1")) is None
    async with db.transaction() as tx:
        counts = await tx.write_many(
            [
                (
                    "fact_insert_many",
                    [
                        fact_params(run_id, idempotency_key="claim:1"),
                        fact_params(other, idempotency_key="claim:1"),
                    ],
                )
            ]
        )
    assert counts == [1]
    [kept] = await db.fetchall("fact_list", {"entity_id": run_id})
    assert kept["id"] == first["id"]
    assert len(await db.fetchall("fact_list", {"entity_id": other})) == 1


def _finish_params(run_id: str, *, worker: str = "w1") -> dict[str, Any]:
    """``AuditingTx.finish_running``'s parameters for one run finishing ``completed`` under
    ``worker``'s first lease, its transition key ``finish:1`` (``key_head`` + attempt)."""
    return {
        "from_state": "running",
        "to_state": "completed",
        "reason_code": "exit_zero",
        "summary": "",
        "worker_id": worker,
        "entity_type": "schedule_run",
        "source": "worker",
        "actor": f"worker:{worker}",
        "metadata": "{}",
        "key_head": "finish:",
        "key_tail": "",
        **{f"hash_{k}": f"part{k}" for k in range(4)},
        "ids": [run_id],
        "attempts": [1],
        "exit_codes": [0],
        "evidence": ["[]"],
        "fact_ids": [new_id()],
        "event_ids": [new_id()],
        "outbox_ids": [new_id()],
        "results": [None],  # R22: no return value stored
        "outbox_max_attempts": 10,
        "outbox_ttl_s": 604800.0,
    }


async def test_auditing_is_none_on_sqlite_and_an_auditing_tx_on_postgres(db: StateDB) -> None:
    """``Tx.auditing()``: None where the store cannot write a group's facts, events and
    notifications inside its compare-and-swap (SQLite: ``transitions`` writes them with
    ``write_many``), the transaction itself as an ``AuditingTx`` where it can (PostgreSQL)."""
    async with db.transaction() as tx:
        auditing = tx.auditing()
        if db.dialect == "sqlite":
            assert auditing is None
        else:
            assert auditing is tx
            for method in ("finish_running", "claim_queued", "together"):
                assert callable(getattr(auditing, method))


async def _auditing(db: StateDB, tx: Tx) -> AuditingTx:
    auditing = tx.auditing()
    if auditing is None:
        assert db.dialect == "sqlite"
        pytest.skip("SQLite has no AuditingTx (auditing() is None: tested above)")
    return auditing


async def test_a_taken_transition_key_in_a_one_statement_finish_is_key_already_used(
    db: StateDB,
) -> None:
    """``finish_running`` (PostgreSQL) writes each row's compare-and-swap, fact, event and
    notification in one statement; a taken transition key raises ``KeyAlreadyUsed`` and,
    the transaction rolled back, nothing of the statement stays."""
    finished, blocked = await _leased(db), await _leased(db)
    async with db.transaction(now=NOW + 1) as tx:
        auditing = await _auditing(db, tx)
        rows = await auditing.finish_running(_finish_params(finished))
    assert [(row["id"], row["fact_written"]) for row in rows] == [(finished, True)]
    assert (await _run(db, finished))["status"] == "completed"
    [fact] = await db.fetchall("fact_list", {"entity_id": finished})
    assert fact["idempotency_key"] == "finish:1"

    await db.fetchone("fact_insert", fact_params(blocked, idempotency_key="finish:1"))
    params = _finish_params(blocked)
    with pytest.raises(KeyAlreadyUsed):
        async with db.transaction(now=NOW + 1) as tx:
            await (await _auditing(db, tx)).finish_running(params)
    assert (await _run(db, blocked))["status"] == "running"
    assert len(await db.fetchall("fact_list", {"entity_id": blocked})) == 1
    assert await db.fetchall("event_list", {"task_id": blocked}) == []
    assert await db.fetchone("outbox_get", {"id": params["outbox_ids"][0]}) is None
