"""In-process wake-up signals: a sequence number plus an event, one per channel.

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
        self._event = asyncio.Event()

    def bump(self) -> None:
        self.seq += 1
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self, seen: int, wait_s: float | None) -> bool:
        """Return True as soon as ``seq`` differs from ``seen``; False after ``wait_s``."""
        if self.seq != seen:
            return True
        event = self._event
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
        # that races the event, which would leave a cancelled watcher running forever.
        try:
            async with asyncio.timeout(wait_s):
                await event.wait()
        except TimeoutError:
            return self.seq != seen
        return True


class Signals:
    def __init__(self) -> None:
        self._signals = {name: Signal() for name in CHANNELS}

    def get(self, channel: str) -> Signal:
        return self._signals[channel]

    def bump(self, *channels: str) -> None:
        for channel in channels or CHANNELS:
            self._signals[channel].bump()
