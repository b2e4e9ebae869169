"""Dashboard pages and their JSON twins under ``/ui/data`` (polled by the page's script, so a
page updates without a reload). Reads only: every value comes from the library's read functions.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Final
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from taskward.cursors import MAX_CURSOR_LENGTH
from taskward.dashboard import graphviews, limitviews, opsviews, views, workerviews
from taskward.dashboard.render import html, secure
from taskward.dashboard.resultview import result_regions
from taskward.dashboard.session import Session, new_session, session_principal
from taskward.dependencies import task_dependencies
from taskward.errors import StoreError, TaskNotFound, TaskValidationError
from taskward.lifecycle import Status, is_terminal
from taskward.limits import list_limits
from taskward.outbox import count_notifications, list_notifications
from taskward.placement import placement_reason
from taskward.reads import (
    count_by_status_and_target,
    get_task,
    list_retries,
    list_task_events,
    list_tasks,
    list_transitions,
    list_workers,
)
from taskward.registry import DEFAULT_ALIASES
from taskward.results import read_task_result
from taskward.schedules import list_schedules
from taskward.store import StateDB
from taskward.web.auth import ANONYMOUS, Principal, anonymous
from taskward.web.problems import problem_response
from taskward.web.state import Services, services_of

log = logging.getLogger("taskward.dashboard")

router = APIRouter(include_in_schema=False)

# A data handler: (db, services, request) -> regions of the page.
DataFn = Callable[[StateDB, Services, Request], Awaitable[dict[str, Any]]]


class _LoginRequired(Exception):
    pass


async def _access(request: Request) -> tuple[Session, Principal, Session | None]:
    """(session, principal, session to set as a cookie, if it is new); raises _LoginRequired."""
    services = services_of(request)
    found = await session_principal(services.config, request)
    if found is not None:
        return found[0], found[1], None
    if services.config.auth_required:
        raise _LoginRequired
    session = new_session(services.config, ANONYMOUS)
    return session, anonymous(), session


def _login_redirect(request: Request) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return secure(RedirectResponse("/login?next=" + quote(target, safe=""), status_code=303))


async def _page(
    request: Request, template: str, data: DataFn, data_url: str, **context: Any
) -> Response:
    try:
        session, principal, new_cookie = await _access(request)
    except _LoginRequired:
        return _login_redirect(request)
    if not principal.allows("read"):
        return html(
            request,
            "message.html",
            session=session,
            principal=principal,
            status_code=403,
            title="Forbidden",
            message=f"token {principal.name!r} lacks the 'read' scope",
        )
    services = services_of(request)
    try:
        db = await services.store.get()
        regions = await data(db, services, request)
    except TaskNotFound as exc:
        return html(
            request,
            "message.html",
            session=session,
            principal=principal,
            new_cookie=new_cookie,
            status_code=404,
            title="Not found",
            message=str(exc),
        )
    except TaskValidationError as exc:
        return html(
            request,
            "message.html",
            session=session,
            principal=principal,
            new_cookie=new_cookie,
            status_code=422,
            title="Invalid input",
            message=str(exc),
        )
    except StoreError as exc:
        log.warning("dashboard: store failure: %r", exc)
        response = html(
            request,
            "message.html",
            session=session,
            principal=principal,
            new_cookie=new_cookie,
            status_code=503,
            title="Store unavailable",
            message="the store is unavailable; this page retries on reload",
        )
        response.headers["Retry-After"] = str(services.config.retry_after_s)
        return response
    return html(
        request,
        template,
        session=session,
        principal=principal,
        new_cookie=new_cookie,
        regions=regions,
        data_url=data_url,
        **context,
    )


# For the page modules beside this one (``graphpages``): the same access, errors and template.
render_page = _page


async def _read_refused(request: Request) -> Response | None:
    """The answer to a data request that may not read (no session, or no 'read' scope)."""
    services = services_of(request)
    found = await session_principal(services.config, request)
    if found is None and services.config.auth_required:
        return secure(
            problem_response(
                401, "unauthorized", "Unauthorized", "log in again", instance=request.url.path
            )
        )
    if found is not None and not found[1].allows("read"):
        return secure(
            problem_response(
                403,
                "forbidden",
                "Forbidden",
                "the 'read' scope is needed",
                instance=request.url.path,
            )
        )
    return None


async def _data(request: Request, data: DataFn) -> Response:
    refused = await _read_refused(request)
    if refused is not None:
        return refused
    services = services_of(request)
    db = await services.store.get()
    regions = await data(db, services, request)
    return secure(JSONResponse({"regions": regions}))


# -- data of each page ----------------------------------------------------------------------


async def _workers(db: StateDB, services: Services, limit: int = 200) -> list[dict[str, Any]]:
    return await list_workers(db, heartbeat_ttl=services.config.heartbeat_ttl_s, limit=limit)


async def overview_data(db: StateDB, services: Services, request: Request) -> dict[str, Any]:
    pairs = await count_by_status_and_target(db)
    recent, _ = await list_tasks(db, limit=15)
    workers = await _workers(db, services, 50)
    return {
        **views.overview_regions(pairs, recent, await db.now()),
        **workerviews.workers_regions(workers),
    }


def _filters(request: Request) -> dict[str, str | None]:
    q = request.query_params
    filters = {name: (q.get(name) or "").strip() or None for name in ("status", "kind", "target")}
    for name, value in filters.items():
        if value is not None and (len(value) > 255 or "\x00" in value):
            raise TaskValidationError(name, value[:40], "a short value without NUL characters")
    if filters["target"] is not None and filters["target"] not in views.TARGETS:
        raise TaskValidationError("target", filters["target"], views.TARGETS)
    return filters


def _cursor(request: Request) -> str | None:
    """The page's ``cursor``, bounded as the API bounds it (``cursors.MAX_CURSOR_LENGTH``);
    its shape is checked by the decoder, so a crafted one is a 422 page, never a 500."""
    cursor = request.query_params.get("cursor") or None
    if cursor is not None and ("\x00" in cursor or len(cursor) > MAX_CURSOR_LENGTH):
        raise TaskValidationError(
            "cursor", cursor[:40], f"a cursor of a previous page (at most {MAX_CURSOR_LENGTH})"
        )
    return cursor


async def tasks_data(db: StateDB, services: Services, request: Request) -> dict[str, Any]:
    filters = _filters(request)
    kind = filters["kind"]
    cursor = _cursor(request)
    rows, next_cursor = await list_tasks(
        db,
        status=filters["status"],
        action_kind=DEFAULT_ALIASES.get(kind, kind) if kind else None,
        execution_target=filters["target"],
        limit=views.PAGE_SIZE,
        cursor=cursor,
    )
    return views.tasks_regions(rows, next_cursor, filters, await db.now())


def _task_id(request: Request) -> str:
    task_id = str(request.path_params["task_id"])
    if "\x00" in task_id or len(task_id) > 255:
        raise TaskNotFound(task_id[:255])
    return task_id


task_id_of = _task_id


async def _task_regions(db: StateDB, request: Request, *, with_retries: bool) -> dict[str, Any]:
    task_id = _task_id(request)
    row = await get_task(db, task_id)
    now = await db.now()
    placement = await placement_reason(db, task_id, now=now) if row["status"] == "queued" else None
    facts = await list_transitions(db, task_id)
    events = await list_task_events(db, task_id)
    retries = None
    if with_retries and is_terminal(row["status"]):  # only an ended task is retried (R19)
        retries = await list_retries(db, task_id, limit=views.PAGE_SIZE)
    regions = views.task_regions(row, placement, facts, events, retries, now=now)
    live = not row.get("archived")  # an archived task (R23): its row and history alone
    stored = await read_task_result(db, task_id) if row["status"] == "completed" and live else None
    regions.update(result_regions(task_id, stored))  # R22
    links: dict[str, Any] = {"parents": [], "children": []}
    if live:
        links = await task_dependencies(db, task_id)  # R21: "Depends on", "Needed by", and why
    regions.update(graphviews.dependency_regions(task_id, links["parents"], links["children"]))
    waiting = graphviews.waiting_item(row, links["parents"])
    if waiting is not None:
        regions["fields"]["items"].append(waiting)
    return regions


async def task_data(db: StateDB, services: Services, request: Request) -> dict[str, Any]:
    """The task's page as it polls: without its "Retried as", read when the page is rendered
    (``task_page_data``) and not every two seconds (a retry made elsewhere shows on reload)."""
    return await _task_regions(db, request, with_retries=False)


async def task_page_data(db: StateDB, services: Services, request: Request) -> dict[str, Any]:
    return await _task_regions(db, request, with_retries=True)


async def workers_data(db: StateDB, services: Services, request: Request) -> dict[str, Any]:
    return workerviews.workers_regions(
        await _workers(db, services), can_operate=await _can_operate(request)
    )


# -- pages ----------------------------------------------------------------------------------


@router.get("/")
async def overview_page(request: Request) -> Response:
    return await _page(request, "overview.html", overview_data, "/ui/data/overview")


@router.get("/ui/data/overview")
async def overview_json(request: Request) -> Response:
    return await _data(request, overview_data)


def _query_suffix(request: Request) -> str:
    return f"?{request.url.query}" if request.url.query else ""


@router.get("/tasks")
async def tasks_page(request: Request) -> Response:
    q = request.query_params
    return await _page(
        request,
        "tasks.html",
        tasks_data,
        "/ui/data/tasks" + _query_suffix(request),
        statuses=[s.value for s in Status],
        targets=views.TARGETS,
        selected={name: q.get(name) or "" for name in ("status", "kind", "target")},
        list_href=request.url.path + _query_suffix(request),
        bulk_key=f"ui:bulk:{uuid.uuid4()}",
    )


@router.get("/ui/data/tasks")
async def tasks_json(request: Request) -> Response:
    return await _data(request, tasks_data)


@router.get("/tasks/{task_id}")
async def task_page(request: Request, task_id: str) -> Response:
    return await _page(
        request,
        "task.html",
        task_page_data,
        "/ui/data/tasks/" + quote(task_id, safe=""),
        task_id=task_id,
        cancel_key=f"ui:{uuid.uuid4()}",
        retry_key=f"ui:{uuid.uuid4()}",
    )


@router.get("/ui/data/tasks/{task_id}")
async def task_json(request: Request, task_id: str) -> Response:
    return await _data(request, task_data)


@router.get("/ui/data/tasks/{task_id}/result")
async def task_result_json(request: Request, task_id: str) -> Response:
    """A completed task's whole stored result (R22), as ``GET /api/tasks/{id}/result`` answers
    it, for the page's link (the session's 'read' scope, as every data request)."""
    refused = await _read_refused(request)
    if refused is not None:
        return refused
    db = await services_of(request).store.get()
    stored = await read_task_result(db, _task_id(request))
    return secure(
        JSONResponse(
            {"task_id": stored.task_id, "attempt": stored.attempt, "result": stored.result}
        )
    )


@router.get("/workers")
async def workers_page(request: Request) -> Response:
    return await _page(request, "workers.html", workers_data, "/ui/data/workers")


@router.get("/ui/data/workers")
async def workers_json(request: Request) -> Response:
    return await _data(request, workers_data)


async def _can_operate(request: Request) -> bool:
    found = await session_principal(services_of(request).config, request)
    if found is not None:
        return found[1].allows("operate")
    return not services_of(request).config.auth_required


async def schedules_data(db: StateDB, services: Services, request: Request) -> dict[str, Any]:
    rows = await list_schedules(db, include_removed=True, limit=500)
    return opsviews.schedules_regions(rows, can_operate=await _can_operate(request))


async def outbox_data(db: StateDB, services: Services, request: Request) -> dict[str, Any]:
    status = request.query_params.get("status") or None
    cursor = _cursor(request)
    if status is not None and ("\x00" in status or len(status) > 255):
        raise TaskValidationError("status", status[:40], "a short value without NUL characters")
    rows, next_cursor = await list_notifications(
        db, status=status, limit=views.PAGE_SIZE, cursor=cursor
    )
    return opsviews.outbox_regions(
        rows,
        await count_notifications(db),
        next_cursor,
        status,
        can_operate=await _can_operate(request),
    )


@router.get("/schedules")
async def schedules_page(request: Request) -> Response:
    return await _page(request, "schedules.html", schedules_data, "/ui/data/schedules")


@router.get("/ui/data/schedules")
async def schedules_json(request: Request) -> Response:
    return await _data(request, schedules_data)


@router.get("/outbox")
async def outbox_page(request: Request) -> Response:
    return await _page(
        request, "outbox.html", outbox_data, "/ui/data/outbox" + _query_suffix(request)
    )


@router.get("/ui/data/outbox")
async def outbox_json(request: Request) -> Response:
    return await _data(request, outbox_data)


# -- limits (R20) ----------------------------------------------------------------------------

# What a limits form did, shown above the page after its redirect: ``?done=<what>&key=<key>``.
LIMIT_FLASH: Final = {
    "set": "set the limit of {key}",
    "cleared": "cleared the limit of {key}",
    "no-limit": "{key} had no limit",
    "paused": "paused {key}: no new task of it starts; running ones finish",
    "resumed": "resumed {key}",
    "not-paused": "{key} was not paused",
}


def chosen_key(request: Request) -> str | None:
    """The limit key the page was opened for (``?key=``): its row is marked and the set form
    is filled with its limit."""
    key = (request.query_params.get("key") or "").strip() or None
    if key is not None and ("\x00" in key or len(key) > 255):
        raise TaskValidationError("key", key[:40], "a limit key (at most 255 characters)")
    return key


async def limits_view(
    db: StateDB, services: Services, *, can_operate: bool, chosen: str | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The page's regions and the limits they were drawn from."""
    limits = await list_limits(db)
    regions = limitviews.limits_regions(
        limits, services.registry.kinds(), can_operate=can_operate, chosen=chosen
    )
    return regions, limits


