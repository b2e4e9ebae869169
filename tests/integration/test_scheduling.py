"""The scheduling vocabulary (DESIGN.md R15-R18, R20) on both backends: the fields admission
stores and hashes, delayed runs, priority, the row's own attempt ceiling, limits and pauses.

Time is injected (``now=``); nothing sleeps.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

import taskward
from taskward import TaskApplication, TaskIdempotencyConflict, TaskValidationError
from taskward.admission import application_hash_of, validate_application
from taskward.canonical import content_hash
from taskward.claims import WorkerSpec, claim_rows
from taskward.limits import clear_limit, list_limits, pause_kind, resume_kind, set_limit
from taskward.maintenance.reaper import reap_expired_leases
from taskward.placement import placement_reason
from taskward.settings import set_max_attempts
from taskward.store.port import StateDB
from tests.integration.helpers import REGISTRY, submit

T0 = 1_800_000_000.0


def spec(worker_id: str = "host:sched01", **changes: Any) -> WorkerSpec:
    fields: dict[str, Any] = {"worker_id": worker_id, "kinds": ("command",), "lease_ttl": 60.0}
    fields.update(changes)
    return WorkerSpec(**fields)


async def claim_ids(db: StateDB, *, now: float, limit: int = 20, worker: str = "w1") -> list[str]:
    claimed = await claim_rows(db, spec(f"host:{worker}"), limit=limit, now=now)
    return [c.lease.task_id for c in claimed]


def app(**changes: Any) -> TaskApplication:
    fields: dict[str, Any] = {
        "action_kind": "command",
        "args": {"argv": ["true"]},
        "execution_target": "host",
        "idempotency_key": f"k-{uuid.uuid4()}",
    }
    fields.update(changes)
    return TaskApplication(**fields)


# R15: the fields and their hash --------------------------------------------------------------


def test_an_application_at_every_default_hashes_exactly_as_adr_0072_d2_says() -> None:
    admitted = validate_application(app(idempotency_key="k"), REGISTRY)
    d2 = {
        "action_kind": "command",
        "args": {"argv": ["true"]},
        "execution_target": "host",
        "required_capabilities": [],
        "library_ref": None,
        "library_content_hash": None,
    }
    assert admitted.application_hash == content_hash(d2)


def test_each_non_default_field_joins_the_hash_under_its_own_name() -> None:
    fields = {"run_after": T0 + 0.5, "priority": -7, "max_attempts": 5, "limit_key": "tenant:a"}
    admitted = validate_application(app(idempotency_key="k", **fields), REGISTRY)
    canonical = {
        "action_kind": "command",
        "args": {"argv": ["true"]},
        "execution_target": "host",
        "required_capabilities": [],
        "library_ref": None,
        "library_content_hash": None,
        **fields,
    }
    assert admitted.application_hash == content_hash(canonical)
    for name, value in fields.items():
        alone = validate_application(app(idempotency_key="k", **{name: value}), REGISTRY)
        assert alone.application_hash == application_hash_of(
            "command", '{"argv":["true"]}', "host", [], None, None, **{name: value}
        )
        assert alone.application_hash != content_hash({**canonical} | dict.fromkeys(fields))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("priority", 101),
        ("priority", -101),
        ("priority", True),
        ("priority", 1.5),
        ("priority", "1"),
        ("max_attempts", 0),
        ("max_attempts", 101),
        ("max_attempts", False),
        ("max_attempts", 2.0),
        ("run_after", -1),
        ("run_after", float("nan")),
        ("run_after", float("inf")),
        ("run_after", "2026-01-01"),
        ("run_after", True),
        ("limit_key", ""),
        ("limit_key", "kind:command"),
        ("limit_key", " tenant"),
        ("limit_key", "a\nb"),
        ("limit_key", "x" * 256),
        ("limit_key", 7),
    ],
)
async def test_a_bad_scheduling_field_is_refused_by_name_and_nothing_is_stored(
    db: StateDB, field: str, value: object
) -> None:
    with pytest.raises(TaskValidationError) as caught:
        await taskward.submit_task(db, app(**{field: value}), registry=REGISTRY)
    assert caught.value.field == field
    assert field in str(caught.value)
    page, _ = await taskward.list_tasks(db)
    assert page == []


async def test_the_same_key_with_another_priority_is_a_conflict(db: StateDB) -> None:
    first = await taskward.submit_task(db, app(idempotency_key="k1", priority=5), registry=REGISTRY)
    again = await taskward.submit_task(db, app(idempotency_key="k1", priority=5), registry=REGISTRY)
    assert again == first
    with pytest.raises(TaskIdempotencyConflict):
        await taskward.submit_task(db, app(idempotency_key="k1", priority=6), registry=REGISTRY)
    with pytest.raises(TaskIdempotencyConflict):
        await taskward.submit_task(db, app(idempotency_key="k1"), registry=REGISTRY)


async def test_the_fields_are_stored_in_their_columns_by_both_admission_paths(
    db: StateDB,
) -> None:
    fields = {"run_after": T0 + 60, "priority": 9, "max_attempts": 4, "limit_key": "tenant:a"}
    one = await taskward.submit_task(db, app(**fields), registry=REGISTRY, now=T0)
    [many] = await taskward.submit_tasks(db, [app(**fields)], registry=REGISTRY, now=T0)
    for task_id in (one, many):
        row = await taskward.get_task(db, task_id)
        assert {k: row[k] for k in fields} == fields
        assert row["claim_rank"] == -9
        assert row["queued_at"] == T0 + 60  # R16
        assert row["created_at"] == row["fired_at"] == T0


# R16: delayed runs ---------------------------------------------------------------------------


async def test_a_delayed_task_is_queued_but_claimed_only_once_due(db: StateDB) -> None:
    task_id = await submit(db, run_after=T0 + 30, now=T0)
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "queued" and row["run_after"] == T0 + 30
    assert await claim_ids(db, now=T0 + 29.999) == []
    reason = await placement_reason(db, task_id, now=T0 + 10)
    assert not reason["claimable"] and reason["reason"].startswith("delayed: runs at ")
    assert await claim_ids(db, now=T0 + 30) == [task_id]


async def test_a_run_after_in_the_past_starts_as_any_other_row(db: StateDB) -> None:
    task_id = await submit(db, run_after=T0 - 100, now=T0)
    row = await taskward.get_task(db, task_id)
    assert row["queued_at"] == T0 and row["run_after"] == T0 - 100
    assert await claim_ids(db, now=T0) == [task_id]


async def test_six_thousand_future_rows_ahead_of_a_due_one_do_not_delay_it(db: StateDB) -> None:
    """A delayed row never fills a claim pass (R16): 6,000 rows due later, of a higher priority
    (so they come first in the claim index), stand before one due row."""
    later = [app(run_after=T0 + 3600, priority=50) for _ in range(6000)]
    await taskward.submit_tasks(db, later, registry=REGISTRY, now=T0)
    due = await submit(db, now=T0 + 1)
    assert await claim_ids(db, now=T0 + 2) == [due]


# R17: priority -------------------------------------------------------------------------------


async def test_claims_take_higher_priorities_first_then_the_oldest(db: StateDB) -> None:
    low = await submit(db, priority=-5, now=T0)
    plain_old = await submit(db, now=T0 + 1)
    high = await submit(db, priority=10, now=T0 + 2)
    plain_new = await submit(db, now=T0 + 3)
    top = await submit(db, priority=100, now=T0 + 4)
    order = [(await claim_ids(db, now=T0 + 10, limit=1))[0] for _ in range(5)]
    assert order == [top, high, plain_old, plain_new, low]


async def test_the_keyset_cursor_crosses_priorities_without_skipping_or_repeating(
    db: StateDB,
) -> None:
    """Pages of rows this worker cannot serve (another target) force the pass through several
    keyset pages across priority bands; the one row it can serve is found."""
    blockers = [app(execution_target="daytona", priority=p) for p in (3, 2, 1) for _ in range(60)]
    await taskward.submit_tasks(db, blockers, registry=REGISTRY, now=T0)
    wanted = await submit(db, priority=1, now=T0 + 1)
    rest = await submit(db, priority=0, now=T0 + 1)
    assert await claim_ids(db, now=T0 + 2, limit=2) == [wanted, rest]


# R18: the row's own ceiling ------------------------------------------------------------------


async def test_the_effective_ceiling_is_stored_at_admission(db: StateDB) -> None:
    default = await submit(db)
    own = await submit(db, max_attempts=7)
    await set_max_attempts(db, 5)
    later = await submit(db)
    ceilings = [(await taskward.get_task(db, t))["max_attempts"] for t in (default, own, later)]
    assert ceilings == [3, 7, 5]


async def test_lowering_the_queue_ceiling_strands_no_queued_row(db: StateDB) -> None:
    """A row claimed twice under a ceiling of 3, then requeued: lowering the queue's ceiling to
    1 leaves it claimable (its own ceiling is 3), and it ends at its own ceiling."""
    task_id = await submit(db, now=T0)
    now = T0
    for attempt in (1, 2):
        assert await claim_ids(db, now=now) == [task_id]
        now += 1000  # past the lease (60 s lease_ttl, 240 s default deadline + 30 s slack)
        counts = await reap_expired_leases(db, now=now)
        assert counts["retry_wait"] == 1, (attempt, counts)
        now += 1000
        await reap_expired_leases(db, now=now)  # retry due: queued again
    await set_max_attempts(db, 1)
    assert (await taskward.get_task(db, task_id))["status"] == "queued"
    assert await claim_ids(db, now=now) == [task_id]
    now += 1000
    assert (await reap_expired_leases(db, now=now))["failed"] == 1
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["status_reason_code"], row["lease_attempts"]) == (
        "failed",
        "attempts_exhausted",
        3,
    )


async def test_a_tasks_own_ceiling_of_one_fails_at_its_first_expiry(db: StateDB) -> None:
    once = await submit(db, max_attempts=1, now=T0)
    twice = await submit(db, max_attempts=2, now=T0)
    assert sorted(await claim_ids(db, now=T0)) == sorted([once, twice])
    await reap_expired_leases(db, now=T0 + 1000)
    assert (await taskward.get_task(db, once))["status"] == "failed"
    assert (await taskward.get_task(db, twice))["status"] == "retry_wait"


# R20: limits and pauses ----------------------------------------------------------------------


async def test_a_paused_kind_is_never_claimed_until_resumed(db: StateDB) -> None:
    task_id = await submit(db, now=T0)
    paused = await pause_kind(db, "command", now=T0)
    assert paused["paused"] and paused["limit_key"] == "kind:command"
    assert await claim_ids(db, now=T0 + 1) == []
    reason = await placement_reason(db, task_id, now=T0 + 1)
    assert reason["reason"] == "held by limit kind:command: paused (max_running 0)"
    assert await resume_kind(db, "command", now=T0 + 2)
    assert await list_limits(db, now=T0 + 2) == []
    assert await claim_ids(db, now=T0 + 3) == [task_id]


async def test_max_running_bounds_a_kind_across_passes_and_workers(db: StateDB) -> None:
    ids = [await submit(db, now=T0 + n) for n in range(5)]
    await set_limit(db, "kind:command", max_running=2, now=T0)
    first = await claim_ids(db, now=T0 + 10, worker="a")
    assert first == ids[:2]
    assert await claim_ids(db, now=T0 + 10, worker="b") == []
    [state] = await list_limits(db, now=T0 + 10)
    assert (state["running"], state["free"]) == (2, 0)
    reason = await placement_reason(db, ids[2], now=T0 + 10)
    assert reason["reason"] == "held by limit kind:command: 2 running of at most 2"
    # one of them ends: one slot frees
    await _finish(db, ids[0], now=T0 + 11)
    assert await claim_ids(db, now=T0 + 12, worker="b") == [ids[2]]


async def test_a_limit_key_bounds_its_tasks_and_leaves_others_alone(db: StateDB) -> None:
    a1 = await submit(db, limit_key="tenant:a", now=T0)
    a2 = await submit(db, limit_key="tenant:a", now=T0 + 1)
    b1 = await submit(db, limit_key="tenant:b", now=T0 + 2)
    plain = await submit(db, now=T0 + 3)
    await set_limit(db, "tenant:a", max_running=1, now=T0)
    assert await claim_ids(db, now=T0 + 10) == [a1, b1, plain]
    reason = await placement_reason(db, a2, now=T0 + 10)
    assert reason["limit_key"] == "tenant:a"
    assert await claim_ids(db, now=T0 + 10) == []


async def test_a_rate_admits_n_claims_per_sliding_period(db: StateDB) -> None:
    ids = [await submit(db, now=T0 + n / 10) for n in range(5)]
    await set_limit(db, "kind:command", rate=2, period_s=60, now=T0)
    assert await claim_ids(db, now=T0 + 1) == ids[:2]
    assert await claim_ids(db, now=T0 + 30) == []
    reason = await placement_reason(db, ids[2], now=T0 + 30)
    assert reason["reason"] == "held by limit kind:command: 2 claims in the last 60s of at most 2"
    assert await claim_ids(db, now=T0 + 61) == ids[2:4]
    assert await claim_ids(db, now=T0 + 62) == []
    assert await clear_limit(db, "kind:command", now=T0 + 62)
    assert await claim_ids(db, now=T0 + 62) == ids[4:]


async def test_held_rows_never_fill_the_pass_so_others_behind_them_run(db: StateDB) -> None:
    """6,000 rows of a paused limit key stand before one free row: the pass reads past them."""
    held = [app(limit_key="tenant:slow") for _ in range(6000)]
    await taskward.submit_tasks(db, held, registry=REGISTRY, now=T0)
    free = await submit(db, now=T0 + 1)
    await set_limit(db, "tenant:slow", max_running=0, now=T0)
    assert await claim_ids(db, now=T0 + 2) == [free]


@pytest.mark.parametrize(
    ("key", "kwargs", "field"),
    [
        ("kind:", {"max_running": 1}, "limit_key"),
        ("kind:a b", {"max_running": 1}, "limit_key"),
        ("", {"max_running": 1}, "limit_key"),
        ("tenant:a", {}, "max_running"),
        ("tenant:a", {"max_running": -1}, "max_running"),
        ("tenant:a", {"max_running": True}, "max_running"),
        ("tenant:a", {"rate": 5}, "rate"),
        ("tenant:a", {"period_s": 5}, "rate"),
        ("tenant:a", {"rate": 0, "period_s": 5}, "rate"),
        ("tenant:a", {"rate": 1, "period_s": 0}, "period_s"),
        ("tenant:a", {"rate": 1, "period_s": float("nan")}, "period_s"),
    ],
)
async def test_a_bad_limit_is_refused_by_name_and_nothing_is_stored(
    db: StateDB, key: str, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(TaskValidationError) as caught:
        await set_limit(db, key, **kwargs)
    assert caught.value.field == field
    assert await list_limits(db) == []


async def test_setting_a_limit_replaces_it_whole(db: StateDB) -> None:
    await set_limit(db, "tenant:a", max_running=3, rate=10, period_s=60, now=T0)
    [row] = await list_limits(db, now=T0)
    assert (row["max_running"], row["rate"], row["period_s"]) == (3, 10, 60.0)
    await set_limit(db, "tenant:a", max_running=1, now=T0)
    [row] = await list_limits(db, now=T0)
    assert (row["max_running"], row["rate"], row["period_s"]) == (1, None, None)
    assert not await resume_kind(db, "command", now=T0)  # never paused
    assert json.loads(json.dumps(row)) == row  # JSON-ready for every binding


async def _finish(db: StateDB, task_id: str, *, now: float) -> None:
    """End a running task as its owner would (completed under its lease)."""
    from taskward.claims import Lease
    from taskward.execution import RetryPolicy, settle_lease

    row = await taskward.get_task(db, task_id)
    lease = Lease(
        task_id=task_id,
        leased_by=row["leased_by"],
        attempt=row["lease_attempts"],
        lease_expires_at=row["lease_expires_at"],
        deadline_at=row["deadline_at"],
        claimed_at=now,
        action_kind=row["action_kind"],
    )
    result = await settle_lease(
        db,
        lease,
        taskward.TaskExecutionResult(status="completed", exit_code=0),
        actor=taskward.Actor(type="system", id=row["leased_by"]),
        max_attempts=row["max_attempts"],
        policy=RetryPolicy(),
        now=now,
    )
    assert result.applied


# The claim still reads one index range (R16, R17) ---------------------------------------------


async def test_the_claim_page_reads_one_range_of_the_claim_index(db: StateDB, db_url: str) -> None:
    """Both dialects' page walks idx_schedule_runs_claim_rank from the keyset cursor, in order:
    no sort, no scan of the rows before the cursor (a row comparison as the range's start)."""
    from taskward.store.queries import load_queries

    if db.dialect == "sqlite":
        import sqlite3

        sql = load_queries("sqlite")["run_claim_page"]
        params = {
            "now": T0,
            "kinds": '["command"]',
            "held": "[]",
            "cursor_rank": 0,
            "cursor_queued_at": T0,
            "cursor_id": "x",
            "page_size": 50,
            "targets": "[]",
            "capabilities": "[]",
            "soft": "[]",
            "lock": 50,
        }
        path = db_url.split("?", 1)[0][len("sqlite:///") :]
        with sqlite3.connect(path) as conn:
            steps = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
        reads = [
            step
            for step in steps
            if step.startswith(("SCAN schedule_runs", "SEARCH schedule_runs"))
        ]
        assert reads == [
            "SEARCH schedule_runs USING INDEX idx_schedule_runs_claim_rank "
            "((claim_rank,queued_at,id)>(?,?,?))"
        ], steps
        assert not any("TEMP B-TREE" in step for step in steps), steps
        return
    import psycopg

    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        # A queue the planner knows about, so that only the function's settings keep the walk.
        await conn.execute(
            "INSERT INTO schedule_runs (id, trigger_context, action_kind, action_args, status, "
            "fired_at, created_at, queued_at, priority) "
            "SELECT 'q-' || n, '{}', 'command', '{}', 'queued', %(t)s, %(t)s, %(t)s + n, n %% 5 "
            "FROM generate_series(1, 5000) AS n",
            {"t": T0},
        )
        await conn.execute("ANALYZE schedule_runs")
        cur = await conn.execute(
            "SELECT prosrc FROM pg_proc WHERE proname = 'taskward_claim_lock_page' "
            "AND pronamespace = current_schema()::regnamespace"
        )
        [(source,)] = await cur.fetchall()
        # The function's own page statements, with its parameters as values.
        pages = [
            part[part.index("SELECT r.id") : part.index("LIMIT p_page_size")]
            for part in source.split("FROM (")[1:3]
        ]
        values = {
            "p_now": f"{T0 + 10_000}::float8",
            "p_kinds": "'[\"command\"]'::jsonb",
            "p_held": "'[]'::jsonb",
            "p_cursor_rank": "-2",
            "p_cursor_queued_at": f"{T0 + 100}::float8",
            "p_cursor_id": "'q-100'",
        }
        for setting in ("enable_sort", "enable_incremental_sort", "enable_bitmapscan"):
            await conn.execute(f"SET {setting} = off")
        for branch, page in enumerate(pages):
            text = page
            # the first branch is the one without a cursor
            given = values if branch else {**values, "p_cursor_queued_at": "NULL::float8"}
            for name in sorted(given, key=len, reverse=True):
                text = text.replace(name, given[name])
            cur = await conn.execute(f"EXPLAIN {text} LIMIT 50")
            plan = " | ".join(r[0] for r in await cur.fetchall())
            assert "Index Scan using idx_schedule_runs_claim_rank" in plan, plan
            assert "Sort" not in plan and "Seq Scan" not in plan, plan
            assert "queued_at <=" in plan, plan  # R16's bound is checked in the index walk
        assert "ROW(claim_rank, queued_at, id) >" in plan, plan  # the cursor starts the range


async def test_an_operator_retry_keeps_priority_limit_key_and_ceiling_but_runs_now(
    db: StateDB,
) -> None:
    task_id = await submit(
        db, priority=9, limit_key="tenant:r", max_attempts=1, run_after=T0 + 5, now=T0
    )
    await taskward.transition_task(
        db,
        taskward.TransitionRequest(
            entity_id=task_id,
            from_state="queued",
            to_state="cancelled",
            reason=taskward.StateReason(code="operator"),
            actor=taskward.Actor(type="operator", id="t"),
            idempotency_key="end",
        ),
        now=T0 + 1,
    )
    new_id = await taskward.retry_task(
        db,
        task_id,
        actor=taskward.Actor(type="operator", id="t"),
        idempotency_key="again",
        registry=REGISTRY,
        now=T0 + 2,
    )
    row = await taskward.get_task(db, new_id)
    assert (row["priority"], row["limit_key"], row["max_attempts"], row["run_after"]) == (
        9,
        "tenant:r",
        1,
        None,
    )
    assert row["queued_at"] == T0 + 2


async def test_the_sync_client_admits_the_scheduling_fields_alike(db: StateDB, db_url: str) -> None:
    fields = {"run_after": T0 + 60, "priority": -2, "max_attempts": 2, "limit_key": "tenant:s"}
    with taskward.SyncClient(db_url, registry=REGISTRY) as client:
        task_id = client.submit_task(app(idempotency_key="sync-1", **fields))
        assert client.submit_task(app(idempotency_key="sync-1", **fields)) == task_id
        with pytest.raises(TaskIdempotencyConflict):
            client.submit_task(app(idempotency_key="sync-1", **{**fields, "priority": 3}))
    row = await taskward.get_task(db, task_id)
    assert {k: row[k] for k in fields} == fields


async def test_a_limit_filling_mid_pass_keeps_the_claim_order(db: StateDB) -> None:
    """A key that fills up during a pass leaves its rows behind, and the pass takes the next
    rows in claim order, not the rows past the page it had read (the scan starts again with the
    held key left out)."""
    a = [await submit(db, priority=10, limit_key="tenant:a", now=T0 + n) for n in range(3)]
    b = [await submit(db, now=T0 + n) for n in range(10)]
    c = [await submit(db, priority=-5, now=T0 + n) for n in range(3)]
    await set_limit(db, "tenant:a", max_running=1, now=T0)
    assert await claim_ids(db, now=T0 + 20, limit=3) == [a[0], b[0], b[1]]
    assert await claim_ids(db, now=T0 + 20, limit=20) == [*b[2:], *c]


async def test_pause_and_resume_keep_the_limit_a_kind_had(db: StateDB) -> None:
    await set_limit(db, "kind:command", max_running=10, rate=5, period_s=60, now=T0)
    paused = await pause_kind(db, "command", now=T0 + 1)
    assert (paused["max_running"], paused["rate"], paused["resumes_to"]) == (0, 5, 10)
    again = await pause_kind(db, "command", now=T0 + 2)  # a second pause forgets nothing
    assert (again["max_running"], again["resumes_to"]) == (0, 10)
    assert await resume_kind(db, "command", now=T0 + 3)
    [row] = await list_limits(db, now=T0 + 3)
    assert (row["max_running"], row["rate"], row["period_s"], row["resumes_to"]) == (
        10,
        5,
        60.0,
        None,
    )
    assert not await resume_kind(db, "command", now=T0 + 4)
    await pause_kind(db, "python", now=T0 + 5)  # a pause that is the whole limit
    assert await resume_kind(db, "python", now=T0 + 6)
    assert [r["limit_key"] for r in await list_limits(db, now=T0 + 6)] == ["kind:command"]


async def test_a_burst_workers_idle_check_sees_no_work_of_a_paused_kind(db: StateDB) -> None:
    from taskward.claims import find_candidates

    task_id = await submit(db, now=T0)
    assert [r["id"] for r in await find_candidates(db, spec(), limit=1, now=T0 + 1)] == [task_id]
    await pause_kind(db, "command", now=T0)
    assert await find_candidates(db, spec(), limit=1, now=T0 + 1) == []


async def test_an_idle_worker_wakes_when_a_delayed_task_falls_due(db: StateDB) -> None:
    """R16: an idle worker polls every ``idle_wait_s`` (10 s here), yet a task delayed by 1 s
    starts soon after its run_after: the idle wait ends when the earliest delayed row
    falls due. Real time: the runtime takes no ``now``; bounded with slack, measured value
    reported."""
    import asyncio
    import time

    from taskward.runtime import WorkerConfig, WorkerRuntime

    config = WorkerConfig(
        concurrency=1,
        idle_wait_s=10.0,
        reap_interval_s=30.0,
        run_scheduler=False,
        deliver_outbox=False,
    )
    started = asyncio.Event()
    runtime = WorkerRuntime(
        db, REGISTRY, config, on_event=lambda kind, *_: started.set() if kind == "start" else None
    )
    run_after = time.time() + 1.0
    task_id = await submit(db, run_after=run_after)
    # Its first pass finds nothing due: without the wake-up it would sleep 10 s.
    serving = asyncio.create_task(runtime.run())
    try:
        await asyncio.wait_for(started.wait(), 8.0)
    finally:
        runtime.drain("test")
        await asyncio.wait_for(serving, 60)
    facts = await taskward.list_transitions(db, task_id)
    lag = facts[0]["created_at"] - run_after
    print(f"delayed task started {lag * 1000:.0f} ms after its run_after")
    assert facts[0]["status"] == "running"
    assert 0 <= lag < 5.0, lag
