"""``create_app``: the ASGI app of the HTTP API, the dashboard, /healthz and /metrics.

The app shares the library with every other binding: it builds no registry of its own unless
asked (``build_registry(AdapterConfig.from_env())``, as the CLI does) and holds no global state.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from taskward.adapters import AdapterConfig, build_registry
from taskward.api import dependencies, limits, operations, tasks
from taskward.dashboard import mount_dashboard
from taskward.http import system
from taskward.http.guards import RequestGuards
from taskward.registry import TaskAdapterRegistry
from taskward.store import StateDB
from taskward.store.open import resolve_url
from taskward.web.config import HttpConfig
from taskward.web.metrics import Metrics
from taskward.web.problems import install_problem_handlers, problem_response
from taskward.web.state import Services, StoreHandle
from taskward.web.times import IsoTimesJSONResponse

log = logging.getLogger("taskward.http")

DESCRIPTION = """\
The HTTP binding of taskward: the same admission, reads and cancellation as the library and
the CLI. Errors are `application/problem+json` (RFC 9457); a 422 names the field and what is
allowed, and nothing is stored. When API tokens are configured, every route but `/healthz`
needs `Authorization: Bearer <token>` with the route's scope (`submit`, `read`, `operate`).
"""


def _version() -> str:
    try:
        return version("taskward")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0+unknown"


def kind_argument_schemas(registry: TaskAdapterRegistry) -> dict[str, Any]:
    """``TaskArgs.<kind>``: the JSON Schema of the ``args`` of each kind that has one (a typed
    ``@taskward.task`` function's, issue 29), its nested definitions beside it as
    ``TaskArgs.<kind>.<name>``."""
    found: dict[str, Any] = {}
    for kind in registry.kinds():
        args_schema = getattr(registry.resolve(kind)[1], "args_schema", None)
        if not callable(args_schema):
            continue
        prefix = f"TaskArgs.{kind}"
        schema = args_schema(ref_template=f"#/components/schemas/{prefix}.{{model}}")
        for name, definition in schema.pop("$defs", {}).items():
            found[f"{prefix}.{name}"] = definition
        schema["description"] = f"The args of a {kind} task (POST /api/tasks, action_kind {kind})."
        found[prefix] = schema
    return found


def create_app(
    db: StateDB | StoreHandle | str | None = None,
    registry: TaskAdapterRegistry | None = None,
    config: HttpConfig | None = None,
    *,
    metrics: Metrics | None = None,
) -> FastAPI:
    """The service as an ASGI app.

    ``db``: an open store (its owner closes it), a URL (opened on first use, closed on
    shutdown; None means ``TASKWARD_DATABASE_URL`` or the default) or a ``StoreHandle`` (its
    owner closes it: ``taskward serve``/``up`` open theirs in the background, so the app answers
    503 while the store is away). ``registry``: the adapters
    submissions are validated against (default: built-ins plus the environment's imports and
    allowlists). ``config``: tokens and limits (default: ``HttpConfig.from_env()``).
    ``metrics``: the in-process metrics, shared with a worker runtime in the same process.
    """
    store: StoreHandle
    if isinstance(db, StoreHandle):
        store, closes_store = db, False
    elif db is None or isinstance(db, str):
        store, closes_store = StoreHandle(url=resolve_url(db)), True
    else:
        store, closes_store = StoreHandle(db), True  # closes nothing: the store is not its own
    services = Services(
        store=store,
        registry=registry if registry is not None else build_registry(AdapterConfig.from_env()),
        config=config if config is not None else HttpConfig.from_env(),
        metrics=metrics if metrics is not None else Metrics(),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if closes_store:
                await store.close()

    app = FastAPI(
        title="taskward",
        version=_version(),
        description=DESCRIPTION,
        openapi_url=None,  # served by system.openapi, behind a token when tokens are configured
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
        generate_unique_id_function=lambda route: route.name,  # operationId = the route's name
        # Every JSON answer has ISO 8601 twins of its epoch times (web/times.py, docs/http.md).
        default_response_class=IsoTimesJSONResponse,
    )
    app.state.taskward = services
    install_problem_handlers(app, retry_after_s=services.config.retry_after_s)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.error(
            "unexpected error answering %s %s", request.method, request.url.path, exc_info=exc
        )
        return problem_response(
            500, "internal", "Internal error", "an unexpected error; see the service log",
            instance=request.url.path,
        )  # fmt: skip

    app.add_exception_handler(Exception, on_unexpected)
    document = app.openapi

    def openapi_with_problems() -> dict[str, Any]:
        """Every 4xx/5xx is documented as what it is: ``application/problem+json``."""
        if app.openapi_schema is None:
            schema = document()
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    for code, response in operation.get("responses", {}).items():
                        content = response.get("content", {})
                        if code[:1] in {"4", "5"} and "application/json" in content:
                            content["application/problem+json"] = content.pop("application/json")
            schemas = schema.get("components", {}).get("schemas", {})
            text = json.dumps(schema.get("paths", {}))
            for unused in ("HTTPValidationError", "ValidationError"):
                if f'/{unused}"' not in text:
                    schemas.pop(unused, None)
            schemas.update(kind_argument_schemas(services.registry))
        return app.openapi_schema or {}

    app.openapi = openapi_with_problems  # type: ignore[method-assign]
    app.include_router(tasks.router)
    app.include_router(dependencies.dependencies_router)
    app.include_router(tasks.workers_router)
    app.include_router(operations.schedules_router)
    app.include_router(operations.outbox_router)
    app.include_router(limits.limits_router)
    app.include_router(system.router)
    mount_dashboard(app)
    app.add_middleware(
        RequestGuards,
        max_body_bytes=services.config.max_body_bytes,
        accepted_hosts=services.config.accepted_hosts(),
    )
    return app
