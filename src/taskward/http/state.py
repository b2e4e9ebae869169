"""What the app shares between requests: the store, the registry, the configuration, metrics.

Held on ``app.state.taskward``; there is no module-level state (STYLE.md section 7). The store
is either handed in open (its owner closes it) or opened from a URL on first use, so the service
starts while its database is away and answers 503 until it is back.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fastapi import Request

from taskward.errors import StoreError, StoreUnavailable, TaskValidationError
from taskward.http.config import HttpConfig
from taskward.http.metrics import Metrics
from taskward.http.throttle import FailureLimiter
from taskward.registry import TaskAdapterRegistry
from taskward.store import StateDB, open_db
from taskward.store.open import redact


class StoreHandle:
    """An open StateDB, or a URL opened lazily (and retried) on the first request."""

    def __init__(self, db: StateDB | None = None, url: str | None = None) -> None:
        if (db is None) == (url is None):
            raise ValueError("give exactly one of db and url")
        self._db = db
        self._url = url
        self._owned = db is None
        self._lock = asyncio.Lock()

    @property
    def description(self) -> str:
        if self._db is not None:
            return self._db.url
        return redact(self._url or "")

    async def get(self) -> StateDB:
        """The open store. Raises StoreUnavailable while it cannot be opened."""
        if self._db is not None:
            return self._db
        async with self._lock:
            if self._db is None:
                try:
                    self._db = await open_db(self._url)
                except StoreError:
                    raise
                except TaskValidationError as exc:  # a bad URL is the operator's, not the caller's
                    raise StoreError(f"the store URL is invalid: {exc}") from exc
                except OSError as exc:
                    raise StoreUnavailable(f"cannot open the store: {exc}") from exc
        return self._db

    async def close(self) -> None:
        """Close the store if this handle opened it; safe to call twice."""
        if self._owned and self._db is not None:
            db, self._db = self._db, None
            await db.close()


@dataclass
class Services:
    store: StoreHandle
    registry: TaskAdapterRegistry
    config: HttpConfig
    metrics: Metrics
    # Failed authentications per client, shared by the API and the dashboard login.
    auth_limiter: FailureLimiter = field(init=False)

    def __post_init__(self) -> None:
        self.auth_limiter = FailureLimiter(self.config.auth_limits)


def services_of(request: Request) -> Services:
    services: Services = request.app.state.taskward
    return services


async def store_of(request: Request) -> StateDB:
    """FastAPI dependency: the open store (503 while it is away)."""
    return await services_of(request).store.get()
