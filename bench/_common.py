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
import re
import statistics
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
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


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between closest ranks."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# -- stores for worker benchmarks -------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parent.parent
TASKS_MODULE = "bench.tasks"  # the @taskward.task functions every benchmark worker imports


def ensure_repo_on_path() -> None:
    """Make ``bench.tasks`` importable in this process (the workers get ``PYTHONPATH``)."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))


@dataclass(frozen=True)
class Store:
    """One throwaway, migrated store: the taskward URL, the raw target and what to remove."""

    backend: str  # "sqlite" or "postgres"
    url: str  # a taskward URL (migrate=false: the schema already exists)
    raw: str  # a SQLite file path or a libpq URL whose search_path is the schema
    handle: str  # the SQLite path or the schema name


class Stores:
    """Fresh stores created by opening a taskward store at a new URL, so the migrations build
    the tables and indexes every side of a measurement sees; all removed by ``close()``."""

    def __init__(self, pg_url: str, sqlite_dir: Path | None, prefix: str) -> None:
        import tempfile

        self.pg_url = pg_url
        self.prefix = prefix
        self._tmp = Path(tempfile.mkdtemp(prefix=f"taskward-{prefix}-", dir=sqlite_dir))
        self._schemas = PgSchemas(pg_url, prefix=f"bench_{prefix}")
        self._n = 0

    def create(self, backend: str) -> Store:
        import asyncio

        import taskward

        async def migrate(url: str) -> None:
            async with taskward.open_db(url):
                pass

        self._n += 1
        if backend == "sqlite":
            path = self._tmp / f"{self.prefix}-{self._n}.db"
            url = f"sqlite:///{path}"
            asyncio.run(migrate(url))
            return Store(backend, with_query(url, migrate="false"), str(path), str(path))
        schema = self._schemas.create()
        url = pg_schema_url(self.pg_url, schema)
        asyncio.run(migrate(url))
        return Store(backend, with_query(url, migrate="false"), url, schema)

    def remove(self, store: Store) -> None:
        if store.backend == "sqlite":
            remove_sqlite_file(Path(store.handle))
        else:
            self._schemas.drop(store.handle)

    def pg_version(self) -> str:
        return self._schemas.server_version()

    @property
    def directory(self) -> Path:
        return self._tmp

    def close(self) -> None:
        import shutil

        try:
            self._schemas.drop_all()
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)


@contextlib.contextmanager
def raw_connection(store: Store) -> Any:
    """A raw autocommit connection (stdlib sqlite3 / sync psycopg) for reads and floors."""
    import sqlite3

    if store.backend == "sqlite":
        conn = sqlite3.connect(store.raw, isolation_level=None, timeout=30)
        try:
            yield conn
        finally:
            conn.close()
    else:
        with psycopg.connect(store.raw, autocommit=True) as conn:
            yield conn


def raw_rows(conn: Any, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run ``sql`` (``?`` placeholders, translated for psycopg) and return every row."""
    if isinstance(conn, psycopg.Connection):
        sql = sql.replace("?", "%s")
    return list(conn.execute(sql, tuple(params)).fetchall())


def raw_value(conn: Any, sql: str, params: Sequence[Any] = ()) -> Any:
    rows = raw_rows(conn, sql, params)
    return rows[0][0] if rows else None


# -- admission (untimed) ----------------------------------------------------------------------


def admit_tasks(
    store: Store, kind: str, args: dict[str, Any], count: int, *, key_prefix: str
) -> list[str]:
    """Admit ``count`` tasks through ``taskward.submit_task`` (several at once on PostgreSQL,
    whose pool serves them in parallel; one after another on SQLite, which has one writer)."""
    import asyncio

    import taskward

    ensure_repo_on_path()
    registry = taskward.build_registry(taskward.AdapterConfig(imports=(TASKS_MODULE,)))
    lanes = 8 if store.backend == "postgres" else 1

    async def run() -> list[str]:
        async with taskward.open_db(store.url) as db:

            async def lane(indexes: range) -> list[str]:
                out = []
                for i in indexes:
                    app = taskward.TaskApplication(
                        action_kind=kind,
                        args=args,
                        execution_target="host",
                        idempotency_key=f"{key_prefix}-{i}",
                    )
                    out.append(await taskward.submit_task(db, app, registry=registry))
                return out

            parts = await asyncio.gather(*(lane(range(j, count, lanes)) for j in range(lanes)))
        return [task_id for part in parts for task_id in part]

    return asyncio.run(run())


# -- taskward worker processes ----------------------------------------------------------------

_REPORTED = re.compile(
    r"stopped \((?P<reason>[^)]*)\) after (?P<seconds>[0-9.]+)s: claimed (?P<claimed>\d+), "
    r"completed (?P<completed>\d+), failed (?P<failed>\d+)"
)


