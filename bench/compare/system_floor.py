"""The raw-SQL floors for ``bench/compare``: taskward's own writes through the bare driver.

Same schema as taskward (the store is migrated by opening it with taskward), one connection,
no framework: stdlib ``sqlite3`` (WAL, ``synchronous=FULL``, ``foreign_keys=ON``, as ``SQLiteDB``
sets them) or synchronous psycopg (autocommit, one connection).

- ``enqueue``: one bare ``INSERT`` of the row ``submit_task`` writes (every column, values from
  taskward's own ``validate_application``), autocommit: one transaction per job.
- ``--driver async`` (PostgreSQL, enqueue only; ``floor-postgres-async``): the same ``INSERT``
  over psycopg's ``AsyncConnection`` on asyncio, the driver path an asynchronous caller of
  ``submit_task`` pays too: against it, taskward's admission shows its own cost apart from the
  driver's.
- Every id is one of taskward's own (``taskward.ids.new_id``, time-ordered version 7): random
  version-4 ids land each row on a random index page, and made the batched floor 1.9x slower
  than the writes taskward really makes (2026-12-02).
- ``drain``: ``bench/worker.py``'s floor, one job at a time in this process (no worker process,
  so no start-up): a claim transaction (guarded UPDATE of the oldest queued row to ``running``
  with the lease columns, its fact, its event) and a completion transaction (owner/expiry/attempt
  guarded UPDATE to ``completed``, its fact, its event, a complete summary). The store then passes
  the same audit check as taskward's. ``--batch N``: N jobs' claims share one transaction, then
  their completions another (the batched floor: a ceiling for any worker on this schema).

No pickup: a floor has no worker to be woken. No guarantee beyond the writes themselves.
Runs in taskward's own virtual environment.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
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
import psycopg  # noqa: E402
import system_taskward as T  # noqa: E402
from bench._common import Store, raw_connection, raw_rows  # noqa: E402
from bench.worker import floor_admit, floor_sql, run_floor  # noqa: E402

from taskward.admission import validate_application  # noqa: E402
from taskward.ids import new_id  # noqa: E402


def connect(store: Store) -> Any:
    if store.backend == "sqlite":
        conn = sqlite3.connect(store.raw, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL").fetchone()
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn
    return psycopg.connect(store.raw, autocommit=True)


def admit_params(admitted: Any, key: str) -> tuple[Any, ...]:
    """The floor's ``INSERT`` parameters for one row under ``key``, made at call time (a new
    id, the clock), the rest from taskward's own ``validate_application``."""
    now = time.time()
    return (
        new_id(),
        admitted.action_kind,
        admitted.args_json,
        now,
        now,
        now,
        "[]",
        key,
        admitted.application_hash,
    )


def enqueue(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    admitted = validate_application(T.application("template"), T.registry())
    insert = floor_sql(store.backend).admit
    if args.driver == "async":
        if store.backend != "postgres":
            raise ValueError("--driver async is the PostgreSQL floor's; SQLite has no driver path")
        seconds = asyncio.run(_enqueue_async(args, store, insert, admitted))
    else:
        seconds = _enqueue_sync(args, store, insert, admitted)
    expected = args.warmup + args.jobs
    violations: list[str] = []
    with raw_connection(store) as check:
        rows, queued = raw_rows(
            check,
            "SELECT count(*), sum(CASE WHEN status = 'queued' THEN 1 ELSE 0 END) "
            "FROM schedule_runs",
        )[0]
    A.check(violations, int(rows) != expected, f"{rows} rows stored, {expected} inserted")
    A.check(violations, int(queued or 0) != expected, f"{queued} of {expected} rows queued")
    return A.base_result(
        "floor",
        args,
        backend=store.backend,
        seconds=seconds,
        per_s=args.jobs / seconds,
        check={"expected": expected, "rows": int(rows), "queued": int(queued or 0)},
        violations=violations,
    )


def _enqueue_sync(args: argparse.Namespace, store: Store, insert: str, admitted: Any) -> float:
    """``enqueue``'s loop over the raw driver's synchronous connection (``connect``)."""
    conn = connect(store)
    try:
        for i in range(args.warmup):
            conn.execute(insert, admit_params(admitted, f"warm-{i}"))
        began = time.perf_counter()
        for i in range(args.jobs):
            conn.execute(insert, admit_params(admitted, f"single-{i}"))
        return time.perf_counter() - began
    finally:
        conn.close()


async def _enqueue_async(
    args: argparse.Namespace, store: Store, insert: str, admitted: Any
) -> float:
    """``enqueue``'s loop over psycopg's asynchronous connection (autocommit, one connection)."""
    conn = await psycopg.AsyncConnection.connect(store.raw, autocommit=True)
    try:
        for i in range(args.warmup):
            await conn.execute(insert, admit_params(admitted, f"warm-{i}"))
        began = time.perf_counter()
        for i in range(args.jobs):
            await conn.execute(insert, admit_params(admitted, f"single-{i}"))
        return time.perf_counter() - began
    finally:
        await conn.close()


def drain(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    floor_admit(store, args.jobs)
    per_tx = args.batch or 1
    seconds = run_floor(store, args.jobs, per_tx=per_tx)
    violations: list[str] = []
    result = A.base_result(
        "floor",
        args,
        backend=store.backend,
        concurrency=1,
        per_tx=per_tx,
        violations=violations,
        **A.drain_fields(args.jobs, args.jobs, seconds, seconds),
    )
    result.update(T.audit_fields(store, args.jobs, violations))
    return result


def main(args: argparse.Namespace) -> dict[str, Any]:
    if args.workload not in ("enqueue", "drain"):
        raise ValueError(f"the floor has no {args.workload!r} workload; allowed: enqueue, drain")
    store, migrate_url = T.make_store(args)
    asyncio.run(T.migrate(migrate_url))
    return {"enqueue": enqueue, "drain": drain}[args.workload](args, store)


if __name__ == "__main__":
    sys.exit(A.run_main(main, __doc__.splitlines()[0]))
