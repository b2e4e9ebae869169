"""Shared plumbing for the benchmarks in ``bench/``: producer processes, stores, output.

Benchmarks are measurements, not tests: they print numbers and never assert on speed. What they
do check (row counts, distinct ids) is reported as violations.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import platform
import queue
import statistics
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

DEFAULT_PG_URL = os.environ.get(
    "TASKWARD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)

# A producer's body: ``target(job, start_gate)`` does its setup, calls ``start_gate()`` (which
# blocks until every producer of the measurement is ready), runs the timed loop and returns a
# dict holding at least ``start`` and ``end`` (time.monotonic(), which on Linux is the
# system-wide CLOCK_MONOTONIC, so values from different processes are comparable).
ProducerTarget = Callable[[Any, Callable[[], None]], dict[str, Any]]


def progress(message: str) -> None:
    """One progress line on stderr (stdout carries only the result)."""
    print(message, file=sys.stderr, flush=True)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: first column left-aligned, the rest right-aligned."""
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        out = [str(cells[0]).ljust(widths[0])]
        out += [str(cell).rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])


def machine_description() -> dict[str, Any]:
    import sqlite3

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
        "sqlite": sqlite3.sqlite_version,
        "psycopg": psycopg.__version__,
    }


# -- stores ----------------------------------------------------------------------------------


def with_query(url: str, **params: str) -> str:
    """Append ``key=value`` pairs (values already URL-safe) to a URL's query string."""
    if not params:
        return url
    sep = "&" if "?" in url else "?"
    return url + sep + "&".join(f"{key}={value}" for key, value in params.items())


def pg_schema_url(base_url: str, schema: str) -> str:
    """``base_url`` with every session's search_path set to ``schema`` (libpq ``options``)."""
    return with_query(base_url, options=quote(f"-csearch_path={schema}", safe=""))


class PgSchemas:
    """Creates throwaway PostgreSQL schemas and drops every one of them at the end."""

    def __init__(self, base_url: str, prefix: str = "bench") -> None:
        self.base_url = base_url
        self.prefix = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self._created: list[str] = []

    def create(self) -> str:
        schema = f"{self.prefix}_{len(self._created)}"
        with psycopg.connect(self.base_url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        self._created.append(schema)
        return schema

    def drop(self, schema: str) -> None:
        with psycopg.connect(self.base_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        if schema in self._created:
            self._created.remove(schema)

    def drop_all(self) -> None:
        for schema in list(self._created):
            self.drop(schema)

    def server_version(self) -> str:
        with psycopg.connect(self.base_url) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"


def remove_sqlite_file(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


# -- producer processes ----------------------------------------------------------------------


@dataclass(frozen=True)
class ProducerRun:
    """One measurement: every producer's result and the wall time of the timed section."""

    wall_s: float
    results: list[dict[str, Any]]


def _producer_main(
    target: ProducerTarget,
    job: Any,
    barrier: Any,
    results: Any,
    index: int,
    timeout_s: float,
) -> None:
    def start_gate() -> None:
        barrier.wait(timeout_s)

    try:
        outcome = target(job, start_gate)
    except BaseException:
        barrier.abort()  # release everyone instead of hanging the measurement
        results.put((index, None, traceback.format_exc()))
        return
    results.put((index, outcome, None))


def run_producers(
    target: ProducerTarget, jobs: Sequence[Any], *, timeout_s: float = 600.0
) -> ProducerRun:
    """Run ``target(job, start_gate)`` for each job in its own spawned OS process.

    Every process sets up (imports, connections, warm-up) before the gate; the timed section
    runs from the earliest post-gate ``start`` to the latest ``end`` across processes.

    Raises:
        RuntimeError: a producer failed (with its traceback) or did not finish in time.
    """
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(jobs) + 1)
    result_queue = ctx.Queue()
    processes = [
        ctx.Process(
            target=_producer_main,
            args=(target, job, barrier, result_queue, index, timeout_s),
            name=f"producer-{index}",
            daemon=True,
        )
        for index, job in enumerate(jobs)
    ]
    for process in processes:
        process.start()
    outcomes: dict[int, dict[str, Any]] = {}
    errors: list[str] = []
    try:
        # A broken barrier means a producer failed during setup; its traceback is queued.
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout_s)
        deadline = time.monotonic() + timeout_s
        while len(outcomes) + len(errors) < len(jobs):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                errors.append(f"{len(jobs) - len(outcomes) - len(errors)} producers timed out")
                break
            try:
                index, outcome, error = result_queue.get(timeout=min(remaining, 1.0))
            except queue.Empty:  # check whether a producer died silently
                dead = [p for p in processes if p.exitcode not in (None, 0)]
                if dead:
                    errors.append(f"{dead[0].name} exited with code {dead[0].exitcode}")
                    break
                continue
            if error is not None:
                errors.append(f"producer {index} failed:\n{error}")
            else:
                outcomes[index] = outcome
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()
                process.join()
    if errors:
        raise RuntimeError("\n".join(errors))
    ordered = [outcomes[i] for i in range(len(jobs))]
    wall_s = max(r["end"] for r in ordered) - min(r["start"] for r in ordered)
    return ProducerRun(wall_s=wall_s, results=ordered)


def split_count(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal shares (the first ones take the remainder)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]