def read_rss_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak) of ``pid`` from /proc, in MiB."""
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(value.split()[0]) / 1024.0
    return out


class WorkerProcess:
    """One ``taskward worker`` OS process over a store, importing ``bench.tasks`` (by default).

    stdout is discarded and stderr goes to a file (read after exit: the worker's own summary
    line). ``stop()`` sends SIGTERM (drain), then SIGKILL if it does not exit in time.
    """

    def __init__(
        self,
        store: Store,
        *,
        concurrency: int,
        burst: bool,
        log_dir: Path,
        extra_args: Sequence[str] = (),
        cwd: Path = REPO_ROOT,
        env: Mapping[str, str] | None = None,
        tasks_module: str = TASKS_MODULE,
    ) -> None:
        self.store = store
        self.concurrency = concurrency
        self.burst = burst
        self.extra_args = list(extra_args)
        self.cwd = cwd  # where a relative sqlite:/// path is resolved
        self.env = dict(env or {})  # set in the worker's environment, over this process's
        self.tasks_module = tasks_module  # on the repository root (PYTHONPATH), --import'ed
        self.log_path = log_dir / f"worker-{uuid.uuid4().hex[:8]}.log"
        self.process: Any = None
        self.spawned_at = 0.0  # time.time() just before the spawn
        self.spawned_mono = 0.0

    def command(self) -> list[str]:
        script = Path(sys.executable).with_name("taskward")
        head = [str(script)] if script.exists() else [sys.executable, "-m", "taskward.cli.main"]
        argv = [*head, "--db", self.store.url, "--import", self.tasks_module, "worker", "--quiet"]
        argv += ["--concurrency", str(self.concurrency)]
        if self.burst:
            argv.append("--burst")
        return argv + self.extra_args

    def start(self) -> None:
        import subprocess

        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        env.pop("TASKWARD_DATABASE_URL", None)
        env.update(self.env)
        argv = self.command()
        log = open(self.log_path, "wb")  # noqa: SIM115 - closed when the process is reaped
        self.spawned_at = time.time()
        self.spawned_mono = time.monotonic()
        self.process = subprocess.Popen(
            argv, cwd=self.cwd, env=env, stdout=subprocess.DEVNULL, stderr=log
        )
        log.close()  # the child holds its own descriptor

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    def poll(self) -> int | None:
        return self.process.poll()  # type: ignore[no-any-return]

    def wait(self, timeout_s: float) -> int | None:
        import subprocess

        try:
            return self.process.wait(timeout=timeout_s)  # type: ignore[no-any-return]
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (the worker drains and exits 0), then SIGKILL after ``timeout_s``."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.terminate()
        code = self.wait(timeout_s)
        if code is None:
            self.process.kill()
            code = self.wait(10.0)
        return code

    def stderr_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def reported(self) -> dict[str, Any] | None:
        """The worker's own summary line: stop reason, seconds, claimed/completed/failed."""
        match = _REPORTED.search(self.stderr_text())
        if match is None:
            return None
        return {
            "reason": match["reason"],
            "seconds": float(match["seconds"]),
            "claimed": int(match["claimed"]),
            "completed": int(match["completed"]),
            "failed": int(match["failed"]),
        }

    def __enter__(self) -> WorkerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        with contextlib.suppress(OSError):
            self.log_path.unlink()


def wait_for_heartbeat(conn: Any, worker: WorkerProcess, timeout_s: float = 30.0) -> float:
    """Block until the worker's heartbeat row exists; returns seconds since its spawn."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if raw_value(conn, "SELECT count(*) FROM workers WHERE pid = ?", (worker.pid,)):
            return time.monotonic() - worker.spawned_mono
        if worker.poll() is not None:
            raise RuntimeError(f"worker exited with {worker.poll()}:\n{worker.stderr_text()}")
        time.sleep(0.01)
    raise RuntimeError(f"no heartbeat from the worker after {timeout_s}s")


def wait_for_completed(
    conn: Any,
    count: int,
    *,
    worker: WorkerProcess | None = None,
    poll_s: float = 0.05,
    timeout_s: float = 1800.0,
) -> tuple[int, float]:
    """Poll the count of ``completed`` rows every ``poll_s`` until it reaches ``count``.

    Returns ``(completed, time.monotonic() when it was seen)``; stops early if the worker
    exits or ``timeout_s`` passes (the caller reports the shortfall as a violation).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        done = int(raw_value(conn, "SELECT count(*) FROM schedule_runs WHERE status = 'completed'"))
        seen = time.monotonic()
        if done >= count or seen >= deadline:
            return done, seen
        if worker is not None and worker.poll() is not None:
            done = int(
                raw_value(conn, "SELECT count(*) FROM schedule_runs WHERE status = 'completed'")
            )
            return done, time.monotonic()
        time.sleep(poll_s)


