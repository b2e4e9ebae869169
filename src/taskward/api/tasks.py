"""The ``/api`` routes: tasks, their transitions, cancellation and workers.

Thin: each route parses, calls the same library function as the CLI and renders. No SQL here
(ADR-0072 D1 "Bindings are thin and share this function"); errors become problem documents in
``taskward.web.problems`` only.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Final

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request, Response

from taskward.admission import admit_task
from taskward.api.models import (
    STATUS_ENUM,
    TARGET_ENUM,
    CancelRequest,
    CancelResponse,
    Problem,
    RetryRequest,
    RetryResponse,
    SubmitResult,
    TaskOut,
    TaskPage,
    TaskResultOut,
    TaskSubmission,
    TransitionList,
    WorkerList,
)
from taskward.cancellation import request_task_cancel
from taskward.cursors import MAX_CURSOR_LENGTH
from taskward.errors import TaskIdempotencyConflict, TaskNotFound, TaskValidationError
from taskward.fields import run_after_for_delay
from taskward.models import TaskApplication
from taskward.placement import placement_reason
from taskward.reads import MAX_LIST_LIMIT, get_task, list_tasks, list_transitions, list_workers
from taskward.registry import DEFAULT_ALIASES
from taskward.resubmit import retry_task
from taskward.results import read_task_result
from taskward.store import StateDB
from taskward.web.auth import Principal, require
from taskward.web.state import services_of, store_of

MAX_ID_LENGTH: Final = 255
DEFAULT_PAGE: Final = 50


def problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    described = {
        401: "No or an invalid API token (only when tokens are configured).",
        403: "The token lacks the scope this route needs.",
        404: "No task has this id.",
        409: "The idempotency key already admitted a different application, (retry) the "
        "task has not ended, or (result) the task is not completed.",
        413: "The request body is over the limit.",
        415: "A body without Content-Type: application/json.",
        422: "Invalid input: the problem names the field and what is allowed. Nothing stored.",
        429: "Too many failed authentications from this address; retry after Retry-After "
        "seconds (no token is checked meanwhile).",
        503: "The store is unavailable; retry after Retry-After seconds.",
    }
    if 401 in codes:  # every route that checks a token may refuse to while a client guesses
        codes = (*codes, 429)
    if 413 in codes:  # every route that takes a body refuses one that is not JSON
        codes = (*codes, 415)
    return {
        code: {
            "model": Problem,
            "description": described[code],
            "content": {"application/problem+json": {}},
        }
        for code in codes
    }


router = APIRouter(prefix="/api", tags=["tasks"])

Db = Annotated[StateDB, Depends(store_of)]
IdempotencyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="The idempotency key, instead of (or equal to) the body's.",
    ),
]


def generated_key() -> str:
    return f"http:{uuid.uuid4()}"


def _choose_key(body_key: str | None, header_key: str | None) -> tuple[str, bool]:
    """The request's idempotency key and whether it was generated (ADR-0072 D1)."""
    if body_key is not None and header_key is not None and body_key.strip() != header_key.strip():
        raise TaskValidationError(
            "idempotency_key",
            body_key,
            "the same key in the body and the Idempotency-Key header, or only one of them",
            message="idempotency_key in the body differs from the Idempotency-Key header; "
            "send one of them, or the same key in both",
        )
    key = body_key if body_key is not None else header_key
    if key is None:
        return generated_key(), True
    return key, False


def _header_safe(value: str) -> bool:
    return all(" " <= c <= "~" for c in value)


def _echo_key(response: Response, key: str) -> None:
    # A key that cannot travel as a header value (non-ASCII, control characters) is returned
    # in the body only.
    if _header_safe(key):
        response.headers["Idempotency-Key"] = key


def _check_task_id(task_id: str) -> None:
    """An id no task can have is unknown, without asking the store (PostgreSQL refuses NUL)."""
    if "\x00" in task_id or len(task_id) > MAX_ID_LENGTH:
        raise TaskNotFound(task_id[:MAX_ID_LENGTH])


check_task_id = _check_task_id  # the same check for the task routes of other modules


