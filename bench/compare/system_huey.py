"""Huey (SQLite storage) for ``bench/compare``; runs in its own virtual environment.

``SqliteHuey(filename=PATH, fsync=True)``: WAL (Huey's default journal mode) with
``synchronous=FULL``, the durable setting taskward uses by default. One task ``noop`` (a function
that returns ``None``; Huey does not store ``None`` results by default). Enqueue is ``noop()``
per job (one ``INSERT`` into Huey's ``task`` table, autocommit). The worker process is Huey's own
consumer, ``huey.create_consumer(workers=W, worker_type="thread").run()`` with its defaults
(1 worker thread, polling from 0.1 s with backoff 1.15 up to 10 s, the periodic scheduler on).

What Huey does per job: the consumer DELETES the job's row in the same exclusive transaction
that dequeues it, before running it. A crash after the dequeue loses the job (at most once) and
nothing records that it ran (no history, no state). So the only durable effect to check is the
empty ``task`` table; completions are counted in the worker process by Huey's own signals
(``SIGNAL_EXECUTING`` / ``SIGNAL_COMPLETE`` / ``SIGNAL_ERROR``), written to a side file every
50 ms and at exit. Pickup time is ``SIGNAL_EXECUTING`` (``time.time()`` in the worker).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _adapter as A
from huey import SqliteHuey
from huey import signals as S

DEFAULT_WORKERS = 1  # Huey's consumer default


def make_huey(args: argparse.Namespace) -> tuple[SqliteHuey, Any]:
    huey = SqliteHuey("compare", filename=args.sqlite_path, fsync=True)

    @huey.task()
    def noop() -> None:
        return None

    return huey, noop


def stats_path(args: argparse.Namespace) -> Path:
    return Path(f"{args.sqlite_path}.worker-stats.json")


def read_stats(args: argparse.Namespace) -> dict[str, Any]:
    try:
        return json.loads(stats_path(args).read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return {"completed": 0, "errors": 0, "executing": {}}


def queued(args: argparse.Namespace) -> int:
    conn = sqlite3.connect(args.sqlite_path, timeout=30)
    try:
        return int(conn.execute("SELECT count(*) FROM task").fetchone()[0])
    finally:
        conn.close()


def enqueue(args: argparse.Namespace) -> dict[str, Any]:
    _, noop = make_huey(args)
    for _ in range(args.warmup):
        noop()
    began = time.perf_counter()
    for _ in range(args.jobs):
        noop()
    seconds = time.perf_counter() - began
    expected = args.warmup + args.jobs
    rows = queued(args)
    violations: list[str] = []
    A.check(violations, rows != expected, f"{rows} jobs stored, {expected} enqueued")
    return A.base_result(
        "huey",
        args,
        backend="sqlite",
        seconds=seconds,
        per_s=args.jobs / seconds,
        check={"expected": expected, "rows": rows},
        violations=violations,
    )


def finish(args: argparse.Namespace, worker: A.Worker, expected: int) -> tuple[dict, list[str]]:
    exit_code = worker.stop(signal.SIGINT)  # Huey's graceful signal
    stats = read_stats(args)
    left = queued(args)
    violations: list[str] = []
    A.check(violations, exit_code != 0, f"consumer exited with {exit_code}: {worker.log_tail(500)}")
    A.check(violations, left != 0, f"{left} jobs left in the queue")
    A.check(violations, stats["completed"] != expected, f"{stats['completed']} of {expected} ran")
    A.check(violations, stats["errors"], f"{stats['errors']} jobs failed")
    worker.remove_log()
    fields = {
        "check": {
            "expected": expected,
            "completed_signals": stats["completed"],
            "error_signals": stats["errors"],
            "left_in_queue": left,
        },
        "rows_per_job": {"jobs": 0.0, "history": 0.0},
    }
    return {**fields, "stats": stats}, violations


def drain(args: argparse.Namespace) -> dict[str, Any]:
    _, noop = make_huey(args)
    for _ in range(args.jobs):  # untimed; Huey has no bulk enqueue
        noop()
    worker = A.Worker(A.self_argv(args, mode="burst"), args.workdir)
    worker.start()
    try:
        seen = A.wait_until(
            lambda: read_stats(args)["completed"] >= args.jobs,
            what="the drain",
            timeout_s=args.timeout_s,
            worker=worker,
        )
    finally:
        fields, violations = finish(args, worker, args.jobs)
    stats = fields.pop("stats")
    span = (
        stats["last_complete"] - stats["first_executing"]
        if stats.get("first_executing") and stats.get("last_complete")
        else None
    )
    stats_path(args).unlink(missing_ok=True)
    return A.base_result(
        "huey",
        args,
        backend="sqlite",
        concurrency=args.concurrency or DEFAULT_WORKERS,
        violations=violations,
        **A.drain_fields(args.jobs, stats["completed"], seen - worker.spawned_mono, span),
        **fields,
    )


def pickup(args: argparse.Namespace) -> dict[str, Any]:
    _, noop = make_huey(args)
    worker = A.Worker(A.self_argv(args, mode="idle"), args.workdir)
    submitted: dict[str, float] = {}
    total = args.warmup + args.jobs
    worker.start()
    try:
        pace = A.Paced(args.interval_ms / 1000.0)
        for i in range(args.warmup):
            pace.sleep(i)
            noop()
        A.wait_until(
            lambda: read_stats(args)["completed"] >= args.warmup,
            what="the warm-up jobs",
            timeout_s=120,
            worker=worker,
        )
        time.sleep(0.2)
        pace = A.Paced(args.interval_ms / 1000.0)
        for i in range(args.jobs):
            pace.sleep(i)
            before = time.time()
            result = noop()
            submitted[result.id] = before
        A.wait_until(
            lambda: read_stats(args)["completed"] >= total,
            what="the pickups",
            timeout_s=120,
            worker=worker,
        )
    finally:
        fields, violations = finish(args, worker, total)
    stats = fields.pop("stats")
    stats_path(args).unlink(missing_ok=True)
    taken = stats["executing"]
    latencies = [(taken[t] - before) * 1000.0 for t, before in submitted.items() if t in taken]
    A.check(violations, len(latencies) != args.jobs, f"{args.jobs - len(latencies)} not executed")
    return A.base_result(
        "huey",
        args,
        backend="sqlite",
        concurrency=args.concurrency or DEFAULT_WORKERS,
        taken_at="SIGNAL_EXECUTING in the consumer (time.time(); nothing durable records it)",
        violations=violations,
        **A.latency_fields(latencies),
        **fields,
    )


def worker(args: argparse.Namespace) -> None:
    huey, _ = make_huey(args)
    keep_map = args.mode == "idle"  # per-job start times only for pickup (small)
    stats: dict[str, Any] = {
        "completed": 0,
        "errors": 0,
        "executing": {},
        "first_executing": None,
        "last_complete": None,
    }
    lock = threading.Lock()

    @huey.signal(S.SIGNAL_EXECUTING)
    def on_executing(signal_name: str, task: Any) -> None:
        now = time.time()
        if stats["first_executing"] is None:
            stats["first_executing"] = now
        if keep_map:
            stats["executing"][task.id] = now

    @huey.signal(S.SIGNAL_COMPLETE)
    def on_complete(signal_name: str, task: Any) -> None:
        stats["completed"] += 1
        stats["last_complete"] = time.time()

    @huey.signal(S.SIGNAL_ERROR)
    def on_error(signal_name: str, task: Any, exc: Any = None) -> None:
        stats["errors"] += 1

    path = stats_path(args)

    def dump() -> None:
        with lock:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({**stats, "executing": dict(stats["executing"])}))
            os.replace(tmp, path)

    stop = threading.Event()

    def writer() -> None:
        while not stop.wait(A.POLL_S):
            dump()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    consumer = huey.create_consumer(
        workers=args.concurrency or DEFAULT_WORKERS, worker_type="thread"
    )
    try:
        consumer.run()
    finally:
        stop.set()
        thread.join()
        dump()


def main(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.workload == "worker":
        worker(args)
        return None
    return {"enqueue": enqueue, "drain": drain, "pickup": pickup}[args.workload](args)


if __name__ == "__main__":
    sys.exit(A.run_main(main, __doc__.splitlines()[0]))
