"""The HTTP binding: ``create_app(db, registry, config)`` builds the ASGI app (API, dashboard,
/healthz, /metrics, /openapi.json). See docs/http.md.

This package is the web composition root: ``app`` mounts the JSON API (``taskward.api``) and the
dashboard (``taskward.dashboard``), which share ``taskward.web`` and never import each other;
``system`` holds the app's own routes (/healthz, /metrics, /openapi.json) and ``guards`` its
request middleware. ``HttpConfig`` and ``ApiToken`` live in ``taskward.web`` and are re-exported
here, where callers import them; ``TaskMetrics`` (``taskward.metrics``) too."""

from __future__ import annotations

from taskward.http.app import create_app
from taskward.metrics import TaskMetrics
from taskward.web.config import ApiToken, HttpConfig

__all__ = ["ApiToken", "HttpConfig", "TaskMetrics", "create_app"]