@router.post(
    "/tasks",
    name="submit_task",
    status_code=201,
    response_model=SubmitResult,
    summary="Submit a task",
    responses={
        200: {"model": SubmitResult, "description": "The key's existing task (same payload)."},
        **problems(401, 403, 409, 413, 422, 503),
    },
)
async def submit(
    request: Request,
    response: Response,
    body: TaskSubmission,
    principal: Annotated[Principal, Depends(require("submit"))],
    db: Db,
    idempotency_key: IdempotencyHeader = None,
) -> SubmitResult:
    """Admit a task through ``submit_task`` (admission_source ``http``).

    201 a new task; 200 the same key and payload again (the original id, forever); 409 the key
    already admitted a different payload (``existing_task_id``); 422 invalid input, nothing
    stored. The key comes from the body or the ``Idempotency-Key`` header; when neither is
    given one is generated and returned (body and header), but only a key you send makes a
    retry safe.
    """
    services = services_of(request)
    key, generated = _choose_key(body.idempotency_key, idempotency_key)
    run_after = body.run_after
    try:
        if body.delay_s is not None:
            if run_after is not None:
                raise TaskValidationError("delay_s", body.delay_s, "run_after or delay_s, not both")
            # R16: resolved against the key, so a retried request replays
            run_after = await run_after_for_delay(db, key, body.delay_s)
        app = TaskApplication(
            action_kind=body.action_kind,
            args=body.args,
            execution_target=body.execution_target,
            idempotency_key=key,
            required_capabilities=list(body.required_capabilities),
            library_ref=body.library_ref,
            library_content_hash=body.library_content_hash,
            run_after=run_after,
            priority=body.priority,
            max_attempts=body.max_attempts,
            limit_key=body.limit_key,
            depends_on=body.depends_on,
        )
        admission = await admit_task(db, app, registry=services.registry, admission_source="http")
    except TaskValidationError:
        services.metrics.record_admission("rejected")
        raise
    except TaskIdempotencyConflict:
        services.metrics.record_admission("conflict")
        raise
    services.metrics.record_admission("created" if admission.created else "existing")
    response.status_code = 201 if admission.created else 200
    stored_key = key.strip()
    _echo_key(response, stored_key)
    response.headers["Location"] = f"/api/tasks/{admission.task_id}"
    return SubmitResult(
        task_id=admission.task_id,
        idempotency_key=stored_key,
        key_generated=generated,
        created=admission.created,
    )


@router.get(
    "/tasks",
    name="list_tasks",
    response_model=TaskPage,
    summary="List tasks, newest first (args as a bounded preview)",
    description="Each task is its row without `action_args`: `args_preview` (at most 200 "
    "characters of their JSON, `env` values redacted) and `args_bytes` instead; "
    "`GET /api/tasks/{task_id}` returns the args whole.",
    responses=problems(401, 403, 422, 503),
)
async def list_(
    _principal: Annotated[Principal, Depends(require("read"))],
    db: Db,
    status: Annotated[
        str | None, Query(description="Only this status.", json_schema_extra={"enum": STATUS_ENUM})
    ] = None,
    kind: Annotated[str | None, Query(description="Only this action kind.", max_length=255)] = None,
    target: Annotated[
        str | None,
        Query(description="Only this execution target.", json_schema_extra={"enum": TARGET_ENUM}),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT, description="Page size.")] = DEFAULT_PAGE,
    cursor: Annotated[
        str | None,
        Query(description="`next_cursor` of the previous page.", max_length=MAX_CURSOR_LENGTH),
    ] = None,
) -> dict[str, Any]:
    if kind is not None:
        kind = DEFAULT_ALIASES.get(kind, kind)  # stored kinds are canonical (R8)
    for name, value in (("kind", kind), ("cursor", cursor)):
        if value is not None and "\x00" in value:
            raise TaskValidationError(name, value, "text without NUL characters")
    if target is not None and target not in TARGET_ENUM:
        raise TaskValidationError("target", target, TARGET_ENUM)
    rows, next_cursor = await list_tasks(
        db, status=status, action_kind=kind, execution_target=target, limit=limit, cursor=cursor
    )
    return {"tasks": rows, "next_cursor": next_cursor}


@router.get(
    "/tasks/{task_id}",
    name="get_task",
    response_model=TaskOut,
    summary="One task; while queued, why it is not running yet",
    responses=problems(401, 403, 404, 422, 503),
)
async def show(
    task_id: Annotated[str, Path(description="The task id.")],
    _principal: Annotated[Principal, Depends(require("read"))],
    db: Db,
) -> dict[str, Any]:
    """The task's row with its args whole, ``env`` values redacted (``reads.redact_args``)."""
    _check_task_id(task_id)
    row = await get_task(db, task_id)
    if row["status"] == "queued":
        row["placement"] = await placement_reason(db, task_id)
    return row


