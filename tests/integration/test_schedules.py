"""Schedules end to end on both backends, time injected (ADR-0072 D1, DESIGN.md R11, R13)."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

import taskward
from taskward import (
    AdapterConfig,
    AdapterNotRegistered,
    CancellationToken,
    StoreUnavailable,
    TaskExecutionResult,
    TaskValidationError,
    build_registry,
)
from taskward.errors import ScheduleNotFound
from taskward.runtime import WorkerConfig, WorkerRuntime
from taskward.schedules import (
    Scheduler,
    SchedulerState,
    create_schedule,
    disable_schedule,
    enable_schedule,
    fire_schedule,
    get_schedule,
    list_schedules,
    remove_schedule,
    schedule_metrics,
)
from taskward.store.port import Row, StateDB
from tests.integration.helpers import REGISTRY, move

T0 = int(datetime(2026, 1, 5, tzinfo=UTC).timestamp())  # a Monday, 00:00 UTC
MANUAL_KEY = re.compile(
    r"^manual:(?P<sid>[0-9a-f-]{36}):[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"
)


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    return int(datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp())


async def add(db: StateDB, *, now: float = T0, **changes: Any) -> Row:
    fields: dict[str, Any] = {
        "name": f"s-{uuid.uuid4().hex[:8]}",
        "action_kind": "command",
        "args": {"argv": ["true"]},
        "registry": REGISTRY,
        "now": now,
    }
    if "cron" not in changes and "interval_s" not in changes:
        fields["interval_s"] = 60
    fields.update(changes)
    return await create_schedule(db, **fields)


async def runs_of(db: StateDB, schedule_id: str) -> list[Row]:
    rows, _ = await taskward.list_tasks(db, limit=500)
    return sorted(
        (r for r in rows if r["schedule_id"] == schedule_id), key=lambda r: r["idempotency_key"]
    )


def nominal(row: Row) -> int:
    return int(row["idempotency_key"].rsplit(":", 1)[1])


# -- fire times and admitted rows -------------------------------------------------------------


async def test_interval_fires_are_queued_rows_with_schedule_id_source_and_deterministic_key(
    db: StateDB,
) -> None:
    s = await add(db, interval_s=60)
    assert s["next_fire_at"] == T0 + 60 and s["enabled"] is True
    scheduler = Scheduler(db, REGISTRY)
    assert (await scheduler.run_once(now=T0 + 59)).task_ids == []
    report = await scheduler.run_once(now=T0 + 60.7)
    assert len(report.task_ids) == 1
    row = await taskward.get_task(db, report.task_ids[0])
    assert row["status"] == "queued"
    assert row["schedule_id"] == s["id"]
    assert row["admission_source"] == "schedule"
    assert row["idempotency_key"] == f"schedule:{s['id']}:{T0 + 60}"
    assert row["action_args"] == {"argv": ["true"]}
    # the same cadence point again admits nothing new
    assert (await scheduler.run_once(now=T0 + 61)).task_ids == []
    report = await scheduler.run_once(now=T0 + 125)
    assert [nominal(await taskward.get_task(db, t)) for t in report.task_ids] == [T0 + 120]
    s = await get_schedule(db, s["id"])
    assert (s["fire_count"], s["last_fire_at"], s["next_fire_at"]) == (2, T0 + 120, T0 + 180)
    assert s["last_run_id"] == report.task_ids[0]
    assert s["pending_fires"] == []
    assert len(await runs_of(db, s["id"])) == 2
    # no producer writes running (ADR-0072 D1): no facts either
    assert await taskward.list_transitions(db, report.task_ids[0]) == []


async def test_interval_start_at_anchors_the_fire_times(db: StateDB) -> None:
    s = await add(db, interval_s=3600, start_at=T0 + 1800)
    assert s["next_fire_at"] == T0 + 1800
    scheduler = Scheduler(db, REGISTRY)
    await scheduler.run_once(now=T0 + 1800)
    await scheduler.run_once(now=T0 + 5400)
    assert [nominal(r) for r in await runs_of(db, s["id"])] == [T0 + 1800, T0 + 5400]


async def test_cron_fires_at_matching_minutes_in_its_zone(db: StateDB) -> None:
    s = await add(db, cron="0 9 * * mon-fri", timezone="Europe/Berlin")
    assert s["next_fire_at"] == at(2026, 1, 5, 8)  # 09:00 CET
    scheduler = Scheduler(db, REGISTRY)
    fired = []
    for day in range(5, 13):  # Monday 5th .. Monday 12th, once a day just after 09:00 local
        report = await scheduler.run_once(now=at(2026, 1, day, 8, 0) + 5)
        fired += [nominal(await taskward.get_task(db, t)) for t in report.task_ids]
    assert fired == [at(2026, 1, d, 8) for d in (5, 6, 7, 8, 9, 12)]  # no weekend


async def test_dst_gap_skips_the_missing_local_time(db: StateDB) -> None:
    # Europe/Berlin 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist.
    s = await add(db, cron="30 2 * * *", timezone="Europe/Berlin", now=at(2026, 3, 27, 12))
    scheduler = Scheduler(db, REGISTRY)
    for hour in range(0, 24 * 4):  # hourly passes from the 28th to the 31st
        await scheduler.run_once(now=at(2026, 3, 28) + hour * 3600 + 1)
    fired = [nominal(r) for r in await runs_of(db, s["id"])]
    assert fired == [at(2026, 3, 28, 1, 30), at(2026, 3, 30, 0, 30), at(2026, 3, 31, 0, 30)]
    assert (await get_schedule(db, s["id"]))["misfire_skips"] == 0  # a gap is not a misfire


async def test_ambiguous_local_time_fires_once(db: StateDB) -> None:
    # America/New_York 2026-11-01: 01:30 happens at 05:30Z (EDT) and again at 06:30Z (EST).
    s = await add(db, cron="30 1 * * *", timezone="America/New_York", now=at(2026, 10, 31, 12))
    hourly = await add(db, cron="0 * * * *", timezone="America/New_York", now=at(2026, 11, 1, 4))
    scheduler = Scheduler(db, REGISTRY)
    for minute in range(0, 5 * 60, 10):  # 04:00Z .. 08:50Z every 10 minutes
        await scheduler.run_once(now=at(2026, 11, 1, 4) + minute * 60)
    assert [nominal(r) for r in await runs_of(db, s["id"])] == [at(2026, 11, 1, 5, 30)]
    assert [nominal(r) for r in await runs_of(db, hourly["id"])] == [
        at(2026, 11, 1, 5),  # 01:00 EDT; 01:00 EST (06:00Z) does not fire again
        at(2026, 11, 1, 7),  # 02:00 EST
        at(2026, 11, 1, 8),
    ]
    assert (await get_schedule(db, s["id"]))["next_fire_at"] == at(2026, 11, 2, 6, 30)


# -- misfire and overlap ------------------------------------------------------------------------


async def test_misfire_skip_fires_only_an_on_time_latest_and_records_the_rest(db: StateDB) -> None:
    s = await add(db, interval_s=60, misfire_policy="skip", misfire_grace_s=30)
    scheduler = Scheduler(db, REGISTRY)
    report = await scheduler.run_once(now=T0 + 300 + 10)  # away for 60..300; 300 is on time
    assert report.misfire_skips == 4
    assert [nominal(r) for r in await runs_of(db, s["id"])] == [T0 + 300]
    report = await scheduler.run_once(now=T0 + 600 + 45)  # 360..600, and 600 is 45 s late
    assert (report.task_ids, report.misfire_skips) == ([], 5)
    row = await get_schedule(db, s["id"])
    assert (row["misfire_skips"], row["last_skip_reason"], row["last_skip_at"]) == (
        9,
        "misfire",
        T0 + 600,
    )
    assert (row["fire_count"], row["next_fire_at"]) == (1, T0 + 660)
    assert len(await runs_of(db, s["id"])) == 1  # skips wrote no task row (R13)
    assert scheduler.metrics.misfire_skips == 9


async def test_misfire_fire_once_fires_the_latest_even_when_late(db: StateDB) -> None:
    s = await add(db, interval_s=60, misfire_policy="fire_once", misfire_grace_s=30)
    report = await Scheduler(db, REGISTRY).run_once(now=T0 + 600 + 45)
    assert report.misfire_skips == 9
    assert [nominal(r) for r in await runs_of(db, s["id"])] == [T0 + 600]
    row = await get_schedule(db, s["id"])
    assert (row["fire_count"], row["misfire_skips"], row["last_fire_at"]) == (1, 9, T0 + 600)


async def test_misfire_catch_up_fires_a_bounded_number_oldest_first(db: StateDB) -> None:
    s = await add(db, interval_s=60, misfire_policy="catch_up", catch_up_max=3)
    report = await Scheduler(db, REGISTRY).run_once(now=T0 + 600 + 5)
    admitted = [await taskward.get_task(db, t) for t in report.task_ids]
    assert [nominal(r) for r in admitted] == [T0 + 480, T0 + 540, T0 + 600]  # in that order
    assert report.misfire_skips == 7
    row = await get_schedule(db, s["id"])
    assert (row["fire_count"], row["misfire_skips"], row["last_run_id"]) == (
        3,
        7,
        report.task_ids[-1],
    )


async def test_overlap_skip_writes_no_row_and_is_recorded(db: StateDB) -> None:
    s = await add(db, interval_s=60, overlap_policy="skip")
    scheduler = Scheduler(db, REGISTRY)
    first = (await scheduler.run_once(now=T0 + 60)).task_ids
    assert len(first) == 1
    report = await scheduler.run_once(now=T0 + 120)  # the first run is still queued
    assert (report.task_ids, report.overlap_skips) == ([], 1)
    row = await get_schedule(db, s["id"])
    assert (row["overlap_skips"], row["last_skip_reason"], row["last_skip_at"]) == (
        1,
        "overlap",
        T0 + 120,
    )
    assert row["next_fire_at"] == T0 + 180
    assert len(await runs_of(db, s["id"])) == 1
    assert scheduler.metrics.overlap_skips == 1
    # once the previous run is terminal the next fire is admitted
    await move(db, first[0], "queued", "running", "completed")
    report = await scheduler.run_once(now=T0 + 180)
    assert len(report.task_ids) == 1
    assert [nominal(r) for r in await runs_of(db, s["id"])] == [T0 + 60, T0 + 180]
    assert (await schedule_metrics(db))["overlap_skips"] == 1


async def test_overlap_skip_with_catch_up_admits_only_the_first(db: StateDB) -> None:
    s = await add(db, interval_s=60, overlap_policy="skip", misfire_policy="catch_up")
    report = await Scheduler(db, REGISTRY).run_once(now=T0 + 180)
    assert (len(report.task_ids), report.overlap_skips) == (1, 2)
    assert [nominal(r) for r in await runs_of(db, s["id"])] == [T0 + 60]


async def test_overlap_allow_admits_while_the_previous_run_is_queued(db: StateDB) -> None:
    s = await add(db, interval_s=60)
    scheduler = Scheduler(db, REGISTRY)
    await scheduler.run_once(now=T0 + 60)
    await scheduler.run_once(now=T0 + 120)
    assert [nominal(r) for r in await runs_of(db, s["id"])] == [T0 + 60, T0 + 120]


async def test_a_manual_run_counts_for_the_overlap_policy(db: StateDB) -> None:
    s = await add(db, interval_s=60, overlap_policy="skip")
    await fire_schedule(db, s["id"], registry=REGISTRY, now=T0 + 10)
    report = await Scheduler(db, REGISTRY).run_once(now=T0 + 60)
    assert (report.task_ids, report.overlap_skips) == ([], 1)


# -- manual fire ----------------------------------------------------------------------------------


async def test_manual_fire_returns_the_task_id_with_a_manual_key(db: StateDB) -> None:
    s = await add(db, interval_s=3600)
    task_id = await fire_schedule(db, s["id"], registry=REGISTRY, now=T0 + 5)
    row = await taskward.get_task(db, task_id)
    match = MANUAL_KEY.match(row["idempotency_key"])
    assert match and match["sid"] == s["id"]
    assert (row["status"], row["schedule_id"], row["admission_source"]) == (
        "queued",
        s["id"],
        "schedule",
    )
    # a second manual fire is a new task; replaying a key returns the same one
    other = await fire_schedule(db, s["name"], registry=REGISTRY)
    assert other != task_id
    replay = await fire_schedule(
        db, s["id"], idempotency_key=row["idempotency_key"], registry=REGISTRY
    )
    assert replay == task_id
    # a manual fire does not move the cursor or the counters
    after = await get_schedule(db, s["id"])
    assert (after["next_fire_at"], after["fire_count"], after["last_run_id"]) == (
        T0 + 3600,
        0,
        None,
    )


async def test_manual_fire_rejects_a_key_of_another_shape(db: StateDB) -> None:
    s = await add(db)
    for key in ("cli:abc", f"manual:{s['id']}:not-a-uuid", f"manual:other:{uuid.uuid4()}"):
        with pytest.raises(TaskValidationError) as info:
            await fire_schedule(db, s["id"], idempotency_key=key, registry=REGISTRY)
        assert info.value.field == "idempotency_key"
    assert await runs_of(db, s["id"]) == []


async def test_manual_fire_works_on_a_disabled_schedule_but_not_a_removed_one(
    db: StateDB,
) -> None:
    s = await add(db)
    await disable_schedule(db, s["id"])
    assert await fire_schedule(db, s["id"], registry=REGISTRY)
    await remove_schedule(db, s["id"])
    with pytest.raises(TaskValidationError, match="removed") as info:
        await fire_schedule(db, s["id"], registry=REGISTRY)
    assert info.value.field == "schedule"


# -- enable, disable, remove ---------------------------------------------------------------------


async def test_remove_disables_and_marks_the_schedule_never_deleting_it(db: StateDB) -> None:
    s = await add(db, name="nightly", interval_s=60)
    scheduler = Scheduler(db, REGISTRY)
    await scheduler.run_once(now=T0 + 60)
    removed = await remove_schedule(db, "nightly", now=T0 + 70)
    assert removed["enabled"] is False
    assert removed["removed_at"] == T0 + 70 and removed["disabled_at"] == T0 + 70
    assert (await remove_schedule(db, s["id"], now=T0 + 99))["removed_at"] == T0 + 70
    # R11: the row, its counters and its runs stay; only listings hide it
    kept = await get_schedule(db, s["id"])
    assert (kept["fire_count"], kept["removed_at"]) == (1, T0 + 70)
    assert [r["id"] for r in await list_schedules(db)] == []
    assert [r["id"] for r in await list_schedules(db, include_removed=True)] == [s["id"]]
    assert len(await runs_of(db, s["id"])) == 1
    assert (await scheduler.run_once(now=T0 + 600)).evaluated == 0
    with pytest.raises(TaskValidationError, match="removed"):
        await enable_schedule(db, s["id"])
    with pytest.raises(ScheduleNotFound):
        await get_schedule(db, "nightly")  # names find live schedules only
    # the name is free for a new schedule
    again = await add(db, name="nightly")
    assert again["id"] != s["id"]


async def test_disabled_schedule_does_not_fire_and_enable_resumes_without_backlog(
    db: StateDB,
) -> None:
    s = await add(db, interval_s=60, misfire_policy="catch_up", catch_up_max=100)
    disabled = await disable_schedule(db, s["id"], now=T0 + 30)
    assert (disabled["enabled"], disabled["disabled_at"]) == (False, T0 + 30)
    scheduler = Scheduler(db, REGISTRY)
    assert (await scheduler.run_once(now=T0 + 600)).evaluated == 0
    enabled = await enable_schedule(db, s["id"], now=T0 + 610)
    assert (enabled["enabled"], enabled["disabled_at"], enabled["next_fire_at"]) == (
        True,
        None,
        T0 + 660,
    )
    assert (await enable_schedule(db, s["id"], now=T0 + 9999))["next_fire_at"] == T0 + 660
    report = await scheduler.run_once(now=T0 + 661)
    assert (len(report.task_ids), report.misfire_skips) == (1, 0)


async def test_unknown_schedule_is_not_found(db: StateDB) -> None:
    with pytest.raises(ScheduleNotFound) as info:
        await get_schedule(db, "nope")
    assert isinstance(info.value, LookupError)
    with pytest.raises(ScheduleNotFound):
        await fire_schedule(db, "nope", registry=REGISTRY)


# -- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "0 0 31 2 *"}, "cron"),
        ({"cron": "* * * * *", "interval_s": 60}, "cron"),
        ({"interval_s": 0}, "interval_s"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"action_kind": "shel"}, "action_kind"),
        ({"args": {"argv": ["rm", "-rf", "/"]}}, "args.argv[0]"),
        ({"execution_target": "moon"}, "execution_target"),
        ({"misfire_policy": "later"}, "misfire_policy"),
        ({"catch_up_max": 0}, "catch_up_max"),
        ({"overlap_policy": "queue"}, "overlap_policy"),
        ({"name": " padded "}, "name"),
        ({"cron": "0 * * * *", "start_at": T0}, "start_at"),
    ],
)
async def test_bad_input_names_the_field_and_writes_nothing(
    db: StateDB, changes: dict[str, Any], field: str
) -> None:
    if "cron" in changes and "interval_s" not in changes:
        changes = {**changes, "interval_s": None}
    with pytest.raises(TaskValidationError) as info:
        await add(db, **changes)
    assert info.value.field == field
    assert isinstance(info.value, ValueError)
    assert await list_schedules(db, include_removed=True) == []


async def test_unknown_kind_lists_the_registered_kinds(db: StateDB) -> None:
    with pytest.raises(AdapterNotRegistered, match=r"registered kinds: .*command"):
        await add(db, action_kind="shel")


async def test_a_live_name_is_taken(db: StateDB) -> None:
    s = await add(db, name="report")
    with pytest.raises(TaskValidationError, match=s["id"]) as info:
        await add(db, name="report")
    assert info.value.field == "name"


async def test_template_is_stored_canonical(db: StateDB) -> None:
    s = await add(
        db,
        action_kind="playbook",
        args={"name": "x"},
        required_capabilities=["gpu", "cpu", "gpu"],
    )
    assert (s["action_kind"], s["required_capabilities"]) == ("play", ["cpu", "gpu"])


# -- several schedulers, crashes, registries ------------------------------------------------------


async def test_decided_fires_survive_a_crash_before_admission(
    db: StateDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = await add(db, interval_s=60, misfire_policy="catch_up")
    import taskward.schedules.scheduler as schedules

    real_submit = schedules.submit_task

    async def store_down(*args: Any, **kwargs: Any) -> str:
        raise StoreUnavailable("gone")

    monkeypatch.setattr(schedules, "submit_task", store_down)
    with pytest.raises(StoreUnavailable):
        await Scheduler(db, REGISTRY).run_once(now=T0 + 125)
    decided = await get_schedule(db, s["id"])
    assert (decided["pending_fires"], decided["next_fire_at"]) == ([T0 + 60, T0 + 120], T0 + 180)
    assert await runs_of(db, s["id"]) == []
    monkeypatch.setattr(schedules, "submit_task", real_submit)
    # another scheduler admits them, even at an earlier time of its own
    report = await Scheduler(db, REGISTRY).run_once(now=T0 + 90)
    assert len(report.task_ids) == 2
    row = await get_schedule(db, s["id"])
    assert (row["pending_fires"], row["fire_count"], row["last_fire_at"]) == ([], 2, T0 + 120)
    assert [nominal(r) for r in await runs_of(db, s["id"])] == [T0 + 60, T0 + 120]


async def test_two_schedulers_in_one_process_never_duplicate_a_fire(db: StateDB) -> None:
    schedules = [await add(db, interval_s=7, misfire_policy="catch_up") for _ in range(5)]
    a, b = Scheduler(db, REGISTRY), Scheduler(db, REGISTRY)
    for step in range(1, 40):
        await asyncio.gather(a.run_once(now=T0 + step * 5), b.run_once(now=T0 + step * 5))
    for s in schedules:
        runs = await runs_of(db, s["id"])
        assert [nominal(r) for r in runs] == list(range(T0 + 7, T0 + 196, 7))
        row = await get_schedule(db, s["id"])
        assert row["fire_count"] == len(runs)


class CustomAdapter:
    action_kind = "custom"

    def validate_args(self, args: dict[str, Any]) -> None:
        return None

    async def execute(
        self, task: dict[str, Any], *, cancellation: CancellationToken
    ) -> TaskExecutionResult:
        return TaskExecutionResult(status="completed", exit_code=0)


async def test_a_scheduler_evaluates_only_kinds_its_registry_serves(db: StateDB) -> None:
    wide = build_registry(extra_adapters=[CustomAdapter()])
    s = await add(db, action_kind="custom", args={}, registry=wide)
    assert (await Scheduler(db, REGISTRY).run_once(now=T0 + 60)).evaluated == 0
    assert (await get_schedule(db, s["id"]))["next_fire_at"] == T0 + 60  # still due
    assert len((await Scheduler(db, wide).run_once(now=T0 + 60)).task_ids) == 1


async def test_a_template_this_registry_rejects_is_recorded_and_left_due(db: StateDB) -> None:
    permissive = build_registry(AdapterConfig(command_allowlist=None))
    s = await add(db, args={"argv": ["date"]}, registry=permissive)
    scheduler = Scheduler(db, REGISTRY)  # its allowlist is true, echo
    report = await scheduler.run_once(now=T0 + 60)
    assert (report.evaluated, report.task_ids) == (1, [])
    row = await get_schedule(db, s["id"])
    assert "not evaluated" in row["last_error"] and row["next_fire_at"] == T0 + 60
    await scheduler.run_once(now=T0 + 61)
    assert scheduler.metrics.errors == 1  # recorded once, not every pass
    await Scheduler(db, permissive).run_once(now=T0 + 62)
    row = await get_schedule(db, s["id"])
    assert (row["last_error"], row["fire_count"]) == (None, 1)


# -- the loop and the worker ---------------------------------------------------------------------


async def test_stop_is_safe_twice_and_before_run_and_a_stopped_scheduler_is_not_reused(
    db: StateDB,
) -> None:
    idle = Scheduler(db, REGISTRY)
    idle.stop()
    idle.stop()
    assert idle.state is SchedulerState.STOPPED
    with pytest.raises(RuntimeError):
        await idle.run()
    s = await add(db, interval_s=60, now=time.time() - 90)  # due now by the store's clock
    scheduler = Scheduler(db, REGISTRY, interval_s=0.02)
    loop = asyncio.create_task(scheduler.run())
    for _ in range(500):
        if await runs_of(db, s["id"]):
            break
        await asyncio.sleep(0.01)
    scheduler.stop()
    scheduler.stop()
    await asyncio.wait_for(loop, 5)
    assert scheduler.state is SchedulerState.STOPPED
    assert len(await runs_of(db, s["id"])) == 1


async def test_the_worker_runtime_runs_the_scheduler_and_executes_the_fire(db: StateDB) -> None:
    s = await add(db, interval_s=3600, now=time.time() - 3700)
    config = WorkerConfig(concurrency=1, idle_wait_s=0.02, scheduler_interval_s=0.02)
    runtime = WorkerRuntime(db, REGISTRY, config)
    serving = asyncio.create_task(runtime.run())
    done: list[Row] = []
    for _ in range(1000):
        done = [r for r in await runs_of(db, s["id"]) if r["status"] == "completed"]
        if done:
            break
        await asyncio.sleep(0.01)
    runtime.request_stop()
    assert await asyncio.wait_for(serving, 10) == 0
    assert len(done) == 1 and done[0]["admission_source"] == "schedule"


async def test_a_worker_with_the_scheduler_disabled_admits_nothing(db: StateDB) -> None:
    s = await add(db, interval_s=3600, now=time.time() - 3700)
    config = WorkerConfig(concurrency=1, idle_wait_s=0.02, run_scheduler=False, exit_when_idle=True)
    assert await asyncio.wait_for(WorkerRuntime(db, REGISTRY, config).run(), 10) == 0
    assert await runs_of(db, s["id"]) == []


async def test_metrics_sum_the_recorded_counters(db: StateDB) -> None:
    await add(db, interval_s=60, misfire_policy="skip", misfire_grace_s=0)
    await add(db, interval_s=60)
    disabled = await add(db, interval_s=60)
    await disable_schedule(db, disabled["id"])
    await Scheduler(db, REGISTRY).run_once(now=T0 + 185)
    assert await schedule_metrics(db) == {
        "schedules": 3,
        "enabled": 2,
        "fires": 1,
        "overlap_skips": 0,
        "misfire_skips": 5,  # 3 skipped (none on time) + 2 before fire_once's latest
    }


# -- a template's secrets ---------------------------------------------------------------------


async def test_a_templates_env_is_redacted_in_every_read_but_fires_with_its_values(
    db: StateDB,
) -> None:
    s = await add(db, args={"argv": ["true"], "env": {"API_KEY": "s3cret"}})
    reads = [s, await get_schedule(db, s["id"]), *(await list_schedules(db))]
    for row in reads:
        assert row["action_args"]["env"] == {"API_KEY": "***"}
    assert "s3cret" not in repr(reads)
    # what fires the template admits it whole: the scheduler and a manual fire
    await Scheduler(db, REGISTRY).run_once(now=T0 + 61)
    manual = await fire_schedule(db, s["id"], registry=REGISTRY)
    for task_id in {r["id"] for r in await runs_of(db, s["id"])} | {manual}:
        row = await taskward.get_task(db, task_id, reveal_env=True)
        assert row["action_args"]["env"] == {"API_KEY": "s3cret"}
