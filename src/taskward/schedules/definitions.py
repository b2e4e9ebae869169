"""Schedule definitions and the operator's calls on them: checking and storing a schedule,
reading, enabling, disabling and removing it, and a manual fire (ADR-0072 D1, DESIGN.md R11,
R13). The scheduler that fires them is ``taskward.schedules.scheduler``."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any, Final

from taskward.adapters import build_registry
from taskward.admission import submit_task, validate_application
from taskward.cadence import (
    HORIZON_YEARS,
    Cadence,
    floor_epoch,
    make_cadence,
)
from taskward.canonical import dumps, loads
from taskward.errors import (
    ScheduleNotFound,
    TaskValidationError,
)
from taskward.ids import new_id
from taskward.lifecycle import ACTIVE
from taskward.models import (
    DEFAULT_EXECUTION_TARGET,
    TaskApplication,
    check_key,
    check_text,
    shown_text,
)
from taskward.reads import redact_args
from taskward.registry import TaskAdapterRegistry
from taskward.store.port import Row, StateDB

log = logging.getLogger("taskward.schedules")

MISFIRE_POLICIES: Final = ("skip", "fire_once", "catch_up")
OVERLAP_POLICIES: Final = ("allow", "skip")
DEFAULT_MISFIRE_POLICY: Final = "fire_once"
DEFAULT_OVERLAP_POLICY: Final = "allow"
DEFAULT_CATCH_UP_MAX: Final = 10
MAX_CATCH_UP: Final = 1000
DEFAULT_MISFIRE_GRACE_S: Final = 60
MAX_MISFIRE_GRACE_S: Final = 366 * 24 * 3600
MAX_NAME_LENGTH: Final = 200
MAX_LIST_LIMIT: Final = 1000
# Statuses of a run that is not finished: the overlap policy "skip" waits for none of them.
ACTIVE_STATUSES_JSON: Final = dumps(sorted(s.value for s in ACTIVE))
# Stands in for the per-fire key while a template is validated.
_TEMPLATE_KEY: Final = "schedule:template"


def schedule_fire_key(schedule_id: str, nominal_at: int) -> str:
    """The admission key of a scheduled fire (ADR-0072 D1): deterministic per cadence point."""
    return f"schedule:{schedule_id}:{nominal_at}"


def manual_fire_key(schedule_id: str) -> str:
    """A fresh key for a manual fire (R13): ``manual:<schedule-id>:<uuid4>``."""
    return f"manual:{schedule_id}:{uuid.uuid4()}"


def normalized(row: Row, *, reveal_env: bool = False) -> Row:
    """Rows read the same on both dialects: ``enabled`` a bool, ``pending_fires`` a list; the
    template's ``env`` values redacted as a task's are (``reads.redact_args``) unless
    ``reveal_env``: only what fires the template (the scheduler, ``fire_schedule``) reads them."""
    out = dict(row)
    out["enabled"] = bool(out["enabled"])
    pending = out.get("pending_fires")
    if isinstance(pending, str):
        out["pending_fires"] = loads(pending)
    if not reveal_env and "action_args" in out:
        out["action_args"] = redact_args(out["action_args"])
    return out


def cadence_of(row: Row) -> Cadence:
    return make_cadence(
        cron=row["cron_expression"],
        interval_s=row["interval_s"],
        timezone=row["timezone"],
        anchor_at=row["anchor_at"],
    )


def application_for(row: Row, key: str) -> TaskApplication:
    """The TaskApplication a schedule admits under ``key``."""
    return TaskApplication(
        action_kind=row["action_kind"],
        args=dict(row["action_args"]),
        execution_target=row["execution_target"],
        idempotency_key=key,
        required_capabilities=list(row["required_capabilities"] or []),
        library_ref=row["library_ref"],
        library_content_hash=row["library_content_hash"],
    )


def _check_int(field_name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise TaskValidationError(field_name, value, f"an integer {low}..{high}")
    return value


def _check_choice(field_name: str, value: object, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise TaskValidationError(field_name, value, allowed)
    assert isinstance(value, str)
    return value


_NAME_ALLOWED: Final = (
    f"a non-empty string of at most {MAX_NAME_LENGTH} printable characters without "
    "surrounding whitespace"
)


def _check_name(name: object) -> str:
    if not isinstance(name, str) or len(name) > MAX_NAME_LENGTH:
        shown = f"{len(name)} characters" if isinstance(name, str) else name
        raise TaskValidationError("name", shown, _NAME_ALLOWED)
    if not name.strip() or name != name.strip() or not name.isprintable():
        check_text("name", name)  # a NUL or a lone surrogate, named as such
        raise TaskValidationError("name", name, _NAME_ALLOWED)
    return name


def _check_texts(**fields: object) -> None:
    """The text rule of admission (``models.check_text``: valid UTF-8, no NUL) on each text
    field of a definition, before any of them is parsed, echoed in an error or stored (R14)."""
    for field_name, value in fields.items():
        if isinstance(value, str):
            check_text(field_name, value)


async def moment_of(db: StateDB, now: float | None) -> float:
    return now if now is not None else await db.now()


# -- the schedule rows ----------------------------------------------------------------------


async def create_schedule(
    db: StateDB,
    *,
    name: str,
    action_kind: str,
    args: dict[str, Any] | None = None,
    execution_target: str = DEFAULT_EXECUTION_TARGET,
    required_capabilities: Sequence[str] = (),
    library_ref: str | None = None,
    library_content_hash: str | None = None,
    cron: str | None = None,
    interval_s: int | None = None,
    timezone: str = "UTC",
    start_at: int | None = None,
    misfire_policy: str = DEFAULT_MISFIRE_POLICY,
    catch_up_max: int = DEFAULT_CATCH_UP_MAX,
    misfire_grace_s: int = DEFAULT_MISFIRE_GRACE_S,
    overlap_policy: str = DEFAULT_OVERLAP_POLICY,
    enabled: bool = True,
    registry: TaskAdapterRegistry | None = None,
    now: float | None = None,
) -> Row:
    """Create a schedule and return its row; its first fire is the first nominal time after
    ``now`` (for an interval, ``start_at`` if that is later: intervals count from it).

    Raises:
        TaskValidationError: a bad field, named (cron, timezone, interval_s, action_kind via the
            registry, args, ...); a name a live schedule already uses. Nothing is written.
    """
    _check_name(name)
    _check_texts(
        action_kind=action_kind,
        execution_target=execution_target,
        cron=cron,
        timezone=timezone,
        misfire_policy=misfire_policy,
        overlap_policy=overlap_policy,
    )
    _check_choice("misfire_policy", misfire_policy, MISFIRE_POLICIES)
    _check_int("catch_up_max", catch_up_max, 1, MAX_CATCH_UP)
    _check_int("misfire_grace_s", misfire_grace_s, 0, MAX_MISFIRE_GRACE_S)
    _check_choice("overlap_policy", overlap_policy, OVERLAP_POLICIES)
    if start_at is not None:
        if interval_s is None:
            raise TaskValidationError("start_at", start_at, "only with interval_s")
        _check_int("start_at", start_at, 0, 2**53)
    moment = await moment_of(db, now)
    current = floor_epoch(moment)
    anchor = None if interval_s is None else (current if start_at is None else start_at)
    cadence = make_cadence(cron=cron, interval_s=interval_s, timezone=timezone, anchor_at=anchor)
    template = validate_application(
        TaskApplication(
            action_kind=action_kind,
            args=args if args is not None else {},
            execution_target=execution_target,
            idempotency_key=_TEMPLATE_KEY,
            required_capabilities=list(required_capabilities),
            library_ref=library_ref,
            library_content_hash=library_content_hash,
        ),
        registry if registry is not None else build_registry(),
    )
    next_fire_at = cadence.next_after(current)
    if next_fire_at is None:
        raise TaskValidationError(
            "cron", cron, f"an expression that matches within {HORIZON_YEARS} years"
        )
    row = await db.fetchone(
        "schedule_insert",
        {
            "id": new_id(),
            "name": name,
            "cron_expression": cadence.cron.source if cadence.cron else None,
            "interval_s": interval_s,
            "anchor_at": anchor,
            "timezone": timezone,
            "enabled": bool(enabled),
            "action_kind": template.action_kind,
            "action_args": template.args_json,
            "execution_target": template.execution_target,
            "required_capabilities": dumps(template.required_capabilities),
            "library_ref": template.library_ref,
            "library_content_hash": template.library_content_hash,
            "misfire_policy": misfire_policy,
            "catch_up_max": catch_up_max,
            "misfire_grace_s": misfire_grace_s,
            "overlap_policy": overlap_policy,
            "next_fire_at": next_fire_at,
            "now": moment,
        },
    )
    if row is None:
        existing = await db.fetchone("schedule_get_by_name", {"name": name})
        raise TaskValidationError(
            "name",
            name,
            "a name no live schedule uses",
            message=f"name {name!r} is already used by schedule "
            f"{existing['id'] if existing else '?'}; choose another or remove that schedule",
        )
    return normalized(row)


async def get_schedule(db: StateDB, schedule_ref: str, *, reveal_env: bool = False) -> Row:
    """The schedule with this id (removed ones too), else the live one with this name; its
    template's ``env`` values redacted unless ``reveal_env`` (``normalized``).

    Raises:
        ScheduleNotFound: neither matches.
    """
    # No row holds a NUL or a lone surrogate (admission refuses both): not found, without SQL.
    if not isinstance(schedule_ref, str):
        raise ScheduleNotFound(repr(schedule_ref))
    if "\x00" in schedule_ref or shown_text(schedule_ref) != schedule_ref:
        raise ScheduleNotFound(shown_text(schedule_ref))
    row = await db.fetchone("schedule_get", {"id": schedule_ref})
    if row is None:
        row = await db.fetchone("schedule_get_by_name", {"name": schedule_ref})
    if row is None:
        raise ScheduleNotFound(schedule_ref)
    return normalized(row, reveal_env=reveal_env)


async def list_schedules(
    db: StateDB, *, include_removed: bool = False, limit: int = 100
) -> list[Row]:
    """Schedules, oldest first; removed ones (R11: kept, disabled) only when asked for."""
    _check_int("limit", limit, 1, MAX_LIST_LIMIT)
    rows = await db.fetchall(
        "schedule_list", {"include_removed": bool(include_removed), "limit": limit}
    )
    return [normalized(r) for r in rows]


def _refuse_removed(row: Row, action: str) -> None:
    if row["removed_at"] is not None:
        raise TaskValidationError(
            "schedule",
            row["id"],
            "a schedule that is not removed",
            message=f"schedule {row['id']} ({row['name']}) was removed and cannot be {action}; "
            "removed schedules stay disabled (R11): add a new one",
        )


async def enable_schedule(db: StateDB, schedule_ref: str, *, now: float | None = None) -> Row:
    """Enable a schedule; it resumes at the first nominal time after ``now`` (times passed while
    it was disabled are not misfires). Enabling an enabled schedule changes nothing.

    Raises:
        ScheduleNotFound; TaskValidationError for a removed schedule.
    """
    row = await get_schedule(db, schedule_ref)
    _refuse_removed(row, "enabled")
    if row["enabled"]:
        return row
    moment = await moment_of(db, now)
    updated = await db.fetchone(
        "schedule_enable",
        {
            "id": row["id"],
            "next_fire_at": cadence_of(row).next_after(floor_epoch(moment)),
            "now": moment,
        },
    )
    return normalized(updated) if updated else await get_schedule(db, row["id"])


async def disable_schedule(db: StateDB, schedule_ref: str, *, now: float | None = None) -> Row:
    """Disable a schedule (idempotent); fires it already decided are still admitted."""
    row = await get_schedule(db, schedule_ref)
    updated = await db.fetchone("schedule_disable", {"id": row["id"], "now": now})
    return normalized(updated) if updated else row


async def remove_schedule(db: StateDB, schedule_ref: str, *, now: float | None = None) -> Row:
    """Remove a schedule: disable it and mark it removed, never delete it (R11). Idempotent.

    Its row, its counters and every run it admitted stay; its name becomes free.
    """
    row = await get_schedule(db, schedule_ref)
    updated = await db.fetchone("schedule_remove", {"id": row["id"], "now": now})
    return normalized(updated) if updated else row


async def fire_schedule(
    db: StateDB,
    schedule_ref: str,
    *,
    idempotency_key: str | None = None,
    registry: TaskAdapterRegistry | None = None,
    now: float | None = None,
) -> str:
    """Admit the schedule's template now and return the task id — not evidence that it ran.

    The key is ``manual:<schedule-id>:<uuid4>`` (R13): generated unless the caller passes one
    of that shape (to retry the same manual fire safely). Manual fires ignore the enabled flag
    and the misfire and overlap policies, and do not move the schedule's cursor.

    Raises:
        ScheduleNotFound; TaskValidationError (a removed schedule, a malformed key, a template
        this registry rejects); TaskIdempotencyConflict.
    """
    row = await get_schedule(db, schedule_ref, reveal_env=True)  # the template is admitted
    _refuse_removed(row, "fired")
    key = manual_fire_key(row["id"]) if idempotency_key is None else idempotency_key
    check_key("idempotency_key", key)  # admission's key rule, before its shape is read
    prefix = f"manual:{row['id']}:"
    try:
        suffix = key.removeprefix(prefix)
        valid = (
            key.startswith(prefix)
            and str(uuid.UUID(suffix)) == suffix
            and uuid.UUID(suffix).version == 4
        )
    except (AttributeError, ValueError):
        valid = False
    if not valid:
        raise TaskValidationError("idempotency_key", key, f"{prefix}<uuid4>")
    return await submit_task(
        db,
        application_for(row, key),
        registry=registry,
        admission_source="schedule",
        schedule_id=row["id"],
        now=now,
    )


async def schedule_metrics(db: StateDB) -> dict[str, int]:
    """Totals for /metrics: schedules, enabled ones, recorded fires, overlap and misfire skips."""
    row = await db.fetchone("schedule_totals")
    assert row is not None
    return {name: int(value) for name, value in row.items()}