@router.get(
    "/tasks/{task_id}/transitions",
    name="list_transitions",
    response_model=TransitionList,
    summary="A task's status transition facts, oldest first",
    responses=problems(401, 403, 404, 422, 503),
)
async def transitions(
    task_id: str,
    _principal: Annotated[Principal, Depends(require("read"))],
    db: Db,
) -> dict[str, Any]:
    _check_task_id(task_id)
    return {"task_id": task_id, "transitions": await list_transitions(db, task_id)}


@router.get(
    "/tasks/{task_id}/result",
    name="get_task_result",
    response_model=TaskResultOut,
    summary="A completed task's stored result",
    responses=problems(401, 403, 404, 409, 422, 503),
)
async def task_result(
    task_id: str,
    _principal: Annotated[Principal, Depends(require("read"))],
    db: Db,
) -> dict[str, Any]:
    """``get_task_result`` (R22): the return value the completing attempt stored, as JSON
    (null when it returned nothing). 409 ``not-completed`` (naming its ``task_status``)
    while the task is not completed, and for good when it ended otherwise."""
    _check_task_id(task_id)
    stored = await read_task_result(db, task_id)
    return {"task_id": stored.task_id, "attempt": stored.attempt, "result": stored.result}


@router.post(
    "/tasks/{task_id}/cancel",
    name="cancel_task",
    response_model=CancelResponse,
    summary="Cancel a task",
    responses=problems(401, 403, 404, 413, 422, 503),
)
async def cancel(
    task_id: str,
    response: Response,
    principal: Annotated[Principal, Depends(require("operate"))],
    db: Db,
    body: Annotated[CancelRequest | None, Body()] = None,
    idempotency_key: IdempotencyHeader = None,
) -> CancelResponse:
    """``request_task_cancel``: a queued, waiting or retry_wait task is cancelled at once; a
    running one gets a cooperative request (``cancellation_requested``); a finished one answers
    ``already_terminal``. The token's name is the actor recorded on the transition. The key is
    generated when absent; the same key returns the original answer.
    """
    _check_task_id(task_id)
    request_body = body or CancelRequest()
    key, generated = _choose_key(request_body.idempotency_key, idempotency_key)
    result = await request_task_cancel(
        db, task_id, actor=principal.actor(), idempotency_key=key, reason=request_body.reason
    )
    _echo_key(response, key)
    return CancelResponse(**result.model_dump(), idempotency_key=key, key_generated=generated)


@router.post(
    "/tasks/{task_id}/retry",
    name="retry_task",
    response_model=RetryResponse,
    status_code=201,
    summary="Run an ended task again as a new task",
    responses=problems(401, 403, 404, 409, 413, 422, 503),
)
async def retry(
    task_id: str,
    request: Request,
    response: Response,
    principal: Annotated[Principal, Depends(require("operate"))],
    db: Db,
    body: Annotated[RetryRequest | None, Body()] = None,
    idempotency_key: IdempotencyHeader = None,
) -> RetryResponse:
    """``retry_task`` (DESIGN.md R19): a new task with the ended task's application, keyed
    ``retry:<task-id>:<key>``; the same key returns the same new task, and the original never
    changes. A task that has not ended is a 409 (``not-retryable``). The token's name is the
    operator recorded with the new task."""
    _check_task_id(task_id)
    key, generated = _choose_key((body or RetryRequest()).idempotency_key, idempotency_key)
    new_id = await retry_task(
        db,
        task_id,
        actor=principal.actor(),
        idempotency_key=key,
        registry=services_of(request).registry,
    )
    _echo_key(response, key)
    return RetryResponse(
        task_id=new_id, retry_of=task_id, idempotency_key=key, key_generated=generated
    )


workers_router = APIRouter(prefix="/api", tags=["workers"])


@workers_router.get(
    "/workers",
    name="list_workers",
    response_model=WorkerList,
    summary="Workers, their heartbeat age and leased task",
    responses=problems(401, 403, 422, 503),
)
async def workers(
    request: Request,
    _principal: Annotated[Principal, Depends(require("read"))],
    db: Db,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT)] = 200,
) -> dict[str, Any]:
    ttl = services_of(request).config.heartbeat_ttl_s
    return {"workers": await list_workers(db, heartbeat_ttl=ttl, limit=limit)}
