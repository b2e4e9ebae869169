"""Task functions for ``taskward bench`` (imported by its worker with ``--import``)."""

from __future__ import annotations

from taskward.adapters.python import task


@task("taskward_bench_noop")
async def noop() -> None:
    """Does nothing: the benchmark measures the queue, not the work."""
    return None
