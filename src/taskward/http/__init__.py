"""The HTTP binding: ``create_app(db, registry, config)`` builds the ASGI app (API, dashboard,
/healthz, /metrics, /openapi.json). See docs/http.md."""

from __future__ import annotations

from taskward.http.app import create_app
from taskward.http.config import ApiToken, HttpConfig
from taskward.http.metrics import Metrics

__all__ = ["ApiToken", "HttpConfig", "Metrics", "create_app"]