@dataclass
class Drain:
    """One burst worker draining ``count`` admitted tasks."""

    count: int
    concurrency: int
    completed: int
    wall_s: float  # worker spawn -> all rows seen completed (50 ms polls)
    span_s: float  # first claim fact -> last completion fact (store clock)
    startup_s: float  # worker spawn -> first claim fact
    reported_s: float | None  # the worker's own "after X s" (includes its idle exit check)
    exit_code: int | None
    worker_stats: dict[str, Any] | None

    @property
    def per_s(self) -> float:
        return self.completed / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def span_per_s(self) -> float:
        return self.completed / self.span_s if self.span_s > 0 else 0.0


def drain_with_worker(
    store: Store, count: int, concurrency: int, log_dir: Path, *, timeout_s: float = 1800.0
) -> Drain:
    """Start one ``taskward worker --burst --quiet --concurrency C`` and time it draining the
    store: from just before the spawn until every row is seen ``completed``."""
    with raw_connection(store) as conn:
        worker = WorkerProcess(store, concurrency=concurrency, burst=True, log_dir=log_dir)
        with worker:
            completed, seen = wait_for_completed(conn, count, worker=worker, timeout_s=timeout_s)
            wall_s = seen - worker.spawned_mono
            exit_code = worker.wait(60.0)  # burst mode exits once the queue is empty
            stats = worker.reported()
            if exit_code is None:
                exit_code = worker.stop()
        first_claim, last_end = raw_rows(
            conn,
            "SELECT (SELECT min(created_at) FROM status_transitions WHERE status = 'running'),"
            " (SELECT max(created_at) FROM status_transitions WHERE previous_status = 'running')",
        )[0]
    span_s = float(last_end) - float(first_claim) if first_claim is not None else 0.0
    startup_s = float(first_claim) - worker.spawned_at if first_claim is not None else 0.0
    return Drain(
        count=count,
        concurrency=concurrency,
        completed=completed,
        wall_s=wall_s,
        span_s=span_s,
        startup_s=startup_s,
        reported_s=stats["seconds"] if stats else None,
        exit_code=exit_code,
        worker_stats=stats,
    )


# -- audit check ------------------------------------------------------------------------------

# Column lists of the rows a raw-SQL floor or a bulk loader writes (bench/worker.py,
# bench/depth.py), in the order of their VALUES.
ADMIT_COLUMNS = (
    "id, schedule_id, invocation_id, trigger_context, action_kind, action_args, status, "
    "chain_depth, fired_at, created_at, queued_at, concurrency_key, required_capabilities, "
    "execution_target, library_ref, library_content_hash, idempotency_key, application_hash, "
    "admission_source"
)
FACT_COLUMNS = (
    "id, entity_type, entity_id, previous_status, status, reason_code, reason_summary, "
    "evidence_refs, source, actor, created_at, metadata, idempotency_key, request_hash, "
    "event_id, lease_id"
)
EVENT_COLUMNS = "id, task_id, kind, transition_id, status, payload, created_at"
SUMMARY_COLUMNS = (
    "session_key, task_id, attempt, state, summary, summary_hash, reason, created_at, updated_at"
)


def report_violations(violations: Sequence[str]) -> int:
    """Print the violations found (there must be none); the exit status they call for."""
    print(f"violations: {len(violations)}")
    for v in violations:
        print(f"  {v}")
    return 1 if violations else 0


# The rows a completed task must have: its facts (f), events (e) and summary (s), per run. Shared
# by audit_store below and bench/depth.py's audit of a store holding queued, running and
# completed runs.
AUDIT_CTES = """
WITH f AS (
  SELECT entity_id, count(*) AS n,
         sum(CASE WHEN previous_status = 'queued' AND status = 'running' THEN 1 ELSE 0 END)
           AS claims,
         sum(CASE WHEN previous_status = 'running' AND status = 'completed' THEN 1 ELSE 0 END)
           AS completions
  FROM status_transitions GROUP BY entity_id),
e AS (
  SELECT task_id, count(*) AS n,
         sum(CASE WHEN kind = 'transition' THEN 1 ELSE 0 END) AS transitions
  FROM task_events GROUP BY task_id),
s AS (
  SELECT task_id, count(*) AS n,
         sum(CASE WHEN state = 'complete' AND summary IS NOT NULL AND summary_hash IS NOT NULL
                  THEN 1 ELSE 0 END) AS complete
  FROM task_summaries GROUP BY task_id)"""

