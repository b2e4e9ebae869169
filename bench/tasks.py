"""``@taskward.task`` functions the benchmarks run (``--import bench.tasks``).

Workers started by ``bench/worker.py`` and ``bench/host.py`` import this module with
``PYTHONPATH`` (or the working directory) set to the repository root, so the kinds below are
registered in their registries and in the benchmark process's own registry alike.
"""

from __future__ import annotations

import asyncio

import taskward

NOOP_KIND = "bench.noop"
SLEEP_KIND = "bench.sleep"


@taskward.task(NOOP_KIND)
async def noop() -> None:
    """Does nothing: what is measured is the queue's own work around it."""
    return None


@taskward.task(SLEEP_KIND)
async def sleep(seconds: float = 0.05) -> None:
    """Awaits ``seconds`` (default 50 ms) without holding the event loop."""
    await asyncio.sleep(seconds)
