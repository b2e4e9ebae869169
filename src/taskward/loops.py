"""Cancellation safety for long-running background loops.

A cancellation can be swallowed on its way through third-party code (a driver's cleanup that
catches and finishes, ``asyncio.wait_for`` racing a result on Python 3.11); a loop that then
simply waits again would run forever while its owner awaits it. Every background loop calls
``raise_if_cancelling()`` once per iteration: a task whose cancellation is pending stops.
"""

from __future__ import annotations

import asyncio


def raise_if_cancelling() -> None:
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
