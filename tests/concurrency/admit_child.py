"""Child process for admission races: wait for a start file, submit, print the outcome as JSON.

Usage: python -m tests.concurrency.admit_child URL START_FILE KEY VARIANT COUNT
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import taskward
from taskward.adapters import AdapterConfig, build_registry


async def main(url: str, start_file: str, key: str, variant: str, count: int) -> None:
    registry = build_registry(AdapterConfig(command_allowlist=frozenset({"echo"})))
    outcomes = []
    async with taskward.open_db(url) as db:
        deadline = time.monotonic() + 30
        while not os.path.exists(start_file):  # a barrier so every child submits at once
            if time.monotonic() > deadline:
                raise SystemExit("start file never appeared")
            await asyncio.sleep(0.001)
        for i in range(count):
            app = taskward.TaskApplication(
                action_kind="command",
                args={"argv": ["echo", variant]},
                execution_target="host",
                idempotency_key=f"{key}-{i}",
            )
            try:
                outcomes.append({"id": await taskward.submit_task(db, app, registry=registry)})
            except taskward.TaskIdempotencyConflict as exc:
                outcomes.append({"conflict": exc.existing_task_id})
    print(json.dumps(outcomes))


if __name__ == "__main__":
    url, start_file, key, variant, count = sys.argv[1:6]
    asyncio.run(main(url, start_file, key, variant, int(count)))
