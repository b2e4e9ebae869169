"""The dashboard's task pages and their JSON twins: the overview (``/``), the task list
(``/tasks``: search, filters and page links in the URL) and a task's page (``/tasks/{id}``).
Reads only; the same access, errors and template as every page (``pages.render_page``).

The overview's charts and kinds table are read when the page is drawn (``?range=`` picks one of
``activity.RANGES``), not polled: a reload redraws them; its counts, recent tasks and workers
poll as every page's regions do.
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from taskward.activity import DEFAULT_RANGE, RANGES, read_activity, search_tasks
from taskward.cursors import MAX_CURSOR_LENGTH
from taskward.dashboard import graphviews, listviews, overviewviews, pages, taskviews, views
from taskward.dashboard.render import secure
from taskward.dashboard.resultview import result_regions
from taskward.dependencies import task_dependencies
from taskward.errors import TaskValidationError
from taskward.lifecycle import Status, is_terminal
from taskward.placement import placement_reason
from taskward.reads import (
    count_by_status_and_target,
    get_task,
    list_retries,
    list_task_events,
    list_transitions,
)
from taskward.registry import DEFAULT_ALIASES
from taskward.results import read_task_result
from taskward.store import StateDB
from taskward.web.state import Services, services_of

router = APIRouter(include_in_schema=False)

FILTERS = ("q", "status", "kind", "target")
RECENT = 15


# -- the overview ------------------------------------------------------------------------------


async def overview_data(db: StateDB, services: Services, request: Request) -> dict[str, Any]:
    pairs = await count_by_status_and_target(db)
    recent = await search_tasks(db, limit=RECENT, with_total=False)
    workers = await pages.workers_of(db, services, 50)
    return overviewviews.overview_regions(pairs, recent.rows, workers, await db.now())


def _range(request: Request) -> str:
    name = request.query_params.get("range") or DEFAULT_RANGE
    if name not in RANGES:
        raise TaskValidationError("range", name[:40], sorted(RANGES))
    return name


async def overview_page_data(db: StateDB, services: Services, request: Request) -> dict[str, Any]:
    polled = await overview_data(db, services, request)
    kinds = await db.fetchall("dash_count_by_kind_status")
    activity = await read_activity(db, range_name=_range(request))
    return overviewviews.overview_page_regions(polled, kinds, activity)


@router.get("/")
async def overview_page(request: Request) -> Response:
    return await pages.render_page(
        request, "overview.html", overview_page_data, "/ui/data/overview"
    )


@router.get("/ui/data/overview")
async def overview_json(request: Request) -> Response:
    return await pages.data_response(request, overview_data)


# -- the task list -----------------------------------------------------------------------------


def list_filters(request: Request) -> dict[str, str | None]:
    """The list's search and filters from its URL, each bounded."""
    q = request.query_params
    filters = {name: (q.get(name) or "").strip() or None for name in FILTERS}
    for name, value in filters.items():
        if value is not None and (len(value) > 255 or "\x00" in value):
            raise TaskValidationError(name, value[:40], "a short value without NUL characters")
    if filters["target"] is not None and filters["target"] not in views.TARGETS:
        raise TaskValidationError("target", filters["target"], views.TARGETS)
    return filters


def _cursor(request: Request, name: str) -> str | None:
    cursor = request.query_params.get(name) or None
    if cursor is not None and ("\x00" in cursor or len(cursor) > MAX_CURSOR_LENGTH):
        raise TaskValidationError(
            name, cursor[:40], f"a cursor of a previous page (at most {MAX_CURSOR_LENGTH})"
        )
    return cursor


async def tasks_data(db: StateDB, services: Services, request: Request) -> dict[str, Any]:
    filters = list_filters(request)
    kind = filters["kind"]
    page = await search_tasks(
        db,
        status=filters["status"],
        action_kind=DEFAULT_ALIASES.get(kind, kind) if kind else None,
        execution_target=filters["target"],
        q=filters["q"],
        limit=views.PAGE_SIZE,
        cursor=_cursor(request, "cursor"),
        newer=_cursor(request, "newer"),
    )
    return listviews.tasks_regions(
        page, filters, await db.now(), can_operate=await pages.can_operate(request)
    )


def _query_suffix(request: Request) -> str:
    return f"?{request.url.query}" if request.url.query else ""


@router.get("/tasks")
async def tasks_page(request: Request) -> Response:
    q = request.query_params
    # A search's page is not polled: each poll would scan the rows again.
    searching = bool((q.get("q") or "").strip())
    return await pages.render_page(
        request,
        "tasks.html",
        tasks_data,
        "" if searching else "/ui/data/tasks" + _query_suffix(request),
        statuses=[s.value for s in Status],
        targets=views.TARGETS,
        selected={name: q.get(name) or "" for name in FILTERS},
        list_href=request.url.path + _query_suffix(request),
        bulk_key=f"ui:bulk:{uuid.uuid4()}",
        flash=listviews.flash_text(q),
        searching=searching,
    )


@router.get("/ui/data/tasks")
async def tasks_json(request: Request) -> Response:
    return await pages.data_response(request, tasks_data)


# -- a task ------------------------------------------------------------------------------------


async def _task_regions(db: StateDB, request: Request, *, with_retries: bool) -> dict[str, Any]:
    task_id = pages.task_id_of(request)
    row = await get_task(db, task_id)
    now = await db.now()
    placement = await placement_reason(db, task_id, now=now) if row["status"] == "queued" else None
    facts = await list_transitions(db, task_id)
    events = await list_task_events(db, task_id)
    retries = None
    if with_retries and is_terminal(row["status"]):  # only an ended task is retried (R19)
        retries = await list_retries(db, task_id, limit=views.PAGE_SIZE)
    regions = taskviews.task_regions(row, placement, facts, events, retries, now=now)
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


@router.get("/tasks/{task_id}")
async def task_page(request: Request, task_id: str) -> Response:
    return await pages.render_page(
        request,
        "task.html",
        task_page_data,
        "/ui/data/tasks/" + quote(task_id, safe=""),
        task_id=task_id,
        cancel_key=f"ui:{uuid.uuid4()}",
        retry_key=f"ui:{uuid.uuid4()}",
        flash=taskviews.cancel_flash(request.query_params.get("cancel")),
    )


@router.get("/ui/data/tasks/{task_id}")
async def task_json(request: Request, task_id: str) -> Response:
    return await pages.data_response(request, task_data)


@router.get("/ui/data/tasks/{task_id}/result")
async def task_result_json(request: Request, task_id: str) -> Response:
    """A completed task's whole stored result (R22), as ``GET /api/tasks/{id}/result`` answers
    it, for the page's link (the session's 'read' scope, as every data request)."""
    refused = await pages.read_refused(request)
    if refused is not None:
        return refused
    db = await services_of(request).store.get()
    stored = await read_task_result(db, pages.task_id_of(request))
    return secure(
        JSONResponse(
            {"task_id": stored.task_id, "attempt": stored.attempt, "result": stored.result}
        )
    )
