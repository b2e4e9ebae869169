"""Riding out a store that is briefly away: capped exponential backoff with jitter.

Only ``StoreUnavailable`` is retried. The dialects raise it for what passes by itself:
PostgreSQL connection loss or refusal (SQLSTATE class 08, or no SQLSTATE at all), an
administrator or crash shutdown and a server not yet accepting connections (57P01-57P03), a
serialization failure or deadlock (40001, 40P01), exhausted resources (class 53), a lock or
statement timeout (55P03, 57014), an exhausted pool; SQLite busy or locked past the lock budget,
and its I/O, disk-full and cannot-open errors. Every other error is a bug or bad input and is
raised at once.

Only an operation whose repetition is harmless may be retried, and the caller decides: a
transition under its idempotency key (a commit whose reply was lost replays as the original
result, R3), an admission under its key, a summary write (the same content again is a no-op), a
read, a claim (a lease whose reply was lost expires and is reaped). This module only waits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from taskward.errors import StoreUnavailable
from taskward.registry import Backoff

T = TypeVar("T")

log = logging.getLogger("taskward.store.retry")

# A background loop's waits grow up to this (or its interval, when longer).
LOOP_CAP_S: Final = 5.0


def outage_backoff(base_s: float = 0.05, cap_s: float = 2.0, factor: float = 2.0) -> Backoff:
    """The wait after the n-th consecutive failure while the store is away: a uniform draw in
    the upper half ``[c/2, c]`` of ``c = min(cap_s, base_s * factor ** (n - 1))``, so workers
    that lost the store together do not retry in step. It is the one ``Backoff`` (the
    registry's) with base and cap scaled by 3/4 and a jitter of 1/3: ``0.75 c * (1 +- 1/3)``
    spans exactly ``[c/2, c]``."""
    return Backoff(base_s=0.75 * base_s, cap_s=0.75 * cap_s, factor=factor, jitter=1 / 3)


# Acknowledgements, summaries and claims: back within about two seconds of the store.
STORE_BACKOFF: Final = outage_backoff()


def loop_backoff(interval_s: float) -> Backoff:
    """A periodic loop's backoff: its own interval first, growing to ``LOOP_CAP_S``."""
    return outage_backoff(base_s=interval_s, cap_s=max(interval_s, LOOP_CAP_S))


class Streak:
    """Consecutive failures of one operation or loop: the wait before the next try.

    Logs the first failure of a streak at WARNING, the rest at DEBUG, and the recovery at
    WARNING, so a long outage is two lines, not one per attempt (``logger=None``: silent).
    """

    def __init__(self, backoff: Backoff, *, what: str, logger: logging.Logger | None = log) -> None:
        self.backoff = backoff
        self.what = what
        self.logger = logger
        self.failures = 0
        self.total_failures = 0

    def failed(self, exc: BaseException) -> float:
        """Count a failure; returns how long to wait before trying again."""
        self.failures += 1
        self.total_failures += 1
        delay = self.backoff.delay(self.failures)
        if self.logger is not None:
            level = logging.WARNING if self.failures == 1 else logging.DEBUG
            self.logger.log(
                level, "%s failed (%s); retrying in %.2fs", self.what, _describe(exc), delay
            )
        return delay

    def succeeded(self) -> None:
        if self.failures and self.logger is not None:
            self.logger.warning("%s succeeded after %d failed attempt(s)", self.what, self.failures)
        self.failures = 0


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def retry_while_unavailable(
    op: Callable[[], Awaitable[T]],
    *,
    what: str,
    backoff: Backoff = STORE_BACKOFF,
    budget_s: float | None = None,
    logger: logging.Logger | None = log,
) -> T:
    """Await ``op()`` until it does not raise ``StoreUnavailable``; other errors propagate.

    ``budget_s`` None retries until the store is back or the caller is cancelled; otherwise the
    last ``StoreUnavailable`` is raised once the next wait would end past the budget.
    """
    started = None if budget_s is None else time.monotonic()
    try:  # the usual case, and a hot path (every task's acknowledgement): one await, no streak
        return await op()
    except StoreUnavailable as exc:
        failure = exc
    streak = Streak(backoff, what=what, logger=logger)
    deadline = None if started is None or budget_s is None else started + budget_s
    while True:
        delay = streak.failed(failure)
        if deadline is not None and time.monotonic() + delay > deadline:
            raise failure
        await asyncio.sleep(delay)
        try:
            result = await op()
        except StoreUnavailable as exc:
            failure = exc
            continue
        streak.succeeded()
        return result


__all__ = [
    "LOOP_CAP_S",
    "STORE_BACKOFF",
    "Backoff",
    "Streak",
    "loop_backoff",
    "outage_backoff",
    "retry_while_unavailable",
]
