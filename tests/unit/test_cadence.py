"""Nominal fire times: the cron grammar, intervals and the DST rules (pure, no store)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from taskward.cadence import Cadence, CronExpression, make_cadence
from taskward.errors import TaskValidationError
from taskward.schedules import FirePlan, plan_fires


def epoch(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    return int(datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp())


def cron(expression: str, zone: str = "UTC") -> Cadence:
    return make_cadence(cron=expression, interval_s=None, timezone=zone)


def first(cadence: Cadence, after: int, n: int) -> list[int]:
    return list(itertools.islice(cadence.iter_after(after), n))


def test_cron_fields_ranges_steps_lists_and_names() -> None:
    c = CronExpression.parse("*/20 9-10,14 * jan-mar mon-fri")
    assert c.minutes == (0, 20, 40)
    assert c.hours == {9, 10, 14}
    assert c.months == {1, 2, 3}
    assert c.weekdays == {1, 2, 3, 4, 5}
    assert CronExpression.parse("5/15 * * * *").minutes == (5, 20, 35, 50)
    assert CronExpression.parse("0 0 * * 7").weekdays == {0}  # 7 is Sunday too
    assert CronExpression.parse("@daily") == CronExpression.parse("@daily")
    assert CronExpression.parse("@hourly").minutes == (0,)


def test_weekday_cron_skips_the_weekend() -> None:
    monday = epoch(2026, 1, 5)
    times = first(cron("0 9 * * mon-fri"), monday, 6)
    assert times == [
        epoch(2026, 1, 5, 9),
        epoch(2026, 1, 6, 9),
        epoch(2026, 1, 7, 9),
        epoch(2026, 1, 8, 9),
        epoch(2026, 1, 9, 9),
        epoch(2026, 1, 12, 9),
    ]


def test_both_day_fields_restricted_match_either_as_in_vixie_cron() -> None:
    # the 13th, or any Friday
    times = first(cron("0 0 13 * fri"), epoch(2026, 2, 1), 5)
    days = [datetime.fromtimestamp(t, UTC).day for t in times]
    assert days == [6, 13, 20, 27, 6]
    # a star day-of-month keeps only the weekday restriction
    assert [
        datetime.fromtimestamp(t, UTC).weekday() for t in first(cron("0 0 */1 * fri"), 0, 3)
    ] == [
        4,
        4,
        4,
    ]


def test_leap_day_cron_finds_the_next_leap_year_and_impossible_dates_never_fire() -> None:
    assert cron("0 0 29 2 *").next_after(epoch(2097, 1, 1)) == epoch(2104, 2, 29)
    assert cron("0 0 31 2 *").next_after(epoch(2026, 1, 1)) is None


@pytest.mark.parametrize(
    ("expression", "needle"),
    [
        ("61 * * * *", "minute value 61 is out of range 0-59"),
        ("* 24 * * *", "hour value 24"),
        ("* * 0 * *", "day-of-month value 0"),
        ("* * * 13 *", "month value 13"),
        ("* * * * 8", "day-of-week value 8"),
        ("* * * *", "4 fields"),
        ("*/0 * * * *", "step"),
        ("5-1 * * * *", "runs backwards"),
        ("x * * * *", "not a number"),
        ("@reboot", "unknown macro"),
        ("", "empty"),
    ],
)
def test_bad_cron_is_a_validation_error_naming_the_field(expression: str, needle: str) -> None:
    with pytest.raises(TaskValidationError, match=needle) as info:
        CronExpression.parse(expression)
    assert info.value.field == "cron"
    assert isinstance(info.value, ValueError)


def test_unknown_zone_and_bad_interval_name_their_fields() -> None:
    with pytest.raises(TaskValidationError) as info:
        make_cadence(cron="* * * * *", interval_s=None, timezone="Mars/Olympus")
    assert info.value.field == "timezone"
    with pytest.raises(TaskValidationError) as info:
        make_cadence(cron=None, interval_s=0, timezone="UTC", anchor_at=0)
    assert info.value.field == "interval_s"
    with pytest.raises(TaskValidationError) as info:
        make_cadence(cron="* * * * *", interval_s=5, timezone="UTC", anchor_at=0)
    assert info.value.field == "cron"


def test_interval_counts_from_its_anchor() -> None:
    c = make_cadence(cron=None, interval_s=30, timezone="Europe/Berlin", anchor_at=1000)
    assert c.next_after(0) == 1000
    assert c.next_after(1000) == 1030
    assert c.next_after(1029) == 1030
    assert c.latest_at_or_before(1059) == 1030
    assert c.latest_at_or_before(999) is None
    assert c.count_between(1000, 1090, cap=100) == 4
    assert c.count_between(1000, 1090, cap=2) == 2


def test_interval_ignores_daylight_saving() -> None:
    # Europe/Berlin springs forward at 2026-03-29 01:00Z; an interval keeps elapsed seconds.
    anchor = epoch(2026, 3, 29, 0, 30)
    c = make_cadence(cron=None, interval_s=1800, timezone="Europe/Berlin", anchor_at=anchor)
    assert first(c, anchor, 3) == [anchor + 1800, anchor + 3600, anchor + 5400]


def test_dst_gap_skips_the_missing_local_time_in_berlin() -> None:
    # 2026-03-29: 02:00 CET jumps to 03:00 CEST, so 02:30 does not exist that day.
    times = first(cron("30 2 * * *", "Europe/Berlin"), epoch(2026, 3, 27, 12), 3)
    assert times == [
        epoch(2026, 3, 28, 1, 30),
        epoch(2026, 3, 30, 0, 30),
        epoch(2026, 3, 31, 0, 30),
    ]


def test_dst_gap_skips_the_missing_local_time_in_new_york() -> None:
    # 2026-03-08: 02:00 EST jumps to 03:00 EDT.
    times = first(cron("30 2 * * *", "America/New_York"), epoch(2026, 3, 7, 12), 2)
    assert times == [epoch(2026, 3, 9, 6, 30), epoch(2026, 3, 10, 6, 30)]
    hourly = first(cron("0 * * * *", "America/New_York"), epoch(2026, 3, 8, 5, 30), 3)
    assert hourly == [
        epoch(2026, 3, 8, 6),
        epoch(2026, 3, 8, 7),
        epoch(2026, 3, 8, 8),
    ]  # 1, 3, 4 local


def test_ambiguous_local_time_fires_once_at_its_first_occurrence() -> None:
    # Europe/Berlin 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
    berlin = cron("30 2 * * *", "Europe/Berlin")
    times = first(berlin, epoch(2026, 10, 24, 12), 2)
    assert times == [epoch(2026, 10, 25, 0, 30), epoch(2026, 10, 26, 1, 30)]
    # from inside the repeated hour, the second 02:30 is not a fire
    assert berlin.next_after(epoch(2026, 10, 25, 1, 0)) == epoch(2026, 10, 26, 1, 30)
    # New York 2026-11-01: 01:00 happens at 05:00Z and again at 06:00Z; hourly fires once.
    hourly = first(cron("0 * * * *", "America/New_York"), epoch(2026, 11, 1, 4, 30), 3)
    assert hourly == [epoch(2026, 11, 1, 5), epoch(2026, 11, 1, 7), epoch(2026, 11, 1, 8)]


def test_latest_at_or_before_sees_first_occurrences_from_inside_a_repeated_hour() -> None:
    berlin = cron("50 2 * * *", "Europe/Berlin")
    # 01:10Z is 02:10 CET, inside the repeated hour: 02:50 CEST (00:50Z) already happened.
    assert berlin.latest_at_or_before(epoch(2026, 10, 25, 1, 10)) == epoch(2026, 10, 25, 0, 50)
    times = list(itertools.islice(berlin.iter_at_or_before(epoch(2026, 10, 27)), 3))
    assert times == [
        epoch(2026, 10, 26, 1, 50),
        epoch(2026, 10, 25, 0, 50),
        epoch(2026, 10, 24, 0, 50),
    ]


def plan(
    policy: str,
    *,
    now: int,
    grace: int = 30,
    n: int = 3,
    overlap: str = "allow",
    busy: bool = False,
) -> FirePlan:
    c = make_cadence(cron=None, interval_s=60, timezone="UTC", anchor_at=0)
    return plan_fires(
        c,
        cursor=60,
        now=now,
        misfire_policy=policy,
        catch_up_max=n,
        misfire_grace_s=grace,
        overlap_policy=overlap,
        has_active_run=busy,
    )


def test_plan_on_time_fire_is_the_same_under_every_policy() -> None:
    for policy in ("skip", "fire_once", "catch_up"):
        p = plan(policy, now=65)
        assert (p.fires, p.misfire_skips, p.next_fire_at) == ((60,), 0, 120)


def test_plan_misfire_policies_after_an_absence() -> None:
    # due: 60 .. 600 (10 times); the latest is 5 s old (within grace)
    skip = plan("skip", now=605)
    assert (skip.fires, skip.misfire_skips, skip.last_skip_at) == ((600,), 9, 540)
    late_skip = plan("skip", now=645)  # the latest is 45 s old: missed too
    assert (late_skip.fires, late_skip.misfire_skips, late_skip.last_skip_at) == ((), 10, 600)
    once = plan("fire_once", now=645)
    assert (once.fires, once.misfire_skips, once.last_skip_reason) == ((600,), 9, "misfire")
    catch_up = plan("catch_up", now=645, n=3)
    assert (catch_up.fires, catch_up.misfire_skips) == ((480, 540, 600), 7)
    assert catch_up.next_fire_at == 660


def test_plan_overlap_skip_admits_at_most_one_and_none_while_busy() -> None:
    p = plan("catch_up", now=605, n=3, overlap="skip")
    assert (p.fires, p.overlap_skipped, p.last_skip_reason, p.last_skip_at) == (
        (480,),
        (540, 600),
        "overlap",
        600,
    )
    busy = plan("fire_once", now=65, overlap="skip", busy=True)
    assert (busy.fires, busy.overlap_skipped, busy.misfire_skips) == ((), (60,), 0)
