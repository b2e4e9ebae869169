"""Operations routes: ``/healthz`` (no token; checks the store), ``/metrics`` (Prometheus, by
``taskward.exposition``)
and ``/openapi.json`` (behind a token when tokens are configured, like everything but
``/healthz``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from taskward.api.models import Health, Problem
from taskward.exposition import Families, render, store_families
from taskward.settings import get_max_attempts
from taskward.web.auth import Principal, require
from taskward.web.state import services_of

router = APIRouter(tags=["operations"])


@router.get(
    "/healthz",
    response_model=Health,
    summary="Liveness and store check (no token needed)",
    responses={
        503: {
            "model": Problem,
            "description": "The store is unavailable.",
            "content": {"application/problem+json": {}},
        }
    },
)
async def healthz(request: Request) -> dict[str, Any]:
    db = await services_of(request).store.get()
    await get_max_attempts(db)  # one real round trip to the store
    return {"status": "ok", "store": db.dialect}


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    summary="Prometheus metrics",
    responses={
        200: {"content": {"text/plain": {}}},
        **{
            code: {
                "model": Problem,
                "description": text,
                "content": {"application/problem+json": {}},
            }
            for code, text in (
                (401, "No or an invalid API token (only when tokens are configured)."),
                (403, "The token lacks the read scope."),
                (429, "Too many failed authentications from this address; retry later."),
                (503, "The store is unavailable."),
            )
        },
    },
)
async def metrics(
    request: Request, _principal: Annotated[Principal, Depends(require("read"))]
) -> Response:
    services = services_of(request)
    db = await services.store.get()
    families = await store_families(db, heartbeat_ttl_s=services.config.heartbeat_ttl_s)
    # This process's metrics: the app's, and a worker runtime's when it brought its own.
    own = [services.metrics]
    if db.metrics is not None and db.metrics is not services.metrics:
        own.append(db.metrics)
    body, content_type = render(Families(families, *own), request.headers.get("accept"))
    return Response(body, media_type=content_type)


@router.get("/openapi.json", include_in_schema=False)
async def openapi(
    request: Request, _principal: Annotated[Principal, Depends(require("read"))]
) -> JSONResponse:
    return JSONResponse(request.app.openapi())
