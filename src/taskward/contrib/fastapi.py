"""taskward in a FastAPI application (issue 29): a lifespan that opens the store, a dependency
that yields it, and taskward's API and dashboard mounted into the application.

    from fastapi import Depends, FastAPI
    from taskward.contrib.fastapi import TaskwardLifespan, mount, store

    lifespan = TaskwardLifespan("postgresql://app@db/app")
    app = FastAPI(lifespan=lifespan)
    mount(app, lifespan, path="/taskward")           # /taskward/api/..., /taskward/ (dashboard)

    @app.post("/orders/{order_id}")
    async def place_order(order_id: str, db=Depends(store)) -> dict:
        return {"task": await send_receipt.submit(db, key=f"receipt:{order_id}", order_id=order_id)}

The store is opened (and migrated) when the application starts and closed when it stops; the
mounted API uses the same store. For admission inside the endpoint's own database transaction,
pass that transaction's connection or session to ``submit`` instead (R24).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request

from taskward.http import create_app
from taskward.registry import TaskAdapterRegistry
from taskward.store.open import open_db, resolve_url
from taskward.store.port import StateDB
from taskward.web.config import HttpConfig

STATE_KEY = "taskward_db"


class TaskwardLifespan:
    """A FastAPI ``lifespan``: opens the store at ``url`` (default: ``TASKWARD_DATABASE_URL``)
    on start, keeps it on ``app.state``, closes it on stop. Call it as the lifespan itself, or
    ``within(other)`` to run another lifespan inside it."""

    def __init__(self, url: str | None = None) -> None:
        self.url = resolve_url(url)
        self.db: StateDB | None = None

    @asynccontextmanager
    async def __call__(self, app: FastAPI) -> AsyncIterator[None]:
        async with open_db(self.url) as db:
            self.db = db
            setattr(app.state, STATE_KEY, db)
            try:
                yield
            finally:
                self.db = None


def store(request: Request) -> StateDB:
    """The dependency: the store the lifespan opened (``Depends(store)``).

    Raises:
        RuntimeError: the application was not started with ``TaskwardLifespan``.
    """
    db = getattr(request.app.state, STATE_KEY, None)
    if db is None:
        raise RuntimeError("taskward's store is not open: use TaskwardLifespan as the lifespan")
    return db  # type: ignore[no-any-return]


def mount(
    app: FastAPI,
    lifespan: TaskwardLifespan,
    *,
    path: str = "/taskward",
    registry: TaskAdapterRegistry | None = None,
    config: HttpConfig | None = None,
) -> Any:
    """Mount taskward's HTTP API and dashboard under ``path`` of ``app``, over the lifespan's
    store (a sub-application: its own routes, auth and OpenAPI document at
    ``<path>/openapi.json``). Returns the mounted application."""
    service = create_app(_LazyStore(lifespan), registry, config)
    app.mount(path, service)
    return service


class _LazyStore:
    """The lifespan's store, resolved at each use (it opens after ``mount`` is called)."""

    def __init__(self, lifespan: TaskwardLifespan) -> None:
        self._lifespan = lifespan

    def __getattr__(self, name: str) -> Any:
        db = self._lifespan.db
        if db is None:
            raise RuntimeError("taskward's store is not open yet")
        return getattr(db, name)


__all__ = ["TaskwardLifespan", "mount", "store"]
