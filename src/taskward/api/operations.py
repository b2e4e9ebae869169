"""The ``/api/schedules`` and ``/api/outbox`` routes, over ``taskward.schedules`` and
``taskward.outbox``: reads need ``read``; creating a schedule admits work, so it needs
``submit``; fire, enable, disable, remove and an outbox retry are operations (``operate``).
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import APIRouter, Body, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from taskward.api.models import iso_twin
from taskward.api.tasks import IdempotencyHeader, problems
from taskward.cursors import MAX_CURSOR_LENGTH
from taskward.errors import NotificationNotFound, ScheduleNotFound, TaskValidationError
from taskward.outbox import (
    MAX_LIST_LIMIT as OUTBOX_MAX_LIST,
)
from taskward.outbox import (
    OUTBOX_STATUSES,
    count_notifications,
    get_notification,
    list_notifications,
    retry_notification,
)
from taskward.schedules import (
    DEFAULT_CATCH_UP_MAX,
    DEFAULT_MISFIRE_GRACE_S,
    DEFAULT_MISFIRE_POLICY,
    DEFAULT_OVERLAP_POLICY,
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
from taskward.schedules import (
    MAX_LIST_LIMIT as SCHEDULE_MAX_LIST,
)
from taskward.store import StateDB
from taskward.web.auth import Principal, require
from taskward.web.state import services_of, store_of

MAX_REF_LENGTH: Final = 255

Db = Annotated[StateDB, Depends(store_of)]


def _enum(values: Any) -> dict[str, Any]:
    return {"enum": list[JsonValue](values)}


def _no_nul(field: str, value: Any) -> None:
    """Refuse NUL characters in text before the store sees them (PostgreSQL cannot keep them)."""
    if isinstance(value, str):
        if "\x00" in value:
            raise TaskValidationError(field, value, "text without NUL characters")
    elif isinstance(value, dict):
        for key, item in value.items():
            _no_nul(f"{field} key", key)
            _no_nul(f"{field}.{key}", item)
    elif isinstance(value, list):
        for item in value:
            _no_nul(field, item)


# -- schedules --------------------------------------------------------------------------------


class ScheduleCreate(BaseModel):
    """A schedule: a cadence (exactly one of ``cron_expression`` and ``interval_s``) and the
    task it admits at every fire, keyed ``schedule:<id>:<nominal-fire-epoch>`` (ADR-0072 D1).

    The fields are the schedule's own, as ``GET /api/schedules/{ref}`` returns them. ``cron``,
    ``args`` and ``start_at`` are the earlier names of ``cron_expression``, ``action_args`` and
    ``anchor_at``: still accepted (deprecated, answered with a ``Deprecation`` header; removed
    in a later release); a field and its earlier name together are a 422."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "nightly-report",
                    "action_kind": "command",
                    "action_args": {"argv": ["echo", "report"]},
                    "cron_expression": "0 2 * * *",
                    "timezone": "UTC",
                }
            ]
        },
    )

    name: str
    action_kind: str
    action_args: dict[str, Any] | None = Field(
        default=None, description="The admitted task's args (a JSON object; default {})."
    )
    execution_target: str = "host"
    required_capabilities: list[str] = Field(default_factory=list)
    library_ref: str | None = None
    library_content_hash: str | None = None
    cron_expression: str | None = Field(default=None, description="Five-field cron expression.")
    interval_s: int | None = Field(default=None, description="Seconds between fires.")
    timezone: str = "UTC"
    anchor_at: int | None = Field(default=None, description="Epoch second intervals count from.")
    misfire_policy: str = Field(
        default=DEFAULT_MISFIRE_POLICY, json_schema_extra=_enum(MISFIRE_POLICIES)
    )
    catch_up_max: int = DEFAULT_CATCH_UP_MAX
    misfire_grace_s: int = DEFAULT_MISFIRE_GRACE_S
    overlap_policy: str = Field(
        default=DEFAULT_OVERLAP_POLICY, json_schema_extra=_enum(OVERLAP_POLICIES)
    )
    enabled: bool = True
    # The earlier names (see above); pydantic marks them deprecated in the OpenAPI document.
    cron: str | None = Field(default=None, deprecated="use cron_expression")
    args: dict[str, Any] | None = Field(default=None, deprecated="use action_args")
    start_at: int | None = Field(default=None, deprecated="use anchor_at")


# The schedule's field (as stored and returned) -> the library's parameter, its earlier name.
SCHEDULE_RENAMES: Final = {
    "cron_expression": "cron",
    "action_args": "args",
    "anchor_at": "start_at",
}