_AUDIT_SQL = (
    AUDIT_CTES
    + """
SELECT
  count(*),
  sum(CASE WHEN r.status <> 'completed' THEN 1 ELSE 0 END),
  sum(CASE WHEN coalesce(f.n, 0) <> 2 OR coalesce(f.claims, 0) <> 1
             OR coalesce(f.completions, 0) <> 1 THEN 1 ELSE 0 END),
  sum(CASE WHEN coalesce(e.n, 0) <> 2 OR coalesce(e.transitions, 0) <> 2 THEN 1 ELSE 0 END),
  sum(CASE WHEN coalesce(s.n, 0) <> 1 OR coalesce(s.complete, 0) <> 1 THEN 1 ELSE 0 END)
FROM schedule_runs r
LEFT JOIN f ON f.entity_id = r.id
LEFT JOIN e ON e.task_id = r.id
LEFT JOIN s ON s.task_id = r.id
"""
)

_AUDIT_LINKS_SQL = """
SELECT
  (SELECT count(*) FROM status_transitions),
  (SELECT count(*) FROM task_events),
  (SELECT count(*) FROM task_summaries),
  (SELECT count(*) FROM task_events e WHERE e.kind = 'transition' AND NOT EXISTS (
     SELECT 1 FROM status_transitions t WHERE t.id = e.transition_id AND t.entity_id = e.task_id
       AND t.status = e.status AND t.event_id = e.id)),
  (SELECT count(*) FROM task_summaries s JOIN schedule_runs r ON r.id = s.task_id
     WHERE s.session_key <> r.id || ':' || CAST(r.lease_attempts AS TEXT)),
  (SELECT count(*) FROM status_transitions WHERE entity_id NOT IN (SELECT id FROM schedule_runs))
  + (SELECT count(*) FROM task_events WHERE task_id NOT IN (SELECT id FROM schedule_runs))
  + (SELECT count(*) FROM task_summaries
       WHERE task_id IS NULL OR task_id NOT IN (SELECT id FROM schedule_runs))
"""


@dataclass
class Audit:
    """What the store holds after a drain, and every way it differs from the full audit trail
    (each task ``completed`` with exactly its two facts, two transition events linked to them,
    and one complete summary keyed ``<id>:<attempt>``)."""

    tasks: int
    facts: int
    events: int
    summaries: int
    violations: list[str]

    def per_task(self) -> dict[str, float]:
        n = self.tasks or 1
        return {
            "facts": self.facts / n,
            "events": self.events / n,
            "summaries": self.summaries / n,
            "audit_rows": (self.facts + self.events + self.summaries) / n,
        }


def audit_store(store: Store, expected_tasks: int) -> Audit:
    with raw_connection(store) as conn:
        tasks, not_completed, bad_facts, bad_events, bad_summaries = (
            int(v or 0) for v in raw_rows(conn, _AUDIT_SQL)[0]
        )
        facts, events, summaries, unlinked, bad_keys, orphans = (
            int(v or 0) for v in raw_rows(conn, _AUDIT_LINKS_SQL)[0]
        )
    checks = [
        (tasks != expected_tasks, f"{tasks} tasks stored, {expected_tasks} admitted"),
        (not_completed, f"{not_completed} tasks not completed"),
        (bad_facts, f"{bad_facts} tasks without exactly 2 facts (queued->running->completed)"),
        (bad_events, f"{bad_events} tasks without exactly 2 events, both 'transition'"),
        (bad_summaries, f"{bad_summaries} tasks without exactly one complete summary"),
        (unlinked, f"{unlinked} transition events not linked to their fact"),
        (bad_keys, f"{bad_keys} summaries not keyed <task-id>:<attempt>"),
        (orphans, f"{orphans} audit rows for tasks that do not exist"),
    ]
    return Audit(tasks, facts, events, summaries, [text for failed, text in checks if failed])


def analyze_store(store: Store) -> None:
    """Gather planner statistics (``ANALYZE``), as autovacuum eventually does on PostgreSQL.

    taskward never runs ANALYZE itself; without statistics both planners may scan and sort
    every queued row for a claim instead of walking the claim index in order.
    """
    with raw_connection(store) as conn:
        conn.execute("ANALYZE")


def code_version() -> dict[str, Any]:
    """The commit, whether ``src/`` differs from it, and a hash of the ``src/`` files measured
    (other work may be in progress in the tree: the hash tells two runs' code apart)."""
    import hashlib
    import subprocess

    def git(*argv: str) -> str:
        try:
            out = subprocess.run(
                ["git", *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        return out.stdout.strip()

    digest = hashlib.sha256()
    for path in sorted((REPO_ROOT / "src").rglob("*")):
        if path.is_file() and path.suffix in {".py", ".sql"}:
            digest.update(str(path.relative_to(REPO_ROOT)).encode())
            digest.update(path.read_bytes())
    return {
        "commit": git("rev-parse", "--short", "HEAD") or "?",
        "src_dirty": bool(git("status", "--porcelain", "--", "src")),
        "src_hash": digest.hexdigest()[:12],
    }
