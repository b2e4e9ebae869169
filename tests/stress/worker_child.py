"""A worker process for the fault tests: the ``taskward worker`` runtime with an idle wait long
enough that only a wake-up (NOTIFY, a LISTEN reconnection) can make an idle worker claim soon.

Usage: python -m tests.stress.worker_child URL CONCURRENCY IDLE_WAIT_S
Prints its host's counts as one JSON line when it stops (SIGTERM drains).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys

import taskward
from taskward.adapters import AdapterConfig, build_registry
from taskward.execution import RetryPolicy
from taskward.runtime import WorkerConfig, WorkerRuntime


async def main(url: str, concurrency: int, idle_wait_s: float) -> int:
    registry = build_registry(AdapterConfig(imports=("tests.integration.worker_tasks",)))
    config = WorkerConfig(
        concurrency=concurrency,
        heartbeat_interval_s=0.2,
        reap_interval_s=0.1,
        idle_wait_s=idle_wait_s,
        lease_ttl=2.0,
        lease_slack_s=1.0,
        retry_policy=RetryPolicy(base_s=0.01),
        deliver_outbox=False,
        run_scheduler=False,
    )
    async with taskward.open_db(url) as db:
        runtime = WorkerRuntime(db, registry, config)
        runtime.install_signal_handlers()
        code = await runtime.run()
        stats = runtime.host.stats
        print(
            json.dumps(
                {
                    "worker": runtime.worker_id,
                    "claimed": stats.claimed,
                    "completed": stats.completed,
                    "failed": stats.failed,
                    "ack_rejected": stats.ack_rejected,
                    "claim_errors": sum(e.startswith("claim failed") for e in stats.errors),
                    "other_errors": [e for e in stats.errors if not e.startswith("claim failed")],
                }
            ),
            flush=True,
        )
    return code


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s"
    )
    url, concurrency, idle_wait_s = sys.argv[1:4]
    sys.exit(asyncio.run(main(url, int(concurrency), float(idle_wait_s))))
