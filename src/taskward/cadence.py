"""Nominal fire times of a schedule: cron expressions and fixed intervals, in an IANA zone.

Pure functions over integer UTC epoch seconds (DESIGN.md R13); no I/O and no clock — callers
pass the instant to search from. The scheduler (``taskward.schedules``) decides what to admit.

Cron: five fields, ``minute hour day-of-month month day-of-week``, each ``*``, a number, a
range ``a-b``, a step ``*/s``, ``a-b/s`` or ``a/s``, or a comma list of these; month and weekday
names (``jan``, ``mon``); weekday 0 and 7 are Sunday; the macros ``@yearly`` (``@annually``),
``@monthly``, ``@weekly``, ``@daily`` (``@midnight``) and ``@hourly``. As in Vixie cron, when
both day fields are restricted (neither starts with ``*``) a day matches if either does.
Not supported: seconds, ``L``, ``W``, ``#``, ``?``, ``@reboot``.

The fields are matched against local wall-clock time in the schedule's zone:

* a local time that does not exist (the spring-forward gap) is skipped — no fire that day;
* a local time that happens twice (the fall-back fold) fires once, at its first occurrence.

Intervals are elapsed seconds from an anchor (``anchor_at + k * interval_s``); a zone does not
move them. An expression that never matches within ``HORIZON_YEARS`` is rejected.
"""

from __future__ import annotations

import calendar
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from taskward.errors import TaskValidationError

HORIZON_YEARS: Final = 10  # covers leap days across 2100 (2096 -> 2104)
MAX_INTERVAL_S: Final = 366 * 24 * 3600 * HORIZON_YEARS

_MINUTE: Final = timedelta(minutes=1)
_HOUR: Final = timedelta(hours=1)
_DAY: Final = timedelta(days=1)
# Wider than any UTC-offset change ever used, so a search backwards from a time inside a
# repeated (fall-back) hour still sees the first occurrences of that hour's wall times.
_FOLD_MARGIN: Final = timedelta(hours=3)

_MACROS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS: Final = {
    name: i
    for i, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
_WEEKDAYS: Final = {
    name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
}
# (field name, low, high, names)
_FIELDS: Final[tuple[tuple[str, int, int, dict[str, int]], ...]] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 7, _WEEKDAYS),
)
CRON_SYNTAX: Final = (
    "five fields 'minute hour day-of-month month day-of-week' (e.g. '0 9 * * mon-fri') "
    "or @yearly, @monthly, @weekly, @daily, @hourly"
)


def _cron_error(expression: str, problem: str) -> TaskValidationError:
    return TaskValidationError(
        "cron",
        expression,
        CRON_SYNTAX,
        message=f"cron {expression!r} is invalid: {problem}; allowed: {CRON_SYNTAX}",
    )


def _number(expression: str, field: str, text: str, names: dict[str, int]) -> int:
    lowered = text.lower()
    if lowered in names:
        return names[lowered]
    if not text.isdigit():
        raise _cron_error(expression, f"{field} value {text!r} is not a number")
    return int(text)


