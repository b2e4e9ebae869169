"""The no-op task of the drains that measure the queue itself (``--import bench.noop``).

``bench/compare`` (taskward's adapter), ``inprocess.py``, ``sql_replay.py``, ``instructions.py``
and ``store.py`` drain this kind. It was ``taskward.benchtasks`` until issue 24 moved bench code
out of ``src/``; the kind is unchanged and the module registers nothing else, because a worker's
claim names every kind its registry holds and the kind is stored in every row: the figures
measured before the move and after it are of the same statements and the same rows.
(``bench/tasks.py`` holds the kinds of ``worker.py``, ``host.py`` and the other worker
benchmarks.)
"""

from __future__ import annotations

import taskward

MODULE = "bench.noop"  # importable with the repository root on sys.path / PYTHONPATH
KIND = "taskward_bench_noop"


@taskward.task(KIND)
async def noop() -> None:
    """Does nothing: what is measured is the queue's own work around it."""
    return None
