"""What the app shares between requests: the store, the registry, the configuration, metrics.

Held on ``app.state.taskward``; there is no module-level state (STYLE.md section 7). The store
is either handed in open (its owner closes it), opened from a URL on first use, or opened in the
background and retried for as long as it is away (``open_in_background``, what ``taskward serve``
and ``up`` do), so the service starts while its database is away and answers 503 until it is
back.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from fastapi import Request

from taskward.errors import StoreError, StoreUnavailable, TaskValidationError
from taskward.metrics import TaskMetrics
from taskward.registry import TaskAdapterRegistry
from taskward.store import StateDB, open_db
from taskward.store.open import redact
from taskward.store.retry import Streak, outage_backoff
from taskward.web.config import HttpConfig
from taskward.web.throttle import FailureLimiter

log = logging.getLogger("taskward.http")

# Between two attempts of the background opener (each attempt itself waits up to the URL's
# open_timeout_s for a server that is away).
OPEN_BACKOFF = outage_backoff(base_s=0.25, cap_s=2.0)


class StoreHandle:
    """An open StateDB, or a URL opened lazily (and retried) on the first request, or in the
    background (``open_in_background``)."""

    def __init__(self, db: StateDB | None = None, url: str | None = None) -> None:
        if (db is None) == (url is None):
            raise ValueError("give exactly one of db and url")
        self._db = db
        self._url = url
        self._owned = db is None
        self._lock = asyncio.Lock()
        self._opener: asyncio.Task[StateDB] | None = None
        self._away: str | None = None  # why the background opener's last attempt failed
        self._metrics: TaskMetrics | None = None
        self._adopting = False  # metrics attached, not yet set on the store

    def attach_metrics(self, metrics: TaskMetrics) -> None:
        """Record this process's metrics through the store (``StateDB.metrics``) once it is
        open, unless the store already records into another (a worker runtime's in the same
        process: ``/metrics`` then shows both)."""
        self._metrics = metrics
        self._adopting = True
        if self._db is not None:
            self._adopt(self._db)

    def _adopt(self, db: StateDB) -> StateDB:
        if not self._adopting:
            return db
        try:
            current = db.metrics
        except Exception:  # a proxy whose store is not open yet (contrib.fastapi): at next use
            return db
        self._adopting = False
        if current is None:
            db.metrics = self._metrics
        return db

    @property
    def description(self) -> str:
        if self._db is not None:
            return self._db.url
        return redact(self._url or "")

    def open_in_background(self) -> asyncio.Task[StateDB]:
        """Start opening the store, and keep trying for as long as it is away; the task ends
        with the open store, or with the error no waiting fixes (a bad URL, a database or role
        that does not exist, bad credentials), which it raises. Meanwhile ``get`` answers at
        once: ``StoreUnavailable`` (503 with Retry-After) naming the last cause."""
        if self._opener is None:
            self._opener = asyncio.get_running_loop().create_task(self._keep_opening())
        return self._opener

    async def _keep_opening(self) -> StateDB:
        streak = Streak(OPEN_BACKOFF, what=f"opening the store {self.description}", logger=log)
        while self._db is None:
            try:
                db = await open_db(self._url)
            except (StoreUnavailable, OSError) as exc:  # away: try again (anything else is not)
                self._away = " ".join(str(exc).split())
                await asyncio.sleep(streak.failed(exc))
                continue
            streak.succeeded()
            self._db, self._away = self._adopt(db), None
        return self._db

    async def get(self) -> StateDB:
        """The open store. Raises StoreUnavailable while it cannot be opened."""
        if self._db is not None:
            return self._adopt(self._db) if self._adopting else self._db
        if self._opener is not None:
            if self._opener.done() and not self._opener.cancelled() and self._opener.exception():
                raise StoreError(f"the store cannot be opened: {self._opener.exception()}")
            cause = f"last attempt: {self._away}" if self._away else "first attempt under way"
            raise StoreUnavailable(f"the store is not open yet; still trying ({cause})")
        async with self._lock:
            if self._db is None:
                try:
                    self._db = self._adopt(await open_db(self._url))
                except StoreError:
                    raise
                except TaskValidationError as exc:  # a bad URL is the operator's, not the caller's
                    raise StoreError(f"the store URL is invalid: {exc}") from exc
                except OSError as exc:
                    raise StoreUnavailable(f"cannot open the store: {exc}") from exc
        return self._db

    async def close(self) -> None:
        """Close the store if this handle opened it (stopping a background opener first); safe
        to call twice."""
        if self._opener is not None and not self._opener.done():
            self._opener.cancel()
            await asyncio.gather(self._opener, return_exceptions=True)
        if self._owned and self._db is not None:
            db, self._db = self._db, None
            await db.close()


@dataclass
class Services:
    store: StoreHandle
    registry: TaskAdapterRegistry
    config: HttpConfig
    metrics: TaskMetrics  # this process's (taskward.metrics), also the store's when it had none
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
