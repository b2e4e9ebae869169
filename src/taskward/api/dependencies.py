"""The ``/api/tasks/{id}/dependencies`` route (DESIGN.md R21): what a task depends on and what
depends on it, with their states.

Thin: it calls ``dependencies.task_dependencies``, as ``taskward task tree`` and the dashboard
do, and renders it; reading needs the ``read`` scope. ``depends_on`` itself is a field of the
submission body (``api.models.TaskSubmission``), admitted by ``POST /api/tasks``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path

from taskward.api.models import Dependencies
from taskward.api.tasks import Db, check_task_id, problems
from taskward.dependencies import task_dependencies
from taskward.web.auth import Principal, require

dependencies_router = APIRouter(prefix="/api", tags=["tasks"])


@dependencies_router.get(
    "/tasks/{task_id}/dependencies",
    name="get_task_dependencies",
    response_model=Dependencies,
    summary="What a task depends on (parents) and what depends on it (children)",
    responses=problems(401, 403, 404, 422, 503),
)
async def dependencies(
    task_id: Annotated[str, Path(description="The task id.")],
    _principal: Annotated[Principal, Depends(require("read"))],
    db: Db,
) -> dict[str, Any]:
    """R21's links of the task, each linked task with its kind, status, key and times, in id
    order, at most 1,000 of each (``dependencies.MAX_LISTED``). A parent still pending keeps a
    ``waiting_dependency`` task waiting; one ended otherwise than ``completed`` skipped it."""
    check_task_id(task_id)
    links = await task_dependencies(db, task_id)
    return {"task_id": task_id, "parents": links["parents"], "children": links["children"]}