def schedule_arguments(body: ScheduleCreate) -> tuple[dict[str, Any], list[str]]:
    """``create_schedule``'s keyword arguments from a body, and the earlier names it used.

    Raises:
        TaskValidationError: a field and its earlier name both given.
    """
    fields = body.model_dump(exclude_unset=True)
    used_old = []
    for field, old in SCHEDULE_RENAMES.items():
        if field in fields and old in fields:
            raise TaskValidationError(
                field,
                fields[field],
                f"{field} alone ({old} is its deprecated name)",
                message=f"{field} and {old} are the same field ({old} is its deprecated name): "
                f"give {field} only",
            )
        if old in fields:
            used_old.append(old)
        elif field in fields:
            fields[old] = fields.pop(field)
    if fields.get("args") is None:
        fields.pop("args", None)
    return fields, used_old


def _renamed(exc: TaskValidationError, used_old: list[str]) -> TaskValidationError:
    """A library error named by the library's parameter (``cron``, ``args.argv``), named by
    the body's field instead when the body used the current name."""
    for field, old in SCHEDULE_RENAMES.items():
        if old in used_old:
            continue
        if exc.field == old or exc.field.startswith((f"{old}.", f"{old}[")):
            exc.field = field + exc.field[len(old) :]
            if exc.message.startswith(old):
                exc.message = field + exc.message[len(old) :]
            break
    return exc


class ScheduleOut(BaseModel):
    """A schedules row (times are epoch seconds); every column is returned."""

    model_config = ConfigDict(extra="allow")

    id: str
    name: str
    enabled: bool
    action_kind: str
    next_fire_at: int | None = None
    next_fire_at_iso: str | None = iso_twin("next_fire_at")


class ScheduleList(BaseModel):
    schedules: list[ScheduleOut]


class FireRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    idempotency_key: str | None = Field(
        default=None,
        description="`manual:<schedule-id>:<uuid4>`; generated when absent (R13). Send the "
        "returned key again to retry the same manual fire safely.",
    )


class FireResult(BaseModel):
    schedule_id: str
    task_id: str
    idempotency_key: str
    key_generated: bool


schedules_router = APIRouter(prefix="/api/schedules", tags=["schedules"])


def _check_ref(ref: str, kind: str) -> None:
    if "\x00" in ref or len(ref) > MAX_REF_LENGTH:
        if kind == "schedule":
            raise ScheduleNotFound(ref[:MAX_REF_LENGTH])
        raise NotificationNotFound(ref[:MAX_REF_LENGTH])


@schedules_router.get(
    "",
    name="list_schedules",
    response_model=ScheduleList,
    summary="Schedules, oldest first",
    responses=problems(401, 403, 422, 503),
)
async def schedules(
    _principal: Annotated[Principal, Depends(require("read"))],
    db: Db,
    include_removed: bool = False,
    limit: Annotated[int, Query(ge=1, le=SCHEDULE_MAX_LIST)] = 100,
) -> dict[str, Any]:
    return {"schedules": await list_schedules(db, include_removed=include_removed, limit=limit)}


@schedules_router.post(
    "",
    name="create_schedule",
    status_code=201,
    response_model=ScheduleOut,
    summary="Create a schedule",
    responses=problems(401, 403, 413, 422, 503),
)
async def create(
    request: Request,
    response: Response,
    body: ScheduleCreate,
    _principal: Annotated[Principal, Depends(require("submit"))],
    db: Db,
) -> dict[str, Any]:
    """Validated like a submission (the template goes through admission's validation); a bad
    field is a 422 naming it, and nothing is stored. The earlier names ``cron``, ``args`` and
    ``start_at`` are deprecated: the answer then has a ``Deprecation: true`` header."""
    fields, used_old = schedule_arguments(body)
    try:
        for name, value in fields.items():
            _no_nul(name, value)
        row = await create_schedule(
            db,
            **fields,
            registry=services_of(request).registry,
        )
    except TaskValidationError as exc:
        raise _renamed(exc, used_old) from None
    if used_old:
        response.headers["Deprecation"] = "true"
    return row


@schedules_router.get(
    "/{schedule_ref}",
    name="get_schedule",
    response_model=ScheduleOut,
    summary="One schedule, by id or by the name of a live one",
    responses=problems(401, 403, 404, 422, 503),
)
async def schedule(
    schedule_ref: str,
    _principal: Annotated[Principal, Depends(require("read"))],
    db: Db,
) -> dict[str, Any]:
    _check_ref(schedule_ref, "schedule")
    return await get_schedule(db, schedule_ref)