def _parse_field(
    expression: str, field: str, text: str, low: int, high: int, names: dict[str, int]
) -> frozenset[int]:
    values: set[int] = set()
    for item in text.split(","):
        base, _, step_text = item.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise _cron_error(
                    expression, f"{field} step {step_text!r} is not a positive number"
                )
            step = int(step_text)
        if base == "*":
            start, stop = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            start = _number(expression, field, a, names)
            stop = _number(expression, field, b, names)
        else:
            start = _number(expression, field, base, names)
            stop = high if step_text else start  # `a/s` means a through the maximum
        for value in (start, stop):
            if not low <= value <= high:
                raise _cron_error(expression, f"{field} value {value} is out of range {low}-{high}")
        if start > stop:
            raise _cron_error(expression, f"{field} range {base!r} runs backwards")
        values.update(range(start, stop + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class CronExpression:
    """A parsed five-field cron expression, matched against naive local wall-clock time."""

    source: str
    minutes: tuple[int, ...]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    days_either: bool  # both day fields restricted: either may match (Vixie cron)

    @classmethod
    def parse(cls, expression: str) -> CronExpression:
        """Parse ``expression``; raises TaskValidationError naming the field ``cron``."""
        if not isinstance(expression, str) or not expression.strip():
            raise _cron_error(str(expression), "it is empty")
        text = _MACROS.get(expression.strip().lower(), expression.strip())
        if text.startswith("@"):
            raise _cron_error(expression, f"unknown macro {text!r}")
        parts = text.split()
        if len(parts) != 5:
            raise _cron_error(expression, f"it has {len(parts)} fields, not 5")
        parsed = [
            _parse_field(expression, name, part, low, high, names)
            for part, (name, low, high, names) in zip(parts, _FIELDS, strict=True)
        ]
        weekdays = frozenset(0 if d == 7 else d for d in parsed[4])
        return cls(
            source=expression.strip(),
            minutes=tuple(sorted(parsed[0])),
            hours=parsed[1],
            days=parsed[2],
            months=parsed[3],
            weekdays=weekdays,
            days_either=not parts[2].startswith("*") and not parts[4].startswith("*"),
        )

    def _day_matches(self, t: datetime) -> bool:
        in_days = t.day in self.days
        in_weekdays = (t.weekday() + 1) % 7 in self.weekdays
        return (in_days or in_weekdays) if self.days_either else (in_days and in_weekdays)

    def next_local(self, after: datetime) -> datetime | None:
        """The first matching naive wall time strictly after ``after`` (None past the horizon)."""
        t = after.replace(second=0, microsecond=0) + _MINUTE
        limit = t.year + HORIZON_YEARS
        while t.year <= limit:
            if t.month not in self.months:
                year, month = (t.year + 1, 1) if t.month == 12 else (t.year, t.month + 1)
                t = datetime(year, month, 1)
            elif not self._day_matches(t):
                t = datetime(t.year, t.month, t.day) + _DAY
            elif t.hour not in self.hours:
                t = t.replace(minute=0) + _HOUR
            else:
                minute = next((m for m in self.minutes if m >= t.minute), None)
                if minute is not None:
                    return t.replace(minute=minute)
                t = t.replace(minute=0) + _HOUR
        return None

    def prev_local(self, at_or_before: datetime) -> datetime | None:
        """The last matching naive wall time at or before ``at_or_before`` (None past the
        horizon)."""
        t = at_or_before.replace(second=0, microsecond=0)
        limit = t.year - HORIZON_YEARS
        while t.year >= limit:
            if t.month not in self.months:
                t = datetime(t.year, t.month, 1) - _MINUTE
            elif not self._day_matches(t):
                t = datetime(t.year, t.month, t.day) - _MINUTE
            elif t.hour not in self.hours:
                t = t.replace(minute=0) - _MINUTE
            else:
                minute = next((m for m in reversed(self.minutes) if m <= t.minute), None)
                if minute is not None:
                    return t.replace(minute=minute)
                t = t.replace(minute=0) - _MINUTE
        return None


def load_zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``; raises TaskValidationError naming the field ``timezone``."""
    allowed = "an IANA time zone name such as UTC, Europe/Berlin or America/New_York"
    if not isinstance(name, str) or not name.strip():
        raise TaskValidationError("timezone", name, allowed)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise TaskValidationError("timezone", name, allowed) from exc


def _local(epoch: int, zone: ZoneInfo) -> datetime:
    """The naive wall time of ``epoch`` in ``zone``."""
    return datetime.fromtimestamp(epoch, zone).replace(tzinfo=None, fold=0)


def local_to_epoch(wall: datetime, zone: ZoneInfo) -> int | None:
    """UTC epoch seconds of naive wall time ``wall`` in ``zone``.

    None when the wall time does not exist (a DST gap). An ambiguous wall time (a DST fold)
    resolves to its first occurrence (``fold=0``), so it fires once.
    """
    epoch = calendar.timegm(wall.replace(tzinfo=zone, fold=0).utctimetuple())
    return epoch if _local(epoch, zone) == wall else None


@dataclass(frozen=True)
class Cadence:
    """When a schedule fires: exactly one of ``cron`` or ``interval_s``."""

    zone: ZoneInfo
    cron: CronExpression | None = None
    interval_s: int | None = None
    anchor_at: int = 0  # intervals: nominal times are anchor_at + k * interval_s, k >= 0

    def iter_after(self, t: int) -> Iterator[int]:
        """Nominal times strictly after ``t``, ascending (ends past the cron horizon)."""
        if self.interval_s is not None:
            k = 0 if t < self.anchor_at else (t - self.anchor_at) // self.interval_s + 1
            while True:
                yield self.anchor_at + k * self.interval_s
                k += 1
        assert self.cron is not None
        wall: datetime | None = _local(t, self.zone)
        while wall is not None:
            wall = self.cron.next_local(wall)
            if wall is not None:
                epoch = local_to_epoch(wall, self.zone)
                # Wall times map to epochs monotonically (first occurrences), so skipping gap
                # times and, when t lies in a repeated hour, first occurrences already past
                # yields every later nominal time once.
                if epoch is not None and epoch > t:
                    yield epoch

    def iter_at_or_before(self, t: int) -> Iterator[int]:
        """Nominal times at or before ``t``, descending (ends at the first / the horizon)."""
        if self.interval_s is not None:
            if t < self.anchor_at:
                return
            k = (t - self.anchor_at) // self.interval_s
            while k >= 0:
                yield self.anchor_at + k * self.interval_s
                k -= 1
            return
        assert self.cron is not None
        # Start past t: inside a repeated hour, wall times later than t's own still have
        # first occurrences before t.
        wall: datetime | None = _local(t, self.zone) + _FOLD_MARGIN
        while wall is not None:
            wall = self.cron.prev_local(wall)
            if wall is not None:
                epoch = local_to_epoch(wall, self.zone)
                if epoch is not None and epoch <= t:
                    yield epoch
                wall -= _MINUTE

    def next_after(self, t: int) -> int | None:
        """The first nominal time strictly after ``t`` (None: no further fire)."""
        return next(self.iter_after(t), None)

    def latest_at_or_before(self, t: int) -> int | None:
        """The last nominal time at or before ``t`` (None: there is none)."""
        return next(self.iter_at_or_before(t), None)

    def count_between(self, first: int, last: int, *, cap: int) -> int:
        """How many nominal times lie in ``[first, last]``, counting at most ``cap``."""
        if last < first:
            return 0
        if self.interval_s is not None:
            start = self.next_after(first - 1)
            assert start is not None
            return 0 if start > last else min(cap, (last - start) // self.interval_s + 1)
        count = 0
        for epoch in self.iter_after(first - 1):
            if epoch > last or count >= cap:
                break
            count += 1
        return count


def make_cadence(
    *,
    cron: str | None,
    interval_s: int | None,
    timezone: str,
    anchor_at: int | None = None,
) -> Cadence:
    """Build and validate a cadence; raises TaskValidationError naming the bad field."""
    zone = load_zone(timezone)
    if (cron is None) == (interval_s is None):
        raise TaskValidationError(
            "cron", cron, "exactly one of a cron expression or interval_s (seconds)"
        )
    if interval_s is not None:
        if isinstance(interval_s, bool) or not isinstance(interval_s, int):
            raise TaskValidationError("interval_s", interval_s, f"an integer 1..{MAX_INTERVAL_S}")
        if not 1 <= interval_s <= MAX_INTERVAL_S:
            raise TaskValidationError("interval_s", interval_s, f"1..{MAX_INTERVAL_S} seconds")
        if anchor_at is None:
            raise TaskValidationError(
                "anchor_at", anchor_at, "the epoch second intervals count from"
            )
        return Cadence(zone=zone, interval_s=interval_s, anchor_at=anchor_at)
    assert cron is not None
    return Cadence(zone=zone, cron=CronExpression.parse(cron))


def floor_epoch(now: float) -> int:
    """Fire times are whole UTC seconds (R13): the last whole second at or before ``now``."""
    return math.floor(now)


def utc_iso(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
