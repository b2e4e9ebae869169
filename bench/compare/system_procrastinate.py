"""Procrastinate (PostgreSQL) for ``bench/compare``; runs in its own virtual environment.

One async task ``noop`` that returns at once, on ``procrastinate.App(connector=
PsycopgConnector(conninfo=URL))`` with the library's defaults (its pool, LISTEN/NOTIFY on, jobs
kept after completion: ``delete_jobs="never"``). Enqueue is ``await noop.defer_async()`` per job;
the untimed prefill uses ``batch_defer_async``. The worker process is
``app.run_worker_async(concurrency=C, wait=False)`` (it exits once caught up) for the drain and
``wait=True`` for pickup. Per job Procrastinate writes its ``procrastinate_jobs`` row (todo ->
doing -> succeeded) and, by triggers, one ``procrastinate_events`` row per change (deferred,
started, succeeded): a history, but no lease fencing of the final write and no per-attempt
summary. The check: every job ``succeeded`` with exactly one ``started`` and one ``succeeded``
event. Pickup time is the ``started`` event's ``at`` (server clock, set when the job is fetched).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _adapter as A
import procrastinate
import psycopg

DEFAULT_CONCURRENCY = 10
CHUNK = 1000


def make_app(args: argparse.Namespace) -> tuple[procrastinate.App, Any]:
    dsn = A.pg_url_with_schema(args.pg_url, args.schema)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop() -> None:
        return None

    return app, noop


def raw(args: argparse.Namespace) -> psycopg.Connection:
    return psycopg.connect(A.pg_url_with_schema(args.pg_url, args.schema), autocommit=True)


def value(conn: psycopg.Connection, sql: str) -> Any:
    row = conn.execute(sql).fetchone()
    return row[0] if row else None


def succeeded(conn: psycopg.Connection) -> int:
    return int(value(conn, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"))


def verify(conn: psycopg.Connection, expected: int, state: str) -> tuple[dict[str, Any], list[str]]:
    jobs, in_state = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE status = %s) FROM procrastinate_jobs", (state,)
    ).fetchone()  # type: ignore[misc]
    events = dict(conn.execute("SELECT type::text, count(*) FROM procrastinate_events GROUP BY 1"))
    violations: list[str] = []
    A.check(violations, jobs != expected, f"{jobs} jobs stored, {expected} deferred")
    A.check(violations, in_state != expected, f"{in_state} of {expected} jobs {state}")
    if state == "succeeded":
        bad = value(
            conn,
            "SELECT count(*) FROM procrastinate_jobs j WHERE "
            "(SELECT count(*) FROM procrastinate_events e WHERE e.job_id = j.id "
            "AND e.type = 'started') <> 1 OR (SELECT count(*) FROM procrastinate_events e "
            "WHERE e.job_id = j.id AND e.type = 'succeeded') <> 1",
        )
        A.check(violations, bad, f"{bad} jobs without exactly one started and one succeeded event")
    n = max(1, int(jobs))
    return (
        {
            "check": {
                "expected": expected,
                "jobs": int(jobs),
                state: int(in_state),
                "events": events,
            },
            "rows_per_job": {"jobs": 1.0, "events": sum(events.values()) / n},
        },
        violations,
    )


async def install(app: procrastinate.App) -> None:
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


def enqueue(args: argparse.Namespace) -> dict[str, Any]:
    app, noop = make_app(args)

    async def run() -> float:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            for _ in range(args.warmup):
                await noop.defer_async()
            began = time.perf_counter()
            for _ in range(args.jobs):
                await noop.defer_async()
            return time.perf_counter() - began

    seconds = asyncio.run(run())
    with raw(args) as conn:
        fields, violations = verify(conn, args.warmup + args.jobs, "todo")
    return A.base_result(
        "procrastinate",
        args,
        backend="postgres",
        seconds=seconds,
        per_s=args.jobs / seconds,
        violations=violations,
        **fields,
    )


def drain(args: argparse.Namespace) -> dict[str, Any]:
    app, noop = make_app(args)

    async def fill() -> None:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            for offset in range(0, args.jobs, CHUNK):
                await noop.batch_defer_async(*([{}] * min(CHUNK, args.jobs - offset)))

    asyncio.run(fill())
    worker = A.Worker(A.self_argv(args, mode="burst"), args.workdir)
    with raw(args) as conn:
        worker.start()
        try:
            seen = A.wait_until(
                lambda: succeeded(conn) >= args.jobs,
                what="the drain",
                timeout_s=args.timeout_s,
                worker=worker,
            )
            exit_code = worker.wait(60.0)  # wait=False: exits once caught up
        finally:
            worker.stop()
        span = value(
            conn,
            "SELECT extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')"
            " - min(at) FILTER (WHERE type = 'started')) FROM procrastinate_events",
        )
        fields, violations = verify(conn, args.jobs, "succeeded")
        done = succeeded(conn)
    A.check(violations, exit_code != 0, f"worker exited with {exit_code}: {worker.log_tail(500)}")
    worker.remove_log()
    return A.base_result(
        "procrastinate",
        args,
        backend="postgres",
        concurrency=args.concurrency or DEFAULT_CONCURRENCY,
        violations=violations,
        **A.drain_fields(
            args.jobs, done, seen - worker.spawned_mono, float(span) if span else None
        ),
        **fields,
    )


def pickup(args: argparse.Namespace) -> dict[str, Any]:
    app, noop = make_app(args)
    asyncio.run(install(app))
    worker = A.Worker(A.self_argv(args, mode="idle"), args.workdir)
    submitted: dict[int, float] = {}
    total = args.warmup + args.jobs

    async def submit_all(conn: psycopg.Connection) -> None:
        async with app.open_async():
            pace = A.Paced(args.interval_ms / 1000.0)
            for i in range(args.warmup):
                await pace.asleep(i)
                await noop.defer_async()
            deadline = time.monotonic() + 120
            while succeeded(conn) < args.warmup:
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker not taking work: {worker.log_tail()}")
                await asyncio.sleep(A.POLL_S)
            await asyncio.sleep(0.2)
            pace = A.Paced(args.interval_ms / 1000.0)
            for i in range(args.jobs):
                await pace.asleep(i)
                before = time.time()
                job_id = await noop.defer_async()
                submitted[job_id] = before

    with raw(args) as conn:
        worker.start()
        try:
            asyncio.run(submit_all(conn))
            A.wait_until(
                lambda: succeeded(conn) >= total, what="the pickups", timeout_s=120, worker=worker
            )
        finally:
            exit_code = worker.stop()
        taken = dict(
            conn.execute(
                "SELECT job_id, extract(epoch FROM at)::float8 FROM procrastinate_events "
                "WHERE type = 'started'"
            ).fetchall()
        )
        fields, violations = verify(conn, total, "succeeded")
    A.check(violations, exit_code != 0, f"worker exited with {exit_code}: {worker.log_tail(500)}")
    worker.remove_log()
    latencies = [
        (float(taken[j]) - before) * 1000.0 for j, before in submitted.items() if j in taken
    ]
    A.check(violations, len(latencies) != args.jobs, f"{args.jobs - len(latencies)} not started")
    return A.base_result(
        "procrastinate",
        args,
        backend="postgres",
        concurrency=args.concurrency or DEFAULT_CONCURRENCY,
        taken_at="the 'started' event's at (server clock, when the job is fetched)",
        violations=violations,
        **A.latency_fields(latencies),
        **fields,
    )


def worker(args: argparse.Namespace) -> None:
    app, _ = make_app(args)

    async def run() -> None:
        async with app.open_async():
            await app.run_worker_async(
                concurrency=args.concurrency or DEFAULT_CONCURRENCY, wait=args.mode == "idle"
            )

    asyncio.run(run())


def main(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.workload == "worker":
        worker(args)
        return None
    return {"enqueue": enqueue, "drain": drain, "pickup": pickup}[args.workload](args)


if __name__ == "__main__":
    sys.exit(A.run_main(main, __doc__.splitlines()[0]))
