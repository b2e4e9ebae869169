"""A worker's heartbeat row (ADR-0071 D4): what it advertises, and the time that says it is alive.

Written by ``taskward worker`` (``runtime.WorkerRuntime``) and by the ADR-0071 call of that name
(``taskward.worker.register_heartbeat``, re-exported from ``taskward``); read by claims (a known
worker with a stale heartbeat claims nothing), the deadline reaper and ``placement``.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence

from taskward.store.port import StateDB


async def register_heartbeat(
    db: StateDB,
    *,
    worker_id: str,
    advertised_capabilities: list[str] | None = None,
    execution_targets: list[str] | None = None,
    now: float | None = None,
    served_kinds: Sequence[str] = (),
    concurrency: int | None = None,
    leased_run_id: str | None = None,
) -> None:
    """Upsert the worker's heartbeat row with what it advertises (default target ``host``)."""
    async with db.transaction(now=now) as tx:
        await tx.execute(
            "worker_heartbeat",
            {
                "worker_id": worker_id,
                "advertised_capabilities": json.dumps(sorted(set(advertised_capabilities or []))),
                "execution_targets": json.dumps(sorted(set(execution_targets or ["host"]))),
                "served_kinds": json.dumps(sorted(set(served_kinds))),
                "leased_run_id": leased_run_id,
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "concurrency": concurrency,
            },
        )
