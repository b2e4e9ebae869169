"""The ``/api/limits`` routes (DESIGN.md R20): operators' limits and pauses of kinds.

Thin: each route calls the same ``taskward.limits`` function as the CLI (``taskward limit``,
``pause``, ``resume``) and renders it; reading needs the ``read`` scope, changing ``operate``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path

from taskward.api.models import LimitIn, LimitList, LimitOut
from taskward.api.tasks import Db, problems
from taskward.limits import clear_limit, list_limits, pause_kind, resume_kind, set_limit
from taskward.web.auth import Principal, require

limits_router = APIRouter(prefix="/api", tags=["limits"])

# A limit key may hold a slash; the path converter keeps it whole (at most 255 characters, the
# library's rule, checked there).
LimitKey = Annotated[str, Path(description="kind:<action_kind> or a task limit key.")]


@limits_router.get(
    "/limits",
    name="list_limits",
    response_model=LimitList,
    summary="Limits and pauses, with what counts against each now",
    responses=problems(401, 403, 503),
)
async def limits(_principal: Annotated[Principal, Depends(require("read"))], db: Db) -> Any:
    return {"limits": await list_limits(db)}


@limits_router.put(
    "/limits/{key:path}",
    name="set_limit",
    response_model=LimitOut,
    summary="Set a key's limit (replacing the one it had)",
    responses=problems(401, 403, 413, 422, 503),
)
async def put_limit(
    key: LimitKey,
    body: LimitIn,
    principal: Annotated[Principal, Depends(require("operate"))],
    db: Db,
) -> Any:
    """``set_limit``: ``max_running`` (0 pauses), a ``rate`` of starts per ``period_s``, or
    both; a claim never lets the key exceed either (R20). 422 names a bad field; nothing is
    stored."""
    return await set_limit(
        db,
        key,
        max_running=body.max_running,
        rate=body.rate,
        period_s=body.period_s,
        actor=principal.actor(),
    )


@limits_router.delete(
    "/limits/{key:path}",
    name="clear_limit",
    summary="Remove a key's limit",
    responses=problems(401, 403, 422, 503),
)
async def delete_limit(
    key: LimitKey,
    _principal: Annotated[Principal, Depends(require("operate"))],
    db: Db,
) -> dict[str, Any]:
    return {"limit_key": key, "removed": await clear_limit(db, key)}


@limits_router.post(
    "/kinds/{kind}/pause",
    name="pause_kind",
    response_model=LimitOut,
    summary="Stop claiming tasks of a kind (running ones finish)",
    responses=problems(401, 403, 422, 503),
)
async def pause(
    kind: str,
    principal: Annotated[Principal, Depends(require("operate"))],
    db: Db,
) -> Any:
    return await pause_kind(db, kind, actor=principal.actor())


@limits_router.post(
    "/kinds/{kind}/resume",
    name="resume_kind",
    summary="Claim tasks of a paused kind again",
    responses=problems(401, 403, 422, 503),
)
async def resume(
    kind: str,
    principal: Annotated[Principal, Depends(require("operate"))],
    db: Db,
) -> dict[str, Any]:
    return {"kind": kind, "resumed": await resume_kind(db, kind, actor=principal.actor())}
