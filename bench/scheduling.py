"""The scheduling vocabulary's costs and guarantees (issue 25; DESIGN.md R16, R17, R20).

Three measurements, each on fresh stores (``bench/_common.Stores``), with real ``taskward worker``
processes (``bench.tasks``):

- ``mixed``: a drain of N no-op tasks at every default, and, interleaved in the same run, a drain
  of N where half carry ``priority`` 5 and the limit key ``tenant:bench`` under a limit that never
  binds (``max_running`` 100,000): what a configured limit and mixed priorities cost a claim.
- ``limit``: W worker processes on PostgreSQL drain N tasks of one key limited to L running; the
  peak concurrency is read back from the facts (must not exceed L), and the throughput reported
  beside an unlimited drain of the same tasks by the same workers.
- ``delay``: an idle worker; tasks admitted with ``run_after`` a second or two ahead; the delay
  from ``run_after`` to the task's ``running`` fact, p50 and p95.

A measurement, not a test: it prints numbers and exits 1 only on a violation (a limit exceeded,
a task not completed).

    .venv/bin/python bench/scheduling.py                       # all three, both backends
    .venv/bin/python bench/scheduling.py --only limit --count 2000 --workers 4 --limit 3
    .venv/bin/python bench/scheduling.py --only delay --delay-count 40 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import (
    Store,
    Stores,
    WorkerProcess,
    median,
    percentile,
    progress,
    raw_connection,
    raw_rows,
    render_table,
    wait_for_completed,
    wait_for_heartbeat,
)
from bench.tasks import NOOP_KIND, SLEEP_KIND

import taskward
from taskward.limits import set_limit

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _registry() -> taskward.TaskAdapterRegistry:
    return taskward.build_registry(taskward.AdapterConfig(imports=("bench.tasks",)))


def admit(store: Store, apps: list[taskward.TaskApplication], limits: dict[str, int]) -> None:
    async def run() -> None:
        async with taskward.open_db(store.url) as db:
            for start in range(0, len(apps), 1000):
                await taskward.submit_tasks(db, apps[start : start + 1000], registry=_registry())
            for key, max_running in limits.items():
                await set_limit(db, key, max_running=max_running)

    asyncio.run(run())


def app(kind: str, args: dict[str, Any] | None = None, **fields: Any) -> taskward.TaskApplication:
    return taskward.TaskApplication(
        action_kind=kind,
        args=args or {},
        execution_target="host",
        idempotency_key=f"bench:{uuid.uuid4()}",
        **fields,
    )


def drain(store: Store, count: int, *, workers: int, concurrency: int, log_dir: Path) -> float:
    """Burst workers drain the store; seconds from their spawn to every row completed."""
    procs = [
        WorkerProcess(store, concurrency=concurrency, burst=True, log_dir=log_dir)
        for _ in range(workers)
    ]
    started = time.monotonic()
    for proc in procs:
        proc.start()
    with raw_connection(store) as conn:
        done, seen = wait_for_completed(conn, count, timeout_s=1800)
    for proc in procs:
        proc.wait(120)
    if done != count:
        raise SystemExit(f"violation: {done} of {count} completed")
    return seen - started


def peak_running(store: Store) -> int:
    """The most tasks running at one instant, swept over the facts (an end before a start at
    the same time: a one-step finish ends one task before it claims the next)."""
    with raw_connection(store) as conn:
        rows = raw_rows(
            conn,
            "SELECT created_at, CASE WHEN status = 'running' THEN 1 ELSE -1 END FROM "
            "status_transitions WHERE status = 'running' OR previous_status = 'running'",
        )
    running = peak = 0
    for _, change in sorted(rows, key=lambda r: (float(r[0]), int(r[1]))):
        running += int(change)
        peak = max(peak, running)
    return peak


def measure_mixed(
    stores: Stores, backend: str, count: int, repeat: int, log_dir: Path
) -> dict[str, Any]:
    plain: list[float] = []
    mixed: list[float] = []
    for round_ in range(repeat):
        for label in ("plain", "mixed") if round_ % 2 == 0 else ("mixed", "plain"):
            store = stores.create(backend)
            try:
                if label == "plain":
                    admit(store, [app(NOOP_KIND) for _ in range(count)], {})
                else:
                    apps = [
                        app(NOOP_KIND, priority=5, limit_key="tenant:bench")
                        if n % 2
                        else app(NOOP_KIND)
                        for n in range(count)
                    ]
                    admit(store, apps, {"tenant:bench": 100_000})
                wall = drain(store, count, workers=1, concurrency=128, log_dir=log_dir)
                (plain if label == "plain" else mixed).append(count / wall)
                progress(f"{backend} {label}: {count / wall:,.0f} tasks/s")
            finally:
                stores.remove(store)
    return {
        "backend": backend,
        "plain_tasks_per_s": median(plain),
        "mixed_tasks_per_s": median(mixed),
        "ratio": median(mixed) / median(plain),
        "plain_runs": plain,
        "mixed_runs": mixed,
    }


def measure_limit(
    stores: Stores,
    backend: str,
    count: int,
    workers: int,
    limit: int,
    seconds: float,
    log_dir: Path,
) -> dict[str, Any]:
    out: dict[str, Any] = {"backend": backend, "workers": workers, "limit": limit}
    for label, limits in (("unlimited", {}), ("limited", {"tenant:hot": limit})):
        store = stores.create(backend)
        try:
            apps = [
                app(SLEEP_KIND, {"seconds": seconds}, limit_key="tenant:hot") for _ in range(count)
            ]
            admit(store, apps, limits)
            wall = drain(store, count, workers=workers, concurrency=8, log_dir=log_dir)
            peak = peak_running(store)
            out[label] = {"tasks_per_s": count / wall, "wall_s": wall, "peak_running": peak}
            progress(f"{backend} {label}: {count / wall:,.1f} tasks/s, peak running {peak}")
        finally:
            stores.remove(store)
    out["violation"] = out["limited"]["peak_running"] > limit
    return out


def measure_delay(stores: Stores, backend: str, count: int, log_dir: Path) -> dict[str, Any]:
    store = stores.create(backend)
    worker = WorkerProcess(store, concurrency=4, burst=False, log_dir=log_dir)
    try:
        worker.start()
        with raw_connection(store) as conn:
            wait_for_heartbeat(conn, worker)
        lags: list[float] = []

        async def run() -> None:
            async with taskward.open_db(store.url) as db:
                ids = []
                for n in range(count):
                    at = time.time() + 1.0 + (n % 10) * 0.1
                    ids.append(
                        await taskward.submit_task(
                            db, app(NOOP_KIND, run_after=at), registry=_registry()
                        )
                    )
                    await asyncio.sleep(0.05)
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    counts = await taskward.reads.count_by_status(db)
                    if counts["completed"] >= count:
                        break
                    await asyncio.sleep(0.1)
                for task_id in ids:
                    row = await taskward.get_task(db, task_id)
                    facts = await taskward.list_transitions(db, task_id)
                    start = next(f["created_at"] for f in facts if f["status"] == "running")
                    lags.append(start - row["run_after"])

        asyncio.run(run())
        if len(lags) != count or min(lags) < 0:
            raise SystemExit(f"violation: a delayed task started early or not at all: {lags}")
        return {
            "backend": backend,
            "count": count,
            "p50_ms": percentile(lags, 50) * 1000,
            "p95_ms": percentile(lags, 95) * 1000,
            "max_ms": max(lags) * 1000,
        }
    finally:
        worker.stop()
        stores.remove(store)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("mixed", "limit", "delay"), action="append")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg-url", default=PG_URL)
    parser.add_argument("--count", type=int, default=5000, help="tasks per mixed drain")
    parser.add_argument("--repeat", type=int, default=3, help="mixed drains of each kind")
    parser.add_argument("--limit-count", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--sleep", type=float, default=0.0, help="each limited task's seconds")
    parser.add_argument("--delay-count", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    only = set(args.only or ("mixed", "limit", "delay"))
    backends = args.backends.split(",")
    stores = Stores(args.pg_url, None, "sched")
    log_dir = stores.directory
    result: dict[str, Any] = {"mixed": [], "limit": [], "delay": []}
    try:
        for backend in backends:
            if "mixed" in only:
                result["mixed"].append(
                    measure_mixed(stores, backend, args.count, args.repeat, log_dir)
                )
            if "limit" in only and backend == "postgres":
                result["limit"].append(
                    measure_limit(
                        stores,
                        backend,
                        args.limit_count,
                        args.workers,
                        args.limit,
                        args.sleep,
                        log_dir,
                    )
                )
            if "delay" in only:
                result["delay"].append(measure_delay(stores, backend, args.delay_count, log_dir))
    finally:
        stores.close()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        if result["mixed"]:
            print(
                render_table(
                    ["backend", "defaults tasks/s", "half priority+limit tasks/s", "ratio"],
                    [
                        [
                            m["backend"],
                            f"{m['plain_tasks_per_s']:,.0f}",
                            f"{m['mixed_tasks_per_s']:,.0f}",
                            f"{m['ratio']:.2f}",
                        ]
                        for m in result["mixed"]
                    ],
                )
            )
        for m in result["limit"]:
            print(
                f"limit {m['limit']}, {m['workers']} workers ({m['backend']}): "
                f"{m['limited']['tasks_per_s']:,.1f} tasks/s, peak running "
                f"{m['limited']['peak_running']}; unlimited {m['unlimited']['tasks_per_s']:,.1f} "
                f"tasks/s, peak {m['unlimited']['peak_running']}"
            )
        for m in result["delay"]:
            print(
                f"delay ({m['backend']}): start - run_after p50 {m['p50_ms']:.0f} ms, "
                f"p95 {m['p95_ms']:.0f} ms, max {m['max_ms']:.0f} ms over {m['count']}"
            )
    violated = any(m["violation"] for m in result["limit"])
    return 1 if violated else 0


if __name__ == "__main__":
    sys.exit(main())
