"""The web dashboard, served by the HTTP app: server-rendered pages kept current by a small
script that polls their JSON twins. No front-end build step."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from taskward.dashboard import actions, bulkactions, graphpages, pages, taskpages


def mount_dashboard(app: FastAPI) -> None:
    """Add the dashboard's pages under ``/`` and its script and styles under ``/static``."""
    app.include_router(taskpages.router)
    app.include_router(pages.router)
    app.include_router(bulkactions.router)
    app.include_router(actions.router)
    app.include_router(graphpages.router)
    app.mount("/static", StaticFiles(packages=[("taskward.dashboard", "static")]), name="static")


__all__ = ["mount_dashboard"]
