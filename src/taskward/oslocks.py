"""Worker-side OS locks for serialization tokens that name a machine-local resource.

The queue's concurrency key is advisory across the queue (ADR-0071 D5): a process outside the
queue can still use the GPU. An exclusive ``flock`` on ``<lock dir>/<token>.lock`` is the
authoritative local lock; the kernel releases it when the process dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

DEFAULT_LOCK_DIR = Path(os.environ.get("TASKWARD_LOCK_DIR", "/tmp/taskward-locks"))
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class LockTimeout(Exception):
    """The local resource stayed locked until the deadline."""


@contextlib.asynccontextmanager
async def machine_locks(
    tokens: Sequence[str],
    *,
    timeout_s: float,
    lock_dir: Path | None = None,
    poll_s: float = 0.05,
) -> AsyncIterator[None]:
    """Hold an exclusive flock per token (sorted, so two holders never deadlock)."""
    folder = lock_dir or DEFAULT_LOCK_DIR
    folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    held: list[int] = []
    try:
        for token in sorted(set(tokens)):
            fd = os.open(folder / f"{_SAFE.sub('_', token)}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            held.append(fd)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise LockTimeout(f"local resource {token!r} stayed locked") from None
                    await asyncio.sleep(poll_s)
        yield
    finally:
        for fd in held:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
