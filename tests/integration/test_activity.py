"""The dashboard's reads beyond one task (``taskward.activity``) on SQLite and PostgreSQL: the
overview's endings, p95 run time and queue depth over time from the facts, and the task list's
search, both page directions and its total."""

from __future__ import annotations

import pytest

import taskward
from taskward import TaskApplication, activity
from taskward.activity import read_activity, search_tasks
from taskward.adapters import AdapterConfig, build_registry
from taskward.errors import TaskValidationError
from taskward.store import StateDB
from tests.integration.helpers import move, request, submit


async def test_endings_and_p95_per_kind_and_bucket_from_the_facts(db: StateDB) -> None:
    now = await db.now()
    since, bucket_s, buckets = activity.window("1h", now)
    start = since + (buckets - 3) * bucket_s + 1  # two buckets before the current one
    for run_s in (0.2, 0.2, 4.0):  # three completions, run times 0.2 s, 0.2 s and 4 s
        task = await submit(db, now=start - 5)
        await move(db, task, "queued", "running", now=start)
        await move(db, task, "running", "completed", now=start + run_s)
    failed = await taskward.submit_task(
        db,
        TaskApplication(
            action_kind="python",
            args={"function": "m:f"},
            execution_target="host",
            idempotency_key="py",
        ),
        registry=build_registry(AdapterConfig(python_modules=frozenset({"m"}))),
        now=start,
    )
    await move(db, failed, "queued", "running", now=start + bucket_s)
    await move(db, failed, "running", "failed", now=start + bucket_s + 30)
    never_ran = await submit(db, now=start)
    await move(db, never_ran, "queued", "cancelled", now=start + 2)

    got = await read_activity(db, range_name="1h")
    assert (got.bucket_s, got.buckets, got.since) == (60, 60, since)
    by_kind = {s.kind: s for s in got.kinds}
    assert [s.kind for s in got.kinds] == ["command", "python"]  # the busiest first
    command = by_kind["command"]
    i = buckets - 3
    assert command.ended["completed"][i] == 3
    assert command.ended["cancelled"][i] == 1
    assert sum(command.ended["completed"]) == 3
    assert command.p95_s[i] == 5.0  # the class of 4 s: (2.5, 5]
    assert command.p95_s[i + 1] is None
    python = by_kind["python"]
    assert python.ended["failed"][i + 1] == 1 and python.p95_s[i + 1] == 30.0


async def test_queue_depth_is_read_back_from_the_counts_of_now(db: StateDB) -> None:
    now = await db.now()
    since, bucket_s, buckets = activity.window("1h", now)
    t0 = since + 10 * bucket_s + 1
    waiting = [await submit(db, now=t0) for _ in range(3)]  # three queued in bucket 10
    await move(db, waiting[0], "queued", "running", now=t0 + 2 * bucket_s)  # bucket 12
    await move(db, waiting[0], "running", "completed", now=t0 + 5 * bucket_s)  # bucket 15
    await submit(db, now=since - 3600)  # queued since before the range

    depth = (await read_activity(db)).depth
    assert depth["queued"][9] == 1  # only the old one
    assert depth["queued"][10] == 4
    assert depth["queued"][12] == 3 and depth["running"][12] == 1
    assert depth["running"][14] == 1 and depth["running"][15] == 0
    assert depth["queued"][buckets - 1] == 3
    assert set(depth) == set(activity.DEPTH_STATES)


def test_p95_is_the_bound_of_the_class_holding_it() -> None:
    hist = [0] * len(activity.DURATION_BOUNDS)
    assert activity.p95_of(hist) is None
    hist[2] = 95
    hist[9] = 5
    assert activity.p95_of(hist) == 0.05
    hist[9] = 6
    assert activity.p95_of(hist) == 10.0
    hist = [0] * len(activity.DURATION_BOUNDS)
    hist[-1] = 1  # over an hour: the last finite bound
    assert activity.p95_of(hist) == 3600.0


def test_a_range_is_one_of_the_named_ones() -> None:
    with pytest.raises(TaskValidationError, match="range"):
        activity.window("2y", 0.0)
    since, width, n = activity.window("24h", 86_400 * 3 + 100)
    assert (width, n) == (900, 96) and since % 900 == 0


async def test_search_finds_a_task_by_its_args_key_or_error_never_by_env(db: StateDB) -> None:
    wanted = await submit(db, args={"argv": ["echo", "Needle-In-Args"]})
    keyed = await submit(db, idempotency_key="invoice-20261205")
    secret = await submit(db, args={"argv": ["true"], "env": {"TOKEN": "hunter2secret"}})
    failing = await submit(db)
    await move(db, failing, "queued", "running")
    req = request(
        failing, "running", "failed", code="execution_failed", summary="disk FULL on /var"
    )
    assert (await taskward.transition_task(db, req)).applied

    async def ids(q: str) -> list[str]:
        return [r["id"] for r in (await search_tasks(db, q=q)).rows]

    assert await ids("needle-in-args") == [wanted]
    assert await ids("INVOICE-2026") == [keyed]
    assert await ids("disk full on") == [failing]
    assert await ids(wanted[-12:]) == [wanted]
    assert await ids("hunter2secret") == []  # env values are never searched
    assert secret in await ids("")  # an empty search is no filter
    page = await search_tasks(db, q="needle")
    assert page.total == 1 and page.rows[0]["args_preview"].startswith("{")
    assert "Needle-In-Args" in page.rows[0]["args_preview"]
    with pytest.raises(TaskValidationError, match="q"):
        await search_tasks(db, q="x" * (activity.MAX_QUERY_CHARS + 1))


async def test_pages_go_both_ways_and_the_total_counts_the_filter(db: StateDB) -> None:
    now = await db.now()
    made = [await submit(db, now=now - 100 + i) for i in range(7)]  # oldest first
    newest_first = made[::-1]
    first = await search_tasks(db, limit=3)
    assert [r["id"] for r in first.rows] == newest_first[:3]
    assert first.total == 7 and not first.capped
    assert first.newer_cursor is None and first.next_cursor
    second = await search_tasks(db, limit=3, cursor=first.next_cursor)
    assert [r["id"] for r in second.rows] == newest_first[3:6]
    assert second.newer_cursor and second.next_cursor
    third = await search_tasks(db, limit=3, cursor=second.next_cursor)
    assert [r["id"] for r in third.rows] == newest_first[6:]
    assert third.next_cursor is None
    back = await search_tasks(db, limit=3, newer=third.newer_cursor)
    assert [r["id"] for r in back.rows] == newest_first[3:6]
    back_again = await search_tasks(db, limit=3, newer=back.newer_cursor)
    assert [r["id"] for r in back_again.rows] == newest_first[:3]
    assert back_again.newer_cursor is None and back_again.next_cursor
    await move(db, made[0], "queued", "cancelled")
    cancelled = await search_tasks(db, status="cancelled")
    assert cancelled.total == 1 and cancelled.rows[0]["id"] == made[0]
