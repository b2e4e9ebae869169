"""``taskward bench``: admission, drain and pickup against the configured store.

Every run ends by checking its own tasks: each terminal, with exactly its facts (running,
completed), its events and its summary; violations are reported, never hidden, so no figure is
bought by skipping a write. Tasks carry the key prefix ``bench:<run-id>:`` and the kind
``taskward_bench_noop``; nothing else in the store is touched or counted.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from taskward.adapters import AdapterConfig, build_registry
from taskward.admission import submit_task, submit_tasks
from taskward.models import TaskApplication
from taskward.reads import count_by_status
from taskward.store.port import StateDB

BENCH_KIND: Final = "taskward_bench_noop"
BENCH_MODULE: Final = "taskward.benchtasks"

Progress = Callable[[str, int, int], None]


@dataclass
class BenchResult:
    run_id: str
    backend: str
    admission_per_s: float = 0.0
    bulk_admission_per_s: float = 0.0
    drain_per_s: float = 0.0
    drain_concurrency: int = 0
    pickup_p50_ms: float = 0.0
    pickup_p95_ms: float = 0.0
    pickup_p99_ms: float = 0.0
    tasks: int = 0
    violations: list[str] = field(default_factory=list)
    rows_per_task: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["violation_count"] = len(self.violations)
        out["violations"] = self.violations[:20]
        return out


def _apps(run_id: str, tag: str, n: int) -> list[TaskApplication]:
    return [
        TaskApplication(
            action_kind=BENCH_KIND,
            args={},
            execution_target="host",
            idempotency_key=f"bench:{run_id}:{tag}:{i}",
        )
        for i in range(n)
    ]


def _worker(url: str, concurrency: int, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "taskward.cli.main",
            "--db",
            url,
            "--import",
            BENCH_MODULE,
            "worker",
            "--quiet",
            "--concurrency",
            str(concurrency),
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "TASKWARD_PYTHON_MODULES": ""},
    )


async def _wait(check: Callable[[], Any], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"benchmark timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def run_bench(
    db: StateDB,
    *,
    url: str,
    count: int = 2000,
    bulk_count: int = 10_000,
    pickup_count: int = 100,
    concurrency: int = 128,
    progress: Progress | None = None,
) -> BenchResult:
    report = progress or (lambda stage, done, total: None)
    registry = build_registry(AdapterConfig(imports=(BENCH_MODULE,)))
    run_id = uuid.uuid4().hex[:10]
    result = BenchResult(run_id=run_id, backend=db.dialect, drain_concurrency=concurrency)

    # 1. admission, one per call
    apps = _apps(run_id, "single", count)
    started = time.perf_counter()
    ids: list[str] = []
    for i, app in enumerate(apps):
        ids.append(await submit_task(db, app, registry=registry))
        if i % 200 == 0:
            report("admission", i, count)
    result.admission_per_s = count / (time.perf_counter() - started)
    report("admission", count, count)

    # 2. bulk admission (these tasks are drained too)
    bulk = _apps(run_id, "bulk", bulk_count)
    started = time.perf_counter()
    for offset in range(0, bulk_count, 1000):
        ids += await submit_tasks(db, bulk[offset : offset + 1000], registry=registry)
        report("bulk admission", offset + 1000, bulk_count)
    result.bulk_admission_per_s = bulk_count / (time.perf_counter() - started)

    # 3. drain by a real worker process
    total = len(ids)
    before = (await count_by_status(db))["completed"]
    worker = _worker(url, concurrency, "--burst")
    started = time.perf_counter()

    async def drained() -> bool:
        done = (await count_by_status(db))["completed"] - before
        report("drain", done, total)
        return done >= total or worker.poll() is not None

    await _wait(drained, 600, "the drain")
    result.drain_per_s = total / (time.perf_counter() - started)
    worker.wait(timeout=60)

    # 4. pickup latency with an idle worker
    idle = _worker(url, 4)
    try:

        async def heartbeating() -> bool:
            rows = await db.fetchall("worker_live_list", {"now": None, "heartbeat_ttl": 5.0})
            return any(r.get("pid") == idle.pid for r in rows)

        await _wait(heartbeating, 30, "the idle worker's heartbeat")
        latencies = []
        for i, app in enumerate(_apps(run_id, "pickup", pickup_count)):
            submitted = await db.now()
            task_id = await submit_task(db, app, registry=registry)
            ids.append(task_id)

            async def running(task_id: str = task_id) -> bool:
                return bool(await db.fetchall("fact_list", {"entity_id": task_id}))

            await _wait(running, 30, "a pickup")
            facts = await db.fetchall("fact_list", {"entity_id": task_id})
            latencies.append((float(facts[0]["created_at"]) - submitted) * 1000)
            report("pickup", i + 1, pickup_count)
            await asyncio.sleep(0.01)
        qs = statistics.quantiles(latencies, n=100, method="inclusive")
        result.pickup_p50_ms = statistics.median(latencies)
        result.pickup_p95_ms, result.pickup_p99_ms = qs[94], qs[98]

        async def all_done() -> bool:
            return (await count_by_status(db))["completed"] - before >= len(ids)

        await _wait(all_done, 60, "the pickup tasks")
    finally:
        idle.terminate()
        idle.wait(timeout=30)

    # 5. every task checked
    result.tasks = len(ids)
    await verify(db, ids, result, progress=report)
    return result


async def verify(db: StateDB, ids: list[str], result: BenchResult, *, progress: Progress) -> None:
    facts_total = events_total = summaries_total = 0
    for i, task_id in enumerate(ids):
        row = await db.fetchone("run_get", {"id": task_id})
        facts = await db.fetchall("fact_list", {"entity_id": task_id})
        events = await db.fetchall("event_list", {"task_id": task_id})
        summaries = await db.fetchall("summary_list_for_task", {"task_id": task_id})
        facts_total += len(facts)
        events_total += len(events)
        summaries_total += len(summaries)
        if row is None or row["status"] != "completed":
            result.violations.append(f"{task_id}: status {row and row['status']}")
        if [f["status"] for f in facts] != ["running", "completed"]:
            result.violations.append(f"{task_id}: facts {[f['status'] for f in facts]}")
        if sorted(e["transition_id"] for e in events) != sorted(f["id"] for f in facts):
            result.violations.append(f"{task_id}: events do not match facts one to one")
        if [s["state"] for s in summaries] != ["complete"]:
            result.violations.append(f"{task_id}: summaries {[s['state'] for s in summaries]}")
        if i % 500 == 0:
            progress("verify", i, len(ids))
    progress("verify", len(ids), len(ids))
    n = max(1, len(ids))
    result.rows_per_task = {
        "runs": 1.0,
        "facts": facts_total / n,
        "events": events_total / n,
        "summaries": summaries_total / n,
    }


def to_json(result: BenchResult) -> str:
    return json.dumps(result.as_dict(), indent=2)
