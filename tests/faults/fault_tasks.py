"""Task functions of the fault scenarios (imported by worker processes with ``--import``).

Poison work ends the process that runs it or never returns; healthy work leaves a trace of
every execution, so a test can count them (execution is at least once).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import taskward


@taskward.task()
async def append_line(path: str, line: str = "ran") -> None:
    """Healthy work whose every execution appends one line to ``path``."""
    with Path(path).open("a") as f:
        f.write(f"{line} {os.getpid()}\n")


@taskward.task()
async def crash_worker(how: str = "exit") -> None:
    """Poison: ends the worker process running it, with ``os._exit(137)`` or a SIGKILL."""
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(137)


@taskward.task()
async def hang(seconds: float = 3600.0, timeout_s: float | None = None) -> None:
    """Poison: sleeps far past its deadline (``timeout_s``); only the watchdog ends it."""
    await asyncio.sleep(seconds)


@taskward.task()
async def wait_for_cancel(
    cancellation: taskward.CancellationToken, marker: str, timeout_s: float | None = None
) -> None:
    """Writes ``marker`` once running, then waits for its cancellation (up to ``timeout_s``)."""
    Path(marker).write_text(str(os.getpid()))
    await cancellation.wait()
    raise asyncio.CancelledError


@taskward.task()
def hang_in_thread(seconds: float = 3600.0, timeout_s: float | None = None) -> None:
    """Poison: a synchronous function (run in a thread) that blocks far past its deadline; a
    thread cannot be cancelled, so only the watchdog's verdict ends the task."""
    time.sleep(seconds)
