"""taskward for ``bench/compare``, on SQLite (``synchronous=FULL``, the default) or PostgreSQL.

Only the public API and the CLI: ``taskward.submit_task`` (one call, one transaction, per
enqueue; ``taskward.SyncClient.submit_task`` timed after it as ``sync_per_s``),
``taskward.submit_tasks`` (bulk, untimed prefill; also timed once as ``bulk_per_s``),
and ONE ``taskward --db URL --import bench.noop worker --burst --quiet --concurrency C``
process for the drain (kind ``taskward_bench_noop``, an async no-op). The check after each run is
the full audit trail: every task ``completed`` with exactly 2 ``status_transitions`` facts
(queued -> running -> completed), 2 ``transition`` events linked to them and 1 complete summary
(``bench/_common.py`` ``audit_store``). Runs in taskward's own virtual environment.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
for _path in (str(HERE), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import _adapter as A  # noqa: E402
from bench import noop  # noqa: E402
from bench._common import (  # noqa: E402
    Store,
    audit_store,
    raw_connection,
    raw_rows,
    raw_value,
    with_query,
)

import taskward  # noqa: E402

KIND = noop.KIND
MODULE = noop.MODULE  # PYTHONPATH names the repository root (worker_env)
BULK_CHUNK = 1000
DEFAULT_CONCURRENCY = 16


def make_store(args: argparse.Namespace) -> tuple[Store, str]:
    """The store (``migrate=false`` URL) and the URL that migrates it on first open."""
    if args.backend == "sqlite":
        path = str(Path(args.sqlite_path).resolve())
        url = f"sqlite:///{path}"
        return Store("sqlite", with_query(url, migrate="false"), path, path), url
    url = A.pg_url_with_schema(args.pg_url, args.schema)
    return Store("postgres", with_query(url, migrate="false"), url, args.schema), url


def registry() -> Any:
    return taskward.build_registry(taskward.AdapterConfig(imports=(MODULE,)))


def application(key: str) -> taskward.TaskApplication:
    return taskward.TaskApplication(
        action_kind=KIND, args={}, execution_target="host", idempotency_key=key
    )


async def migrate(url: str) -> None:
    async with taskward.open_db(url):
        pass


def worker_argv(store: Store, concurrency: int, *, burst: bool, processes: int = 1) -> list[str]:
    script = Path(sys.executable).with_name("taskward")
    head = [str(script)] if script.exists() else [sys.executable, "-m", "taskward.cli.main"]
    argv = [*head, "--db", store.url, "--import", MODULE, "worker", "--quiet"]
    argv += ["--concurrency", str(concurrency)]
    if processes != 1:  # R26: one supervisor, N worker processes, each this concurrency
        argv += ["--processes", str(processes)]
    return argv + (["--burst"] if burst else [])


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("TASKWARD_DATABASE_URL", "TASKWARD_IMPORTS"):
        env.pop(name, None)
    env["TASKWARD_PYTHON_MODULES"] = ""  # as bench/store.py runs its worker
    env["PYTHONPATH"] = str(REPO_ROOT)  # for --import bench.noop (run.py clears PYTHONPATH)
    return env


def completed(conn: Any) -> int:
    return int(raw_value(conn, "SELECT count(*) FROM schedule_runs WHERE status = 'completed'"))


def audit_fields(store: Store, expected: int, violations: list[str]) -> dict[str, Any]:
    audit = audit_store(store, expected)
    violations += audit.violations
    return {
        "check": {
            "expected": expected,
            "tasks": audit.tasks,
            "facts": audit.facts,
            "events": audit.events,
            "summaries": audit.summaries,
        },
        "rows_per_job": {"runs": 1.0, **audit.per_task()},
    }


# -- workloads ----------------------------------------------------------------------------------


def enqueue(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    reg = registry()

    async def run() -> tuple[float, float]:
        async with taskward.open_db(store.url) as db:
            for i in range(args.warmup):
                await taskward.submit_task(db, application(f"warm-{i}"), registry=reg)
            began = time.perf_counter()
            for i in range(args.jobs):
                await taskward.submit_task(db, application(f"single-{i}"), registry=reg)
            single_s = time.perf_counter() - began
            # The synchronous client, as a program without an event loop admits: the same
            # count, one call each (this loop blocks; nothing else runs on it meanwhile).
            with taskward.SyncClient(store.url, registry=reg) as client:
                client.submit_task(application("sync-warm"))
                began = time.perf_counter()
                for i in range(args.jobs):
                    client.submit_task(application(f"sync-{i}"))
                sync_s = time.perf_counter() - began
            apps = [application(f"bulk-{i}") for i in range(args.jobs)]
            began = time.perf_counter()
            for offset in range(0, args.jobs, BULK_CHUNK):
                await taskward.submit_tasks(db, apps[offset : offset + BULK_CHUNK], registry=reg)
            return single_s, sync_s, time.perf_counter() - began

    single_s, sync_s, bulk_s = asyncio.run(run())
    expected = args.warmup + 1 + 3 * args.jobs
    violations: list[str] = []
    with raw_connection(store) as conn:
        rows, queued = raw_rows(
            conn,
            "SELECT count(*), sum(CASE WHEN status = 'queued' THEN 1 ELSE 0 END) "
            "FROM schedule_runs",
        )[0]
        facts = int(raw_value(conn, "SELECT count(*) FROM status_transitions"))
    A.check(violations, int(rows) != expected, f"{rows} rows stored, {expected} admitted")
    A.check(violations, int(queued or 0) != expected, f"{queued} of {expected} rows queued")
    A.check(violations, facts != 0, f"{facts} facts written by admission (must be 0)")
    return A.base_result(
        "taskward",
        args,
        backend=store.backend,
        seconds=single_s,
        per_s=args.jobs / single_s,
        sync_per_s=args.jobs / sync_s,
        bulk_per_s=args.jobs / bulk_s,
        bulk_chunk=BULK_CHUNK,
        check={"expected": expected, "rows": int(rows), "queued": int(queued or 0)},
        violations=violations,
    )


def prefill(store: Store, count: int) -> None:
    reg = registry()

    async def run() -> None:
        async with taskward.open_db(store.url) as db:
            apps = [application(f"drain-{i}") for i in range(count)]
            for offset in range(0, count, BULK_CHUNK):
                await taskward.submit_tasks(db, apps[offset : offset + BULK_CHUNK], registry=reg)

    asyncio.run(run())


def drain(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    concurrency = args.concurrency or DEFAULT_CONCURRENCY
    prefill(store, args.jobs)
    violations: list[str] = []
    argv = worker_argv(store, concurrency, burst=True, processes=args.processes)
    worker = A.Worker(argv, args.workdir, env=worker_env())
    with raw_connection(store) as conn:
        worker.start()
        try:
            seen = A.wait_until(
                lambda: completed(conn) >= args.jobs,
                what="the drain",
                timeout_s=args.timeout_s,
                worker=worker,
            )
            exit_code = worker.wait(60.0)  # --burst exits once nothing claimable is left
            if exit_code is None:
                exit_code = worker.stop()
        finally:
            worker.stop()
        done = completed(conn)
        first, last = raw_rows(
            conn,
            "SELECT (SELECT min(created_at) FROM status_transitions WHERE status = 'running'),"
            " (SELECT max(created_at) FROM status_transitions WHERE previous_status = 'running')",
        )[0]
    A.check(violations, exit_code != 0, f"worker exited with {exit_code}: {worker.log_tail(500)}")
    worker.remove_log()
    span = float(last) - float(first) if first is not None and last is not None else None
    result = A.base_result(
        "taskward",
        args,
        backend=store.backend,
        concurrency=concurrency,
        processes=args.processes,
        startup_s=float(first) - worker.spawned_wall if first is not None else None,
        violations=violations,
        **A.drain_fields(args.jobs, done, seen - worker.spawned_mono, span),
    )
    result.update(audit_fields(store, args.jobs, violations))
    return result


def pickup(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    concurrency = args.concurrency or DEFAULT_CONCURRENCY
    reg = registry()
    submitted: dict[str, float] = {}
    violations: list[str] = []
    worker = A.Worker(worker_argv(store, concurrency, burst=False), args.workdir, env=worker_env())

    async def submit_all(conn: Any) -> None:
        async with taskward.open_db(store.url) as db:
            pace = A.Paced(args.interval_ms / 1000.0)
            for i in range(args.warmup):
                await pace.asleep(i)
                await taskward.submit_task(db, application(f"warm-{i}"), registry=reg)
            deadline = time.monotonic() + 120
            while completed(conn) < args.warmup:  # the worker is up and taking work
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker not taking work: {worker.log_tail()}")
                await asyncio.sleep(A.POLL_S)
            await asyncio.sleep(0.2)
            pace = A.Paced(args.interval_ms / 1000.0)
            for i in range(args.jobs):
                await pace.asleep(i)
                before = time.time()
                task_id = await taskward.submit_task(db, application(f"pick-{i}"), registry=reg)
                submitted[task_id] = before

    total = args.warmup + args.jobs
    with raw_connection(store) as conn:
        worker.start()
        try:
            asyncio.run(submit_all(conn))
            A.wait_until(
                lambda: completed(conn) >= total, what="the pickups", timeout_s=120, worker=worker
            )
        finally:
            exit_code = worker.stop(signal.SIGTERM)
        taken = dict(
            raw_rows(
                conn,
                "SELECT entity_id, created_at FROM status_transitions WHERE status = 'running'",
            )
        )
    A.check(violations, exit_code != 0, f"worker exited with {exit_code}: {worker.log_tail(500)}")
    worker.remove_log()
    latencies = [
        (float(taken[t]) - before) * 1000.0 for t, before in submitted.items() if t in taken
    ]
    A.check(violations, len(latencies) != args.jobs, f"{args.jobs - len(latencies)} not taken")
    result = A.base_result(
        "taskward",
        args,
        backend=store.backend,
        concurrency=concurrency,
        taken_at="the running fact's created_at (claim time; the store's clock)",
        violations=violations,
        **A.latency_fields(latencies),
    )
    result.update(audit_fields(store, total, violations))
    return result


def main(args: argparse.Namespace) -> dict[str, Any]:
    store, migrate_url = make_store(args)
    asyncio.run(migrate(migrate_url))
    return {"enqueue": enqueue, "drain": drain, "pickup": pickup}[args.workload](args, store)


if __name__ == "__main__":
    sys.exit(A.run_main(main, __doc__.splitlines()[0]))
