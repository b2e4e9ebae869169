"""In-process wake-up signals: a sequence number plus the futures waiting on it, one per channel.

A waiter records ``seq`` before it looks for work and then waits for a change, so a signal that
arrives between the look and the wait is never lost. Dialects bump signals after their own
commits and when another process's commit is observed (LISTEN/NOTIFY on PostgreSQL, polling
``PRAGMA data_version`` on SQLite).
"""

from __future__ import annotations

import asyncio
from typing import Final

CHANNELS: Final = ("queued", "cancel")


class Signal:
    def __init__(self) -> None:
        self.seq = 0
        self._waiters: set[asyncio.Future[bool]] = set()

    def bump(self) -> None:
        self.seq += 1
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            _settle(waiter, True)

    def changed(self, seen: int, wait_s: float | None) -> asyncio.Future[bool]:
        """A future that ``bump`` resolves to True once ``seq`` differs from ``seen`` (at once
        if it already does), or that resolves to False after ``wait_s``.

        A plain future, not a task: whoever awaits it (or chains a callback on it) wakes in the
        loop turn after the bump. An idle worker's pickup waits here (issue 7). Cancelling it
        drops it; nothing else is left behind.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        if self.seq != seen:
            future.set_result(True)
            return future
        self._waiters.add(future)
        future.add_done_callback(self._waiters.discard)
        if wait_s is not None:
            timer = loop.call_later(wait_s, _settle, future, False)
            future.add_done_callback(lambda _: timer.cancel())
        return future

    async def wait(self, seen: int, wait_s: float | None) -> bool:
        """Return True as soon as ``seq`` differs from ``seen``; False after ``wait_s``."""
        return await self.changed(seen, wait_s)


def _settle(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


class Signals:
    def __init__(self) -> None:
        self._signals = {name: Signal() for name in CHANNELS}

    def get(self, channel: str) -> Signal:
        return self._signals[channel]

    def bump(self, *channels: str) -> None:
        for channel in channels or CHANNELS:
            self._signals[channel].bump()
