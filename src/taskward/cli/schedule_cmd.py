"""``taskward schedule add|list|show|remove|enable|disable|fire`` over ``taskward.schedules``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from taskward import StateDB, TaskValidationError
from taskward.cli.common import (
    CliState,
    json_option,
    parse_args,
    pass_state,
    registry_for,
    template_options,
    with_db,
)
from taskward.cli.output import ID_WIDTH, cell, format_time, new_table, stacked, until
from taskward.schedules import (
    DEFAULT_CATCH_UP_MAX,
    DEFAULT_MISFIRE_GRACE_S,
    DEFAULT_MISFIRE_POLICY,
    DEFAULT_OVERLAP_POLICY,
    MAX_CATCH_UP,
    MAX_LIST_LIMIT,
    MISFIRE_POLICIES,
    OVERLAP_POLICIES,
    create_schedule,
    disable_schedule,
    enable_schedule,
    fire_schedule,
    get_schedule,
    list_schedules,
    manual_fire_key,
    remove_schedule,
)

Row = dict[str, Any]


def _parse_start_at(text: str | None) -> int | None:
    """``--start-at``: epoch seconds, or ISO-8601 with a UTC offset (``2026-01-05T09:00Z``)."""
    if text is None:
        return None
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise TaskValidationError(
            "--start-at", text, "epoch seconds or ISO-8601 with an offset"
        ) from exc
    if moment.tzinfo is None:
        raise TaskValidationError("--start-at", text, "an ISO-8601 time with an offset, e.g. Z")
    return int(moment.timestamp())


def cadence_text(row: Mapping[str, Any]) -> str:
    if row.get("cron_expression"):
        return f"cron {row['cron_expression']} ({row['timezone']})"
    return f"every {row['interval_s']}s"


def state_text(row: Mapping[str, Any]) -> str:
    if row.get("removed_at") is not None:
        return "removed"
    return "enabled" if row.get("enabled") else "disabled"


def _schedules_table(rows: list[Row]) -> Table:
    """Each schedule is its id with its name and cadence under it, then its state, kind, next
    fire (from now; none while disabled), fires and skips (overlap + misfire; ``--json`` has
    each): 80 columns fit."""
    table = new_table()
    table.add_column("id / name / cadence", no_wrap=True, max_width=ID_WIDTH)
    table.add_column("state", no_wrap=True)
    table.add_column("kind", overflow="fold")
    table.add_column("next", justify="right", no_wrap=True)
    table.add_column("fires", justify="right", no_wrap=True)
    table.add_column("skips", justify="right", no_wrap=True)
    now = time.time()
    for row in rows:
        upcoming = row["next_fire_at"] if state_text(row) == "enabled" else None
        table.add_row(
            stacked(row["id"], row["name"], cadence_text(row)),
            Text(state_text(row)),
            Text(row["action_kind"]),
            cell(None if upcoming is None else until(upcoming, now)),
            Text(str(row["fire_count"])),
            Text(str(row["overlap_skips"] + row["misfire_skips"])),
        )
    return table


def _show(state: CliState, row: Row) -> None:
    if state.output.is_json:
        state.output.json(row)
    else:
        state.output.task(row)  # a field/value table of any row


@click.group("schedule")
def schedule() -> None:
    """Add, inspect, enable, disable, remove and fire schedules.

    A schedule admits its task template at each nominal fire time (cron in a time zone, or every
    N seconds) through the same admission as 'task submit', keyed
    schedule:<schedule-id>:<epoch>; workers run the scheduler (docs/schedules.md).
    """


@schedule.command("add")
@click.argument("name")
@click.argument("kind")
@click.option("--cron", metavar="EXPR", help="Cron expression, e.g. '0 9 * * mon-fri'.")
@click.option("--every", type=click.IntRange(min=1), metavar="SECONDS", help="Fixed interval.")
@click.option(
    "--tz",
    "timezone",
    default="UTC",
    show_default=True,
    metavar="ZONE",
    help="IANA time zone the cron expression is read in.",
)
@click.option(
    "--start-at",
    metavar="TIME",
    help="With --every: the first fire (epoch seconds or ISO-8601); later ones count from it.",
)
@template_options
@click.option(
    "--misfire",
    type=click.Choice(MISFIRE_POLICIES),
    default=DEFAULT_MISFIRE_POLICY,
    show_default=True,
    help="Missed fire times: skip them, fire the latest once, or catch up (--catch-up-max).",
)
@click.option(
    "--catch-up-max",
    type=click.IntRange(1, MAX_CATCH_UP),
    default=DEFAULT_CATCH_UP_MAX,
    show_default=True,
    help="With --misfire catch_up: fire at most this many missed times, oldest first.",
)
@click.option(
    "--misfire-grace",
    type=click.IntRange(min=0),
    default=DEFAULT_MISFIRE_GRACE_S,
    show_default=True,
    metavar="SECONDS",
    help="A fire later than this is missed.",
)
@click.option(
    "--overlap",
    type=click.Choice(OVERLAP_POLICIES),
    default=DEFAULT_OVERLAP_POLICY,
    show_default=True,
    help="skip: no new fire while the schedule's previous run is not finished.",
)
@click.option("--disabled", is_flag=True, help="Create it disabled.")
@json_option
@pass_state
def schedule_add(
    state: CliState,
    name: str,
    kind: str,
    cron: str | None,
    every: int | None,
    timezone: str,
    start_at: str | None,
    args_text: str,
    target: str,
    capabilities: tuple[str, ...],
    library_ref: str | None,
    library_hash: str | None,
    misfire: str,
    catch_up_max: int,
    misfire_grace: int,
    overlap: str,
    disabled: bool,
) -> None:
    """Add schedule NAME admitting a task of action KIND; prints its id."""
    if (cron is None) == (every is None):
        raise TaskValidationError("--cron/--every", cron or every, "exactly one of --cron, --every")
    args = parse_args(args_text)
    registry = registry_for(state)
    anchor = _parse_start_at(start_at)

    async def work(db: StateDB) -> Row:
        return await create_schedule(
            db,
            name=name,
            action_kind=kind,
            args=args,
            execution_target=target,
            required_capabilities=capabilities,
            library_ref=library_ref,
            library_content_hash=library_hash,
            cron=cron,
            interval_s=every,
            timezone=timezone,
            start_at=anchor,
            misfire_policy=misfire,
            catch_up_max=catch_up_max,
            misfire_grace_s=misfire_grace,
            overlap_policy=overlap,
            enabled=not disabled,
            registry=registry,
        )

    row = with_db(state.db_url, work)
    if state.output.is_json:
        state.output.json(row)
        return
    state.output.line(row["id"])
    if row["enabled"]:
        state.output.notice(f"first fire at {format_time(row['next_fire_at'])}")


@schedule.command("list")
@click.option("--all", "include_removed", is_flag=True, help="Include removed schedules.")
@click.option("--limit", type=click.IntRange(1, MAX_LIST_LIMIT), default=100, show_default=True)
@json_option
@pass_state
def schedule_list(state: CliState, include_removed: bool, limit: int) -> None:
    """List schedules, oldest first (removed ones with --all)."""
    rows = with_db(
        state.db_url,
        lambda db: list_schedules(db, include_removed=include_removed, limit=limit),
    )
    if state.output.is_json:
        state.output.json({"schedules": rows})
    elif not rows:
        state.output.line("no schedules")
    else:
        state.output.out.print(_schedules_table(rows), width=state.output.width)


@schedule.command("show")
@click.argument("ref", metavar="ID|NAME")
@json_option
@pass_state
def schedule_show(state: CliState, ref: str) -> None:
    """Show one schedule: cadence, template, cursor, counters and last skip or error."""
    _show(state, with_db(state.db_url, lambda db: get_schedule(db, ref)))


@schedule.command("enable")
@click.argument("ref", metavar="ID|NAME")
@json_option
@pass_state
def schedule_enable(state: CliState, ref: str) -> None:
    """Enable a schedule; it resumes at its next fire time after now."""
    row = with_db(state.db_url, lambda db: enable_schedule(db, ref))
    if state.output.is_json:
        state.output.json(row)
    else:
        state.output.line(f"enabled {row['id']}; next fire at {format_time(row['next_fire_at'])}")


@schedule.command("disable")
@click.argument("ref", metavar="ID|NAME")
@json_option
@pass_state
def schedule_disable(state: CliState, ref: str) -> None:
    """Disable a schedule (no fires until enabled again)."""
    row = with_db(state.db_url, lambda db: disable_schedule(db, ref))
    if state.output.is_json:
        state.output.json(row)
    else:
        state.output.line(f"disabled {row['id']}")


@schedule.command("remove")
@click.argument("ref", metavar="ID|NAME")
@json_option
@pass_state
def schedule_remove(state: CliState, ref: str) -> None:
    """Remove a schedule: it is disabled and marked removed, never deleted; its runs stay."""
    row = with_db(state.db_url, lambda db: remove_schedule(db, ref))
    if state.output.is_json:
        state.output.json(row)
    else:
        state.output.line(f"removed {row['id']}")


@schedule.command("fire")
@click.argument("ref", metavar="ID|NAME")
@click.option(
    "--key",
    help="The manual:<schedule-id>:<uuid4> key of an earlier fire, to retry it safely. "
    "Generated and printed when omitted.",
)
@json_option
@pass_state
def schedule_fire(state: CliState, ref: str, key: str | None) -> None:
    """Admit the schedule's task now and print the task id (admitted, not yet run)."""
    out = state.output
    registry = registry_for(state)

    async def work(db: StateDB) -> tuple[str, str, str]:
        row = await get_schedule(db, ref)
        fire_key = manual_fire_key(row["id"]) if key is None else key
        task_id = await fire_schedule(db, row["id"], idempotency_key=fire_key, registry=registry)
        return row["id"], fire_key, task_id

    schedule_id, fire_key, task_id = with_db(state.db_url, work)
    if out.is_json:
        out.json(
            {
                "schedule_id": schedule_id,
                "task_id": task_id,
                "idempotency_key": fire_key,
                "key_generated": key is None,
            }
        )
        return
    out.line(task_id)
    out.notice(
        f"manual fire key {fire_key}; to retry this fire safely, pass --key {fire_key}. "
        f"The task is admitted, not yet run: watch it with taskward task wait {task_id}"
    )
