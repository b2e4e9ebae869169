"""Real worker processes for end-to-end tests: their argv, a scope that always reaps them, and a
wait on a database condition (never a fixed sleep).

Shared by ``tests/concurrency`` and ``tests/faults``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).parents[1]
WORKER_TASKS = "tests.integration.worker_tasks"


def worker_argv(url: str, *extra: str, imports: Sequence[str] = (WORKER_TASKS,)) -> list[str]:
    """``taskward worker`` with fast heartbeats, reapers and retries; ``extra`` goes last."""
    argv = [sys.executable, "-m", "taskward.cli.main", "--db", url]
    for module in imports:
        argv += ["--import", module]
    return [
        *argv,
        "worker",
        "--quiet",
        "--heartbeat-interval",
        "0.2",
        "--reap-interval",
        "0.1",
        "--retry-base",
        "0.01",
        *extra,
    ]


@contextmanager
def workers(argvs: list[list[str]]) -> Iterator[list[subprocess.Popen[str]]]:
    """Start one process per argv (each in a session of its own); SIGKILL what is left on exit."""
    procs = [
        subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for argv in argvs
    ]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)


async def wait_until(check: Callable[[], Awaitable[bool]], *, timeout: float, what: str) -> None:
    """Poll ``check`` every 50 ms until it holds; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)
