"""Child process for scheduler races: wait for a start file, then evaluate the same window of
injected times as its siblings, printing what it did as JSON.

Usage: python -m tests.concurrency.schedule_child URL START_FILE T0 STEP COUNT
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import taskward
from taskward.adapters import AdapterConfig, build_registry
from taskward.schedules import Scheduler


async def main(url: str, start_file: str, t0: int, step: int, count: int) -> None:
    registry = build_registry(AdapterConfig(command_allowlist=frozenset({"true"})))
    async with taskward.open_db(url) as db:
        scheduler = Scheduler(db, registry)
        deadline = time.monotonic() + 30
        while not os.path.exists(start_file):  # a barrier so every child starts at once
            if time.monotonic() > deadline:
                raise SystemExit("start file never appeared")
            await asyncio.sleep(0.001)
        admitted = 0
        for i in range(1, count + 1):
            admitted += len((await scheduler.run_once(now=t0 + i * step)).task_ids)
    m = scheduler.metrics
    print(json.dumps({"admitted": admitted, "lost_races": m.lost_races, "errors": m.errors}))


if __name__ == "__main__":
    url, start_file, t0, step, count = sys.argv[1:6]
    asyncio.run(main(url, start_file, int(t0), int(step), int(count)))