@schedules_router.post(
    "/{schedule_ref}/fire",
    name="fire_schedule",
    response_model=FireResult,
    summary="Fire a schedule now (admits its task; not evidence that it ran)",
    responses=problems(401, 403, 404, 409, 413, 422, 503),
)
async def fire(
    request: Request,
    response: Response,
    schedule_ref: str,
    _principal: Annotated[Principal, Depends(require("operate"))],
    db: Db,
    body: Annotated[FireRequest | None, Body()] = None,
    idempotency_key: IdempotencyHeader = None,
) -> FireResult:
    _check_ref(schedule_ref, "schedule")
    body_key = (body or FireRequest()).idempotency_key
    if body_key is not None and idempotency_key is not None and body_key != idempotency_key:
        raise TaskValidationError(
            "idempotency_key",
            body_key,
            "the same key in the body and the Idempotency-Key header, or only one of them",
        )
    row = await get_schedule(db, schedule_ref)
    key = body_key if body_key is not None else idempotency_key
    generated = key is None
    if key is None:
        key = manual_fire_key(row["id"])
    _no_nul("idempotency_key", key)
    task_id = await fire_schedule(
        db, row["id"], idempotency_key=key, registry=services_of(request).registry
    )
    if all(" " <= c <= "~" for c in key):
        response.headers["Idempotency-Key"] = key
    return FireResult(
        schedule_id=row["id"], task_id=task_id, idempotency_key=key, key_generated=generated
    )


def _schedule_action(action: str, summary: str) -> None:
    operation = {"enable": enable_schedule, "disable": disable_schedule, "remove": remove_schedule}[
        action
    ]

    async def route(
        schedule_ref: str,
        _principal: Annotated[Principal, Depends(require("operate"))],
        db: Db,
    ) -> dict[str, Any]:
        _check_ref(schedule_ref, "schedule")
        return await operation(db, schedule_ref)

    route.__name__ = f"{action}_schedule"
    schedules_router.post(
        f"/{{schedule_ref}}/{action}",
        name=f"{action}_schedule",
        response_model=ScheduleOut,
        summary=summary,
        responses=problems(401, 403, 404, 422, 503),
    )(route)


_schedule_action("enable", "Enable a schedule (it resumes at its next nominal time)")
_schedule_action("disable", "Disable a schedule (idempotent)")
_schedule_action("remove", "Remove a schedule: disabled and kept, never deleted (R11)")


# -- the outbox -------------------------------------------------------------------------------


class NotificationOut(BaseModel):
    """A dispatch_outbox row (times are epoch seconds); every column is returned."""

    model_config = ConfigDict(extra="allow")

    id: str
    kind: str
    status: str
    attempts: int
    schedule_run_id: str | None = None


class NotificationPage(BaseModel):
    notifications: list[NotificationOut]
    next_cursor: str | None
    counts: dict[str, int] = Field(description="Rows per outbox status (all of them).")


outbox_router = APIRouter(prefix="/api/outbox", tags=["outbox"])


@outbox_router.get(
    "",
    name="list_notifications",
    response_model=NotificationPage,
    summary="Task notifications, newest first, with counts by status",
    responses=problems(401, 403, 422, 503),
)
async def notifications(
    _principal: Annotated[Principal, Depends(require("read"))],
    db: Db,
    status: Annotated[str | None, Query(json_schema_extra=_enum(OUTBOX_STATUSES))] = None,
    task_id: Annotated[str | None, Query(max_length=MAX_REF_LENGTH)] = None,
    limit: Annotated[int, Query(ge=1, le=OUTBOX_MAX_LIST)] = 50,
    cursor: Annotated[str | None, Query(max_length=MAX_CURSOR_LENGTH)] = None,
) -> dict[str, Any]:
    for name, value in (("task_id", task_id), ("cursor", cursor)):
        _no_nul(name, value)
    rows, next_cursor = await list_notifications(
        db, status=status, task_id=task_id, limit=limit, cursor=cursor
    )
    return {
        "notifications": rows,
        "next_cursor": next_cursor,
        "counts": await count_notifications(db),
    }


@outbox_router.get(
    "/{notification_id}",
    name="get_notification",
    response_model=NotificationOut,
    summary="One notification",
    responses=problems(401, 403, 404, 422, 503),
)
async def notification(
    notification_id: str,
    _principal: Annotated[Principal, Depends(require("read"))],
    db: Db,
) -> dict[str, Any]:
    _check_ref(notification_id, "notification")
    return await get_notification(db, notification_id)


@outbox_router.post(
    "/{notification_id}/retry",
    name="retry_notification",
    response_model=NotificationOut,
    summary="Operator retry: a dead_letter or expired notification goes back to pending (R12)",
    responses=problems(401, 403, 404, 409, 422, 503),
)
async def retry(
    notification_id: str,
    _principal: Annotated[Principal, Depends(require("operate"))],
    db: Db,
) -> dict[str, Any]:
    _check_ref(notification_id, "notification")
    return await retry_notification(db, notification_id)
