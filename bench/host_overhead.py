"""The resident host's own cost per task: ``ResidentEngineHost`` over an in-memory source and
summary store, with a no-op ``run_task``, in this process; no store, no adapter.

For a per-layer budget of the drain: ``bench/inprocess.py`` times the whole worker (store,
group commit, transitions, adapter, host); this times the host alone, so the difference is what
the layers under it cost. Every task of the in-memory source is handed out once and completed
once; the run fails (exit 1) if any task was not completed exactly once or a task failed.

Usage: .venv/bin/python bench/host_overhead.py [--count 20000] [--concurrency 128] [--repeat 3]

It prints one JSON line: the median tasks/s and CPU microseconds a task (``time.process_time``
over the run), each repeat's figures, and the violations.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # bench._common, after PYTHONPATH

from bench._common import machine_description

from taskward.host import (
    ResidentEngineHost,
    SessionSummary,
    Task,
    TaskAck,
    TaskFailure,
    TaskResult,
)

APPLIED = TaskAck(applied=True)


class MemorySource:
    """Hands out ``tasks`` one per claim, then None; counts every acknowledgement."""

    def __init__(self, tasks: list[Task]) -> None:
        self.tasks = tasks
        self.next = 0
        self.completed: Counter[str] = Counter()
        self.acks = 0
        self.failed: list[str] = []
        self.all_done = asyncio.Event()

    async def claim(self) -> Task | None:
        if self.next >= len(self.tasks):
            return None
        task = self.tasks[self.next]
        self.next += 1
        return task

    async def complete(self, task_id: str, lease_id: str, result: TaskResult) -> TaskAck:
        self.completed[task_id] += 1
        self.acks += 1
        if self.acks >= len(self.tasks):
            self.all_done.set()
        return APPLIED

    async def fail(self, task_id: str, lease_id: str, failure: TaskFailure) -> TaskAck:
        self.failed.append(f"{task_id}: {failure.code}: {failure.detail}")
        self.all_done.set()
        return APPLIED


class MemorySummaries:
    """A summary store that keeps nothing (the host still builds every summary)."""

    async def write(self, session_key: str, summary: SessionSummary) -> None:
        return None

    async def mark_pending(self, session_key: str, reason: str) -> None:
        return None


async def noop(task: Task, session: Any) -> dict[str, Any]:
    return {}


def make_tasks(count: int) -> list[Task]:
    now = datetime.now(UTC)
    return [
        Task(
            id=f"task-{i}",
            objective="noop",
            cwd=Path("/tmp"),
            lease_id=f"lease-{i}",
            lease_expires_at=now + timedelta(hours=1),
            attempt=1,
            deadline=now + timedelta(minutes=30),
        )
        for i in range(count)
    ]


async def one_run(count: int, concurrency: int) -> dict[str, Any]:
    source = MemorySource(make_tasks(count))
    host = ResidentEngineHost(
        source=source,
        summaries=MemorySummaries(),
        max_concurrent_tasks=concurrency,
        session_factory=dict,
        run_task=noop,
    )
    began, cpu = time.perf_counter(), time.process_time()
    serving = asyncio.get_running_loop().create_task(host.serve())
    await source.all_done.wait()
    seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
    serving.cancel()
    await asyncio.gather(serving, return_exceptions=True)
    violations = list(source.failed)
    twice = [task_id for task_id, n in source.completed.items() if n != 1]
    missing = count - len(source.completed)
    if twice:
        violations.append(f"{len(twice)} tasks completed more than once")
    if missing:
        violations.append(f"{missing} tasks never completed")
    return {
        "tasks_per_s": round(count / seconds, 1),
        "cpu_us": round(cpu / count * 1e6, 1),
        "violations": violations,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20_000, help="tasks per run (20,000)")
    parser.add_argument("--concurrency", type=int, default=128, help="host slots (128)")
    parser.add_argument("--repeat", type=int, default=3, help="runs; medians shown (3)")
    args = parser.parse_args(argv)
    if args.count < 1 or args.concurrency < 1 or args.repeat < 1:
        parser.error("--count, --concurrency and --repeat must be positive")
    runs = [asyncio.run(one_run(args.count, args.concurrency)) for _ in range(args.repeat)]
    violations = [v for run in runs for v in run["violations"]]
    print(
        json.dumps(
            {
                "tasks_per_s": statistics.median(r["tasks_per_s"] for r in runs),
                "cpu_us": statistics.median(r["cpu_us"] for r in runs),
                "runs": [{k: r[k] for k in ("tasks_per_s", "cpu_us")} for r in runs],
                "count": args.count,
                "concurrency": args.concurrency,
                "violations": violations,
                "load": machine_description().get("loadavg_1m_at_start"),
            }
        )
    )
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
