"""View model of the schedules page: one row per schedule, its cadence in words, when it fires
next (only while enabled: a disabled or removed schedule fires never, so it shows none), a cron
schedule's times in its own zone beside UTC, and its skips spelled out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import quote
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from taskward.dashboard.views import Region, action_cell, cell, fmt_ago, fmt_time, table, task_href

SCHEDULE_COLUMNS: Final = (
    "name",
    "cadence",
    "state",
    "next fire",
    "last fire",
    "fires",
    "skipped: previous still running",
    "skipped: fire time missed",
    "last task",
    "last error",
    "",
)


def _zone(row: Mapping[str, Any]) -> ZoneInfo | None:
    """A cron schedule's zone, when it is not UTC (an unknown name: None, shown as UTC)."""
    name = row.get("timezone")
    if not row.get("cron_expression") or not name or name in {"UTC", "Etc/UTC"}:
        return None
    try:
        return ZoneInfo(str(name))
    except (ZoneInfoNotFoundError, ValueError):
        return None


def when(at: Any, row: Mapping[str, Any], now: float) -> tuple[str, str | None]:
    """(text, tooltip) of a schedule's instant: in its zone and UTC for a cron schedule in a
    zone (``2026-12-24 18:00 CET · 17:00 UTC``), else UTC; the tooltip says how far off."""
    if not isinstance(at, int | float):
        return "-", None
    zone = _zone(row)
    rel = fmt_ago(now - float(at))
    if zone is None:
        return fmt_time(at), rel
    local = datetime.fromtimestamp(float(at), zone)
    utc = datetime.fromtimestamp(float(at), UTC)
    text = f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()} \u00b7 {utc:%H:%M:%S} UTC"
    return text, f"{rel} ({zone.key})"


def cadence_text(row: Mapping[str, Any]) -> str:
    if row.get("cron_expression"):
        return f"cron {row['cron_expression']} in {row.get('timezone') or 'UTC'}"
    seconds = row.get("interval_s")
    return f"every {seconds:g} s" if isinstance(seconds, int | float) else "-"


def schedule_state(row: Mapping[str, Any]) -> str:
    if row.get("removed_at") is not None:
        return "removed"
    return "enabled" if row.get("enabled") else "disabled"


def schedules_regions(
    rows: Iterable[Mapping[str, Any]], *, can_operate: bool, now: float
) -> dict[str, Region]:
    lines = []
    for row in rows:
        ref = quote(str(row["id"]), safe="")
        state = schedule_state(row)
        actions: list[tuple[str, str]] = []
        if can_operate and state != "removed":
            actions.append(("fire now", f"/schedules/{ref}/fire"))
            toggle = "disable" if state == "enabled" else "enable"
            actions.append((toggle, f"/schedules/{ref}/{toggle}"))
        if state == "enabled":
            next_text, next_title = when(row.get("next_fire_at"), row, now)
        else:
            next_text, next_title = f"none ({state})", None
        last_text, last_title = when(row.get("last_fire_at"), row, now)
        last_run = row.get("last_run_id")
        lines.append(
            [
                cell(row["name"]),
                cell(cadence_text(row)),
                cell(state, cls=f"schedule-{state}"),
                cell(next_text, title=next_title, cls="when"),
                cell(last_text, title=last_title, cls="when"),
                cell(row.get("fire_count", 0), cls="num"),
                cell(row.get("overlap_skips", 0), cls="num"),
                cell(row.get("misfire_skips", 0), cls="num"),
                cell(last_run, href=task_href(last_run) if last_run else None, cls="mono"),
                cell(row.get("last_error")),
                action_cell(actions),
            ]
        )
    return {"schedules": table(SCHEDULE_COLUMNS, lines, empty="no schedules")}
