"""Task functions of the stress tests (python adapter)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import taskward


@taskward.task()
async def gate(started: str, go: str) -> None:
    """Say it started, then finish once the test creates ``go``."""
    Path(started).write_text("started")
    while not Path(go).exists():
        await asyncio.sleep(0.01)
