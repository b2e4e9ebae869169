"""Task functions the worker tests run through the python adapter."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import taskward
from taskward import CancellationToken, TaskExecutionResult


@taskward.task()
async def noop() -> None:
    return None


@taskward.task()
async def boom(message: str = "boom") -> None:
    raise RuntimeError(message)


@taskward.task()
async def flaky() -> TaskExecutionResult:
    return TaskExecutionResult(status="failed", error_detail="transient", retryable=True)


@taskward.task()
async def nap(seconds: float, timeout_s: float | None = None) -> None:
    await asyncio.sleep(seconds)


@taskward.task()
async def until_cancelled(cancellation: CancellationToken, marker: str | None = None) -> None:
    if marker:
        Path(marker).write_text(str(os.getpid()))
    await cancellation.wait()
    raise asyncio.CancelledError


@taskward.task()
async def touch(path: str) -> None:
    Path(path).write_text("done")


def plain(x: int) -> int:
    return x * 2


@taskward.task()
async def hang_first(marker: str, seconds: float = 60.0) -> None:
    """The first attempt writes the marker and hangs; any later attempt returns at once."""
    path = Path(marker)
    if not path.exists():
        path.write_text(str(os.getpid()))
        await asyncio.sleep(seconds)


@taskward.task()
async def nap_marked(marker: str, seconds: float) -> None:
    Path(marker).write_text(str(os.getpid()))
    await asyncio.sleep(seconds)


@taskward.task()
async def gc_state() -> dict[str, int | str]:
    """The worker process's collector settings and event loop, as its return value
    (cli.common.tune_gc, cli.common.new_event_loop)."""
    import gc

    loop = type(asyncio.get_running_loop())
    return {
        "first_threshold": gc.get_threshold()[0],
        "frozen": gc.get_freeze_count(),
        "loop": f"{loop.__module__}.{loop.__qualname__}",
    }
