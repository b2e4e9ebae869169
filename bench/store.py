"""Admission, drain and pickup against a store you name, checking every task the run wrote.

What ``taskward bench`` measured until issue 24 moved bench code out of ``src/``::

    .venv/bin/python bench/store.py --db sqlite:///taskward.db
    .venv/bin/python bench/store.py --db postgresql://user@host/db --json
    .venv/bin/python bench/store.py --count 30 --bulk-count 40 --pickup-count 5   # a quick look

1. ``--count`` admissions one per ``submit_task`` call, 2. ``--bulk-count`` admissions through
``submit_tasks`` (1000 a call), 3. the drain of all of them by ONE real ``taskward worker --burst``
process (``_common.WorkerProcess``), 4. pickup latency: ``--pickup-count`` tasks submitted one at
a time to an idle worker, from just before ``submit_task`` to the task's first fact, 5. the check
of every task the run created: each ``completed`` with exactly its facts (running, completed), an
event for each fact and one complete summary. Violations are reported (exit status 1), never
hidden, so no figure is bought by skipping a write. Tasks carry the key prefix
``bench:<run-id>:`` and ``bench/noop.py``'s kind, and only they are checked; but the worker it
starts is a whole ``taskward worker`` (it claims the built-in kinds too, reaps, fires schedules,
delivers the outbox) and the drain counts completions: point it at a store without other queued
work. Opening the store migrates it unless the URL says ``migrate=false``. The result goes to
stdout (a table, or one JSON object with ``--json``), progress to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # bench._common, after PYTHONPATH

from bench import noop
from bench._common import Store, WorkerProcess, progress, render_table

import taskward
from taskward.reads import count_by_status
from taskward.store.open import DEFAULT_URL, ENV_VAR
from taskward.store.port import StateDB

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


def _apps(run_id: str, tag: str, n: int) -> list[taskward.TaskApplication]:
    return [
        taskward.TaskApplication(
            action_kind=noop.KIND,
            args={},
            execution_target="host",
            idempotency_key=f"bench:{run_id}:{tag}:{i}",
        )
        for i in range(n)
    ]


def _worker(url: str, backend: str, concurrency: int, log_dir: Path, burst: bool) -> WorkerProcess:
    # The store is the caller's: the worker needs its URL only (never read raw, never removed).
    # Its cwd is ours, so a relative sqlite:/// path names the same file; TASKWARD_PYTHON_MODULES
    # is emptied so the caller's own modules are neither imported nor measured.
    store = Store(backend=backend, url=url, raw="", handle="")
    return WorkerProcess(
        store,
        concurrency=concurrency,
        burst=burst,
        log_dir=log_dir,
        cwd=Path.cwd(),
        env={"TASKWARD_PYTHON_MODULES": ""},
        tasks_module=noop.MODULE,
    )


async def _wait(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
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
    report: Progress,
    log_dir: Path,
) -> BenchResult:
    registry = taskward.build_registry(taskward.AdapterConfig(imports=(noop.MODULE,)))
    run_id = uuid.uuid4().hex[:10]
    result = BenchResult(run_id=run_id, backend=db.dialect, drain_concurrency=concurrency)

    # 1. admission, one per call
    apps = _apps(run_id, "single", count)
    started = time.perf_counter()
    ids: list[str] = []
    for i, app in enumerate(apps):
        ids.append(await taskward.submit_task(db, app, registry=registry))
        if i % 200 == 0:
            report("admission", i, count)
    result.admission_per_s = count / (time.perf_counter() - started)
    report("admission", count, count)

    # 2. bulk admission (these tasks are drained too)
    bulk = _apps(run_id, "bulk", bulk_count)
    started = time.perf_counter()
    for offset in range(0, bulk_count, 1000):
        ids += await taskward.submit_tasks(db, bulk[offset : offset + 1000], registry=registry)
        report("bulk admission", min(offset + 1000, bulk_count), bulk_count)
    result.bulk_admission_per_s = bulk_count / (time.perf_counter() - started)

    # 3. drain by a real worker process
    total = len(ids)
    before = (await count_by_status(db))["completed"]
    with _worker(url, db.dialect, concurrency, log_dir, burst=True) as worker:
        started = time.perf_counter()

        async def drained() -> bool:
            done = (await count_by_status(db))["completed"] - before
            report("drain", done, total)
            return done >= total or worker.poll() is not None

        await _wait(drained, 600, "the drain")
        result.drain_per_s = total / (time.perf_counter() - started)
        worker.wait(60.0)

    # 4. pickup latency with an idle worker
    with _worker(url, db.dialect, 4, log_dir, burst=False) as idle:

        async def heartbeating() -> bool:
            rows = await db.fetchall("worker_live_list", {"now": None, "heartbeat_ttl": 5.0})
            return any(r.get("pid") == idle.pid for r in rows)

        await _wait(heartbeating, 30, "the idle worker's heartbeat")
        latencies = []
        for i, app in enumerate(_apps(run_id, "pickup", pickup_count)):
            submitted = await db.now()
            task_id = await taskward.submit_task(db, app, registry=registry)
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

    # 5. every task checked
    result.tasks = len(ids)
    await verify(db, ids, result, report=report)
    return result


async def verify(db: StateDB, ids: list[str], result: BenchResult, *, report: Progress) -> None:
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
            report("verify", i, len(ids))
    report("verify", len(ids), len(ids))
    n = max(1, len(ids))
    result.rows_per_task = {
        "runs": 1.0,
        "facts": facts_total / n,
        "events": events_total / n,
        "summaries": summaries_total / n,
    }


def stage_lines() -> Progress:
    """A progress line on stderr when a stage starts and when it ends (not on every poll)."""
    seen: set[tuple[str, bool]] = set()

    def report(stage: str, done: int, total: int) -> None:
        mark = (stage, done >= total)
        if mark not in seen:
            seen.add(mark)
            progress(f"{stage}: {min(done, total)}/{total}")

    return report


def table(result: BenchResult) -> str:
    rows = [
        ("admission, one per call", f"{result.admission_per_s:,.0f} /s"),
        ("admission, bulk (1000 per call)", f"{result.bulk_admission_per_s:,.0f} /s"),
        (f"drain, 1 worker x {result.drain_concurrency}", f"{result.drain_per_s:,.0f} /s"),
        (
            "pickup p50 / p95 / p99",
            f"{result.pickup_p50_ms:.1f} / {result.pickup_p95_ms:.1f} / "
            f"{result.pickup_p99_ms:.1f} ms",
        ),
        ("tasks checked", str(result.tasks)),
        ("rows per task", ", ".join(f"{k} {v:.2f}" for k, v in result.rows_per_task.items())),
        ("violations", str(len(result.violations))),
    ]
    title = f"bench/store.py on {result.backend} (run {result.run_id})"
    lines = [title, render_table(("measure", "value"), rows)]
    lines += [f"violation: {violation}" for violation in result.violations[:10]]
    return "\n".join(lines)


def _bounded(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not in {low}..{high}")
        return value

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--db",
        default=os.environ.get(ENV_VAR, DEFAULT_URL),
        metavar="URL",
        help=f"the store (default {ENV_VAR}, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--count",
        type=_bounded(10, 1_000_000),
        default=2000,
        help="tasks admitted one per call (and drained); default 2000",
    )
    parser.add_argument(
        "--bulk-count",
        type=_bounded(0, 1_000_000),
        default=10_000,
        help="tasks admitted in bulk (and drained); default 10000",
    )
    parser.add_argument(
        "--pickup-count",
        type=_bounded(5, 10_000),
        default=100,
        help="tasks submitted one at a time to an idle worker; default 100",
    )
    parser.add_argument(
        "--concurrency",
        type=_bounded(1, 1024),
        default=128,
        help="the draining worker's concurrency; default 128 (docs/benchmarks.md, "
        "#figures-that-justified-design-choices)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    async def run() -> BenchResult:
        async with taskward.open_db(args.db) as db:
            with tempfile.TemporaryDirectory(prefix="taskward-bench-store-") as logs:
                return await run_bench(
                    db,
                    url=args.db,
                    count=args.count,
                    bulk_count=args.bulk_count,
                    pickup_count=args.pickup_count,
                    concurrency=args.concurrency,
                    report=stage_lines(),
                    log_dir=Path(logs),
                )

    result = asyncio.run(run())
    print(json.dumps(result.as_dict(), indent=2) if args.json else table(result))
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
