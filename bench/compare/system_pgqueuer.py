"""PgQueuer (PostgreSQL) for ``bench/compare``; runs in its own virtual environment.

The schema is PgQueuer's own (``Queries.install()``, default durability: every table LOGGED)
in the measurement's schema (``search_path``), over asyncpg. Enqueue is
``await queries.enqueue("noop", None)`` per job (one statement: the job row plus its ``queued``
log row); the untimed prefill enqueues lists of 1,000. The worker process runs a
``QueueManager`` with one async entrypoint ``noop`` the way ``pgq run`` does
(``pgqueuer.run(factory, batch_size=B, mode=...)`` under uvloop): ``--batch`` is its dequeue batch
(default 10, PgQueuer's own default), no cap on concurrent tasks (PgQueuer's default);
``mode=drain`` (exit when the queue is empty) for the drain, ``continuous`` for pickup.

What PgQueuer does per job: the dequeue marks a batch ``picked`` and logs a ``picked`` row; on
completion the job row is DELETED and a ``successful`` row is inserted into ``pgqueuer_log``, in
buffered batches (up to ``batch_size`` completions share one statement; a crash before the flush
re-runs those jobs after the heartbeat timeout: at least once). The log keeps queued, picked and
successful rows: a history of sorts, without lease fencing of the final write. The check: the
queue table empty and exactly one ``successful`` log row per job. Pickup time is the ``picked``
log row's ``created`` (server clock, the dequeue statement's ``now()``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _adapter as A
import asyncpg
import pgqueuer
from pgqueuer import AsyncpgDriver, Queries, QueueManager
from pgqueuer.types import QueueExecutionMode

DEFAULT_BATCH = 10  # PgQueuer's default batch size
CHUNK = 1000


async def connect(args: argparse.Namespace) -> asyncpg.Connection:
    return await asyncpg.connect(args.pg_url, server_settings={"search_path": args.schema})


async def count(conn: asyncpg.Connection, sql: str) -> int:
    return int(await conn.fetchval(sql))


async def successful(conn: asyncpg.Connection) -> int:
    return await count(conn, "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")


async def wait_async(done: Any, *, what: str, timeout_s: float, worker: A.Worker) -> float:
    deadline = time.monotonic() + timeout_s
    while True:
        if await done():
            return time.monotonic()
        if worker.poll() is not None and not await done():
            raise RuntimeError(
                f"worker exited with {worker.poll()} before {what}:\n{worker.log_tail()}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(A.POLL_S)


async def verify(conn: asyncpg.Connection, expected: int, done: bool) -> tuple[dict, list[str]]:
    in_queue = await count(conn, "SELECT count(*) FROM pgqueuer")
    log = {
        r["status"]: int(r["n"])
        for r in await conn.fetch(
            "SELECT status::text AS status, count(*) AS n FROM pgqueuer_log GROUP BY 1"
        )
    }
    violations: list[str] = []
    if done:
        bad = await count(
            conn,
            "SELECT count(*) FROM (SELECT job_id FROM pgqueuer_log GROUP BY job_id HAVING "
            "count(*) FILTER (WHERE status = 'successful') <> 1) AS b",
        )
        A.check(violations, in_queue != 0, f"{in_queue} jobs left in the queue table")
        A.check(
            violations,
            log.get("successful", 0) != expected,
            f"{log.get('successful', 0)} of {expected} jobs logged successful",
        )
        A.check(violations, bad, f"{bad} jobs without exactly one successful log row")
    else:
        A.check(violations, in_queue != expected, f"{in_queue} jobs stored, {expected} enqueued")
    fields = {
        "check": {"expected": expected, "in_queue_table": in_queue, "log": log},
        "rows_per_job": {
            "jobs": in_queue / max(1, expected),
            "log": sum(log.values()) / max(1, expected),
        },
    }
    return fields, violations


def enqueue(args: argparse.Namespace) -> dict[str, Any]:
    async def run() -> tuple[float, dict, list[str]]:
        conn = await connect(args)
        try:
            queries = Queries(AsyncpgDriver(conn))
            await queries.install()
            for _ in range(args.warmup):
                await queries.enqueue("noop", None)
            began = time.perf_counter()
            for _ in range(args.jobs):
                await queries.enqueue("noop", None)
            seconds = time.perf_counter() - began
            fields, violations = await verify(conn, args.warmup + args.jobs, done=False)
            return seconds, fields, violations
        finally:
            await conn.close()

    seconds, fields, violations = asyncio.run(run())
    return A.base_result(
        "pgqueuer",
        args,
        backend="postgres",
        seconds=seconds,
        per_s=args.jobs / seconds,
        violations=violations,
        **fields,
    )


def drain(args: argparse.Namespace) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        conn = await connect(args)
        worker = A.Worker(A.self_argv(args, mode="burst"), args.workdir)
        try:
            queries = Queries(AsyncpgDriver(conn))
            await queries.install()
            for offset in range(0, args.jobs, CHUNK):
                n = min(CHUNK, args.jobs - offset)
                await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
            worker.start()
            try:
                seen = await wait_async(
                    lambda: _reached(conn, args.jobs),
                    what="the drain",
                    timeout_s=args.timeout_s,
                    worker=worker,
                )
                exit_code = worker.wait(60.0)  # mode=drain exits once the queue is empty
            finally:
                worker.stop()
            span = await conn.fetchval(
                "SELECT extract(epoch FROM max(created) FILTER (WHERE status = 'successful')"
                " - min(created) FILTER (WHERE status = 'picked'))::float8 FROM pgqueuer_log"
            )
            done = await successful(conn)
            fields, violations = await verify(conn, args.jobs, done=True)
        finally:
            await conn.close()
        A.check(
            violations, exit_code != 0, f"worker exited with {exit_code}: {worker.log_tail(500)}"
        )
        worker.remove_log()
        return A.base_result(
            "pgqueuer",
            args,
            backend="postgres",
            batch=args.batch or DEFAULT_BATCH,
            concurrency="unlimited (max_concurrent_tasks=None)",
            violations=violations,
            **A.drain_fields(args.jobs, done, seen - worker.spawned_mono, span),
            **fields,
        )

    return asyncio.run(run())


async def _reached(conn: asyncpg.Connection, n: int) -> bool:
    return await successful(conn) >= n


def pickup(args: argparse.Namespace) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        conn = await connect(args)
        worker = A.Worker(A.self_argv(args, mode="idle"), args.workdir)
        submitted: dict[int, float] = {}
        total = args.warmup + args.jobs
        try:
            queries = Queries(AsyncpgDriver(conn))
            await queries.install()
            worker.start()
            try:
                pace = A.Paced(args.interval_ms / 1000.0)
                for i in range(args.warmup):
                    await pace.asleep(i)
                    await queries.enqueue("noop", None)
                await wait_async(
                    lambda: _reached(conn, args.warmup),
                    what="the warm-up jobs",
                    timeout_s=120,
                    worker=worker,
                )
                await asyncio.sleep(0.2)
                pace = A.Paced(args.interval_ms / 1000.0)
                for i in range(args.jobs):
                    await pace.asleep(i)
                    before = time.time()
                    (job_id,) = await queries.enqueue("noop", None)
                    submitted[int(job_id)] = before
                await wait_async(
                    lambda: _reached(conn, total), what="the pickups", timeout_s=120, worker=worker
                )
            finally:
                exit_code = worker.stop()
            taken = {
                int(r["job_id"]): float(r["at"])
                for r in await conn.fetch(
                    "SELECT job_id, extract(epoch FROM created)::float8 AS at FROM pgqueuer_log "
                    "WHERE status = 'picked'"
                )
            }
            fields, violations = await verify(conn, total, done=True)
        finally:
            await conn.close()
        A.check(
            violations, exit_code != 0, f"worker exited with {exit_code}: {worker.log_tail(500)}"
        )
        worker.remove_log()
        latencies = [(taken[j] - before) * 1000.0 for j, before in submitted.items() if j in taken]
        A.check(violations, len(latencies) != args.jobs, f"{args.jobs - len(latencies)} not picked")
        return A.base_result(
            "pgqueuer",
            args,
            backend="postgres",
            batch=args.batch or DEFAULT_BATCH,
            taken_at="the 'picked' log row's created (server clock, the dequeue's now())",
            violations=violations,
            **A.latency_fields(latencies),
            **fields,
        )

    return asyncio.run(run())


def worker(args: argparse.Namespace) -> None:
    import uvloop

    @contextlib.asynccontextmanager
    async def factory() -> AsyncIterator[QueueManager]:
        conn = await connect(args)
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint("noop")
        async def noop(job: Any) -> None:
            return None

        try:
            yield qm
        finally:
            await conn.close()

    mode = QueueExecutionMode.drain if args.mode == "burst" else QueueExecutionMode.continuous
    uvloop.run(
        pgqueuer.run(
            factory,
            batch_size=args.batch or DEFAULT_BATCH,
            mode=mode,
            dequeue_timeout=timedelta(seconds=30),
        )
    )


def main(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.workload == "worker":
        worker(args)
        return None
    return {"enqueue": enqueue, "drain": drain, "pickup": pickup}[args.workload](args)


if __name__ == "__main__":
    sys.exit(A.run_main(main, __doc__.splitlines()[0]))
