"""Dashboard pages and their JSON twins under ``/ui/data`` (polled by the page's script, so a
page updates without a reload). Reads only: every value comes from the library's read functions.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from taskward.cursors import MAX_CURSOR_LENGTH
from taskward.dashboard import limitviews, opsviews, scheduleviews, views, workerviews
from taskward.dashboard.render import html, secure
from taskward.dashboard.session import Session, new_session, session_principal
from taskward.errors import StoreError, TaskNotFound, TaskValidationError
from taskward.limits import list_limits
from taskward.outbox import (
    count_notifications,
    list_notifications,
    no_target_notice,
    targets_configured,
)
from taskward.reads import (
    list_workers,
)
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


# For the page modules beside this one (``graphpages``, ``taskpages``): the same access, errors
# and template, and the same answer to a data request.
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


workers_of = _workers


def _cursor(request: Request) -> str | None:
    """The page's ``cursor``, bounded as the API bounds it (``cursors.MAX_CURSOR_LENGTH``);
    its shape is checked by the decoder, so a crafted one is a 422 page, never a 500."""
    cursor = request.query_params.get("cursor") or None
    if cursor is not None and ("\x00" in cursor or len(cursor) > MAX_CURSOR_LENGTH):
        raise TaskValidationError(
            "cursor", cursor[:40], f"a cursor of a previous page (at most {MAX_CURSOR_LENGTH})"
        )
    return cursor


def _task_id(request: Request) -> str:
    task_id = str(request.path_params["task_id"])
    if "\x00" in task_id or len(task_id) > 255:
        raise TaskNotFound(task_id[:255])
    return task_id


task_id_of = _task_id


async def workers_data(db: StateDB, services: Services, request: Request) -> dict[str, Any]:
    return workerviews.workers_regions(
        await _workers(db, services), can_operate=await _can_operate(request)
    )


# -- pages ----------------------------------------------------------------------------------


def _query_suffix(request: Request) -> str:
    return f"?{request.url.query}" if request.url.query else ""


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
    return scheduleviews.schedules_regions(
        rows, can_operate=await _can_operate(request), now=await db.now()
    )


async def outbox_data(db: StateDB, services: Services, request: Request) -> dict[str, Any]:
    status = request.query_params.get("status") or None
    cursor = _cursor(request)
    if status is not None and ("\x00" in status or len(status) > 255):
        raise TaskValidationError("status", status[:40], "a short value without NUL characters")
    rows, next_cursor = await list_notifications(
        db, status=status, limit=views.PAGE_SIZE, cursor=cursor
    )
    counts = await count_notifications(db)
    return opsviews.outbox_regions(
        rows,
        counts,
        next_cursor,
        status,
        can_operate=await _can_operate(request),
        notice=no_target_notice(counts, configured=targets_configured()),
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


data_response = _data
read_refused = _read_refused
can_operate = _can_operate