def limits_data_url(chosen: str | None) -> str:
    return "/ui/data/limits" + ("?" + urlencode({"key": chosen}) if chosen else "")


async def limits_data(db: StateDB, services: Services, request: Request) -> dict[str, Any]:
    regions, _ = await limits_view(
        db, services, can_operate=await _can_operate(request), chosen=chosen_key(request)
    )
    return regions


@router.get("/limits")
async def limits_page(request: Request) -> Response:
    """Every limit and every kind's pause state; operators set, clear, pause and resume here.
    The set form starts filled with the chosen key's limit (read with the regions)."""
    form: dict[str, str] = {}

    async def data(db: StateDB, services: Services, request: Request) -> dict[str, Any]:
        chosen = chosen_key(request)
        regions, limits = await limits_view(
            db, services, can_operate=await _can_operate(request), chosen=chosen
        )
        form.update(limitviews.limit_form_values(limits, chosen))
        return regions

    q = request.query_params
    template = LIMIT_FLASH.get(q.get("done") or "")
    flash = template.format(key=q.get("key") or "") if template else None
    return await _page(
        request,
        "limits.html",
        data,
        limits_data_url((q.get("key") or "").strip() or None),
        form=form,  # filled in by ``data`` before the page renders
        error=None,
        flash=flash,
    )


@router.get("/ui/data/limits")
async def limits_json(request: Request) -> Response:
    return await _data(request, limits_data)
