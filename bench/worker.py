"""Worker throughput and pickup latency: one ``taskward worker`` process beside a raw-SQL floor.

Drain: N no-op ``@taskward.task`` tasks (``bench.noop``, an async function that returns) are
admitted untimed, then ONE ``taskward worker --burst --quiet --concurrency C`` process is
started and timed from just before its spawn until every row is seen ``completed`` (the count is
polled every 50 ms). Afterwards the store must hold exactly the full audit trail: each task
``completed`` with two ``status_transitions`` facts (``queued -> running -> completed``), two
``transition`` events linked to them and one complete ``task_summaries`` row.

Floor: the same claim and completion writes through the raw driver (stdlib ``sqlite3`` /
synchronous psycopg) in one process, one task at a time, against an identical schema: per task a
claim transaction (guarded UPDATE of the oldest queued row to ``running`` with the lease
columns, its fact, its event) and a completion transaction (guarded UPDATE to ``completed``, its
fact, its event, a complete summary row).

Pickup: with an idle worker already running (its heartbeat row exists), tasks are submitted one
at a time ~20 ms apart with ``taskward.submit_task``; the latency of each is its ``running``
fact's ``created_at`` minus the wall-clock time just before ``submit_task`` was called.

Usage: .venv/bin/python bench/worker.py [--count N] [--concurrency C] [--pickup-count M]
                                       [--repeat R] [--backends sqlite,postgres] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sqlite3
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

# Run as a file (`python bench/x.py`) or as a module (`python -m bench.x`): either way the
# repository root is on the path and the shared helpers import as `bench._common`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._common import (
    ADMIT_COLUMNS,
    DEFAULT_PG_URL,
    EVENT_COLUMNS,
    FACT_COLUMNS,
    SUMMARY_COLUMNS,
    TASKS_MODULE,
    Audit,
    Drain,
    Store,
    Stores,
    WorkerProcess,
    admit_tasks,
    analyze_store,
    audit_store,
    code_version,
    drain_with_worker,
    ensure_repo_on_path,
    machine_description,
    median,
    percentile,
    progress,
    raw_connection,
    raw_rows,
    render_table,
    report_violations,
    wait_for_completed,
    wait_for_heartbeat,
)

ensure_repo_on_path()

import taskward  # noqa: E402 - after the repository root is on sys.path
from taskward.admission import validate_application  # noqa: E402
from taskward.ids import new_id  # noqa: E402 - the floors write the ids taskward writes

NOOP_KIND = "bench.noop"
NOOP_ARGS: dict[str, Any] = {}
GOAL_FLOOR_RATIO = 0.4
GOAL_PICKUP_P50_MS = {"sqlite": 100.0, "postgres": 20.0}
BACKENDS = ("sqlite", "postgres")

# The floor's defaults mirror the worker's: lease 300 s, deadline 240 s (the attempt ceiling is
# the row's own, its column's default 3 as admission stores it: R18).
LEASE_TTL_S = 300.0
TIMEOUT_S = 240.0
FLOOR_WORKER = "host:bench0floor"


# -- the raw-SQL floor ------------------------------------------------------------------------


@dataclass(frozen=True)
class FloorSQL:
    admit: str
    claim: str
    complete: str
    fact: str
    event: str
    summary: str
    begin: str | None  # SQLite opens write transactions with BEGIN IMMEDIATE, as SQLiteDB does


def floor_sql(backend: str) -> FloorSQL:
    """The statements of the floor, the same writes taskward makes, per dialect.

    The claim walks the claim index (``idx_schedule_runs_claim_rank``, queued rows by
    ``(claim_rank, queued_at, id)``, migration 0011) in order, due rows below their own
    attempt ceiling: SQLite is told so with ``INDEXED BY``; on PostgreSQL the floor's session
    disables bitmap scans and sorts (``_floor_connection``). Without planner statistics both
    planners would otherwise read and sort every queued row for each claim.
    """
    if backend == "sqlite":
        p, j, scan = "?", "", "schedule_runs INDEXED BY idx_schedule_runs_claim_rank"
        pick = "LIMIT 1"
    else:
        p, j, scan = "%s", "::jsonb", "schedule_runs"
        pick = "LIMIT 1 FOR UPDATE SKIP LOCKED"
    return FloorSQL(
        admit=(
            f"INSERT INTO schedule_runs ({ADMIT_COLUMNS}) VALUES ({p}, NULL, NULL, '{{}}', "
            f"{p}, {p}{j}, 'queued', 0, {p}, {p}, {p}, NULL, {p}{j}, 'host', NULL, NULL, "
            f"{p}, {p}, 'library')"
        ),
        # The claim: the oldest claimable queued row, guarded like run_claim_page + the CAS.
        claim=(
            f"UPDATE schedule_runs SET status = 'running', updated_at = {p}, "
            f"status_reason_code = 'claimed', status_reason_summary = {p}, "
            f"status_evidence_refs = '[]', leased_by = {p}, lease_expires_at = {p}, "
            f"lease_attempts = lease_attempts + 1, deadline_at = {p}, retry_at = NULL "
            f"WHERE id = (SELECT id FROM {scan} WHERE status = 'queued' AND queued_at <= {p} "
            f"AND lease_attempts < max_attempts AND cancel_requested_at IS NULL "
            f"ORDER BY claim_rank, queued_at, id {pick}) "
            "AND status = 'queued' AND leased_by IS NULL AND cancel_requested_at IS NULL "
            "RETURNING id, lease_attempts"
        ),
        # The completion: guarded by owner, stored expiry and attempt (ADR-0071 D4).
        complete=(
            f"UPDATE schedule_runs SET status = 'completed', updated_at = {p}, "
            f"status_reason_code = 'completed', status_reason_summary = 'adapter completed', "
            f"status_evidence_refs = {p}{j}, ended_at = {p}, exit_code = 0, "
            f"error_detail = NULL, invocation_id = NULL "
            f"WHERE id = {p} AND status = 'running' AND leased_by = {p} "
            f"AND lease_expires_at = {p} AND lease_attempts = {p} RETURNING id"
        ),
        fact=(
            f"INSERT INTO status_transitions ({FACT_COLUMNS}) VALUES ({p}, 'schedule_run', {p}, "
            f"{p}, {p}, {p}, {p}, {p}{j}, 'system', {p}, {p}, '{{}}', {p}, {p}, {p}, {p})"
        ),
        event=(
            f"INSERT INTO task_events ({EVENT_COLUMNS}) "
            f"VALUES ({p}, {p}, 'transition', {p}, {p}, {p}{j}, {p})"
        ),
        summary=(
            f"INSERT INTO task_summaries ({SUMMARY_COLUMNS}) "
            f"VALUES ({p}, {p}, {p}, 'complete', {p}{j}, {p}, NULL, {p}, {p})"
        ),
        begin="BEGIN IMMEDIATE" if backend == "sqlite" else None,
    )


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def floor_admit(store: Store, count: int) -> None:
    """Pre-insert ``count`` queued rows shaped like taskward's admissions (untimed)."""
    ensure_repo_on_path()
    registry = taskward.build_registry(taskward.AdapterConfig(imports=(TASKS_MODULE,)))
    admitted = validate_application(
        taskward.TaskApplication(
            action_kind=NOOP_KIND, args=NOOP_ARGS, execution_target="host", idempotency_key="t"
        ),
        registry,
    )
    sql = floor_sql(store.backend)
    now = time.time()
    rows = [
        (
            new_id(),
            admitted.action_kind,
            admitted.args_json,
            now + i * 1e-6,
            now + i * 1e-6,
            now + i * 1e-6,
            "[]",
            f"floor-{i}",
            admitted.application_hash,
        )
        for i in range(count)
    ]
    with raw_connection(store) as conn:
        if store.backend == "sqlite":
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(sql.admit, rows)
            conn.execute("COMMIT")
        else:
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(sql.admit, rows)


def _floor_connection(store: Store) -> Any:
    if store.backend == "sqlite":
        # The pragmas SQLiteDB.connect sets: WAL, synchronous=FULL, foreign keys, autocommit
        # outside the explicit BEGIN IMMEDIATE ... COMMIT.
        conn = sqlite3.connect(store.raw, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL").fetchone()
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn
    conn = psycopg.connect(store.raw, autocommit=True)
    # Walk the claim index in order even without statistics (see floor_sql).
    conn.execute("SET enable_bitmapscan = off")
    conn.execute("SET enable_sort = off")
    return conn


def run_floor(store: Store, count: int, *, per_tx: int = 1) -> float:
    """Claim and complete ``count`` tasks one at a time, two transactions each; returns the
    seconds the loop took. Ids (time-ordered, from ``taskward.ids.new_id`` as taskward writes
    them), times, hashes and JSON are made inside the timed loop.

    ``per_tx`` > 1: the batched floor, what the same writes cost when ``per_tx`` jobs share
    each transaction (their claims in one, then their completions in one): the ceiling that
    batching, with this schema and these durability settings, leaves to any worker."""
    sql = floor_sql(store.backend)
    conn = _floor_connection(store)
    actor = f"system:{FLOOR_WORKER}"
    claim_payload = _compact(
        {"actor": actor, "from": "queued", "reason_code": "claimed", "to": "running"}
    )
    done_payload = _compact(
        {"actor": actor, "from": "running", "reason_code": "completed", "to": "completed"}
    )

    def claim() -> tuple[str, int, float, float]:
        now = time.time()
        expires, deadline = now + LEASE_TTL_S, now + TIMEOUT_S
        fact_id, event_id = new_id(), new_id()
        row = conn.execute(
            sql.claim, (now, "attempt 1", FLOOR_WORKER, expires, deadline, now)
        ).fetchone()
        if row is None:
            raise RuntimeError("floor: no queued row left to claim")
        task_id, attempt = row[0], int(row[1])
        lease = f"{FLOOR_WORKER}/{attempt}"
        conn.execute(
            sql.fact,
            (
                fact_id,
                task_id,
                "queued",
                "running",
                "claimed",
                f"attempt {attempt}",
                "[]",
                actor,
                now,
                f"claim:{FLOOR_WORKER}:{attempt}",
                _sha(f"{task_id}:claim:{attempt}"),
                event_id,
                lease,
            ),
        )
        conn.execute(sql.event, (event_id, task_id, fact_id, "running", claim_payload, now))
        return task_id, attempt, expires, now

    def complete(task_id: str, attempt: int, expires: float, started: float) -> None:
        now = time.time()
        session_key = f"{task_id}:{attempt}"
        lease = f"{FLOOR_WORKER}/{attempt}"
        fact_id, event_id = new_id(), new_id()
        evidence = _compact([{"kind": "summary", "session_key": session_key}])
        body = _compact(
            {
                "facts": {
                    "artifact_refs": [],
                    "attempt": attempt,
                    "degrade_reason": "",
                    "degraded": False,
                    "elapsed_ms": round((now - started) * 1000, 3),
                    "ended_at": now,
                    "operation_statuses": {NOOP_KIND: "completed"},
                    "run_id": session_key,
                    "started_at": started,
                    "task_id": task_id,
                    "usage": {},
                },
                "manifest_ref": f"taskward:schedule_runs/{task_id}?attempt={attempt}",
                "narrative": None,
            }
        )
        row = conn.execute(
            sql.complete, (now, evidence, now, task_id, FLOOR_WORKER, expires, attempt)
        ).fetchone()
        if row is None:
            raise RuntimeError(f"floor: lost the guarded completion of {task_id}")
        conn.execute(
            sql.fact,
            (
                fact_id,
                task_id,
                "running",
                "completed",
                "completed",
                "adapter completed",
                evidence,
                actor,
                now,
                f"ack:{lease}",
                _sha(f"{task_id}:ack:{attempt}"),
                event_id,
                lease,
            ),
        )
        conn.execute(sql.event, (event_id, task_id, fact_id, "completed", done_payload, now))
        conn.execute(sql.summary, (session_key, task_id, attempt, body, _sha(body), now, now))

    @contextmanager
    def transaction() -> Iterator[None]:
        conn.execute(sql.begin if sql.begin is not None else "BEGIN")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    try:
        start = time.monotonic()
        done = 0
        while done < count:
            size = min(per_tx, count - done)
            with transaction():
                claimed = [claim() for _ in range(size)]
            with transaction():
                for one in claimed:
                    complete(*one)
            done += size
        return time.monotonic() - start
    finally:
        conn.close()


# -- pickup latency ---------------------------------------------------------------------------


def measure_pickup(
    store: Store, *, count: int, warmup: int, interval_s: float, concurrency: int, log_dir: Path
) -> dict[str, Any]:
    """Latencies (ms) from just before submit_task to the task's ``running`` fact."""
    registry = taskward.build_registry(taskward.AdapterConfig(imports=(TASKS_MODULE,)))
    prefix = f"pickup-{uuid.uuid4().hex[:8]}"
    submitted: dict[str, float] = {}

    async def submit_all() -> None:
        async with taskward.open_db(store.url) as db:
            first = time.monotonic()
            for i in range(warmup + count):
                # A fixed schedule, ~interval_s apart (never faster; late ones go at once).
                delay = first + i * interval_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                app = taskward.TaskApplication(
                    action_kind=NOOP_KIND,
                    args=NOOP_ARGS,
                    execution_target="host",
                    idempotency_key=f"{prefix}-{i}",
                )
                before = time.time()
                task_id = await taskward.submit_task(db, app, registry=registry)
                if i >= warmup:
                    submitted[task_id] = before

    with raw_connection(store) as conn:
        worker = WorkerProcess(store, concurrency=concurrency, burst=False, log_dir=log_dir)
        with worker:
            ready_s = wait_for_heartbeat(conn, worker)
            time.sleep(0.5)  # let its first idle claim pass go by
            asyncio.run(submit_all())
            completed, _ = wait_for_completed(conn, warmup + count, worker=worker, timeout_s=120)
        running = dict(
            raw_rows(
                conn,
                "SELECT entity_id, created_at FROM status_transitions WHERE "
                "previous_status = 'queued' AND status = 'running'",
            )
        )
    latencies = [
        (float(running[task_id]) - before) * 1000.0
        for task_id, before in submitted.items()
        if task_id in running
    ]
    return {
        "latencies_ms": latencies,
        "missing": len(submitted) - len(latencies),
        "completed": completed,
        "expected": warmup + count,
        "worker_ready_s": ready_s,
    }


# -- measurement ------------------------------------------------------------------------------


@dataclass
class Run:
    backend: str
    repeat: int
    count: int
    concurrency: int
    drain: dict[str, Any] = field(default_factory=dict)
    floor_s: float = 0.0
    floor_per_s: float = 0.0
    audit: dict[str, Any] = field(default_factory=dict)
    floor_audit: dict[str, Any] = field(default_factory=dict)
    pickup: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)


def _audit_dict(audit: Audit) -> dict[str, Any]:
    return {
        "tasks": audit.tasks,
        "facts": audit.facts,
        "events": audit.events,
        "summaries": audit.summaries,
        "per_task": audit.per_task(),
        "violations": audit.violations,
    }


def measure_taskward(stores: Stores, backend: str, run: Run, analyze: bool) -> None:
    store = stores.create(backend)
    try:
        began = time.monotonic()
        ids = admit_tasks(store, NOOP_KIND, NOOP_ARGS, run.count, key_prefix=f"drain-{run.repeat}")
        if analyze:
            analyze_store(store)
        admit_s = time.monotonic() - began
        drain: Drain = drain_with_worker(store, run.count, run.concurrency, stores.directory)
        audit = audit_store(store, run.count)
    finally:
        stores.remove(store)
    run.drain = {**asdict(drain), "per_s": drain.per_s, "span_per_s": drain.span_per_s}
    run.drain["admit_s_untimed"] = admit_s
    run.audit = _audit_dict(audit)
    run.violations += [f"taskward: {v}" for v in audit.violations]
    if len(set(ids)) != run.count:
        run.violations.append(f"taskward: {len(set(ids))} distinct ids for {run.count} tasks")
    if drain.exit_code != 0:
        run.violations.append(f"taskward: worker exited with {drain.exit_code}")
    per_task = audit.per_task()
    progress(
        f"[{backend:8} repeat {run.repeat + 1}] taskward {run.count} in {drain.wall_s:6.2f}s = "
        f"{drain.per_s:7.0f}/s (claims->last ack {drain.span_s:.2f}s = {drain.span_per_s:.0f}/s,"
        f" startup {drain.startup_s:.2f}s, worker says {drain.reported_s}s; admission "
        f"{admit_s:.1f}s untimed)  rows/task facts {per_task['facts']:.2f} events "
        f"{per_task['events']:.2f} summaries {per_task['summaries']:.2f}"
        + (f"  VIOLATIONS: {'; '.join(audit.violations)}" if audit.violations else "  ok")
    )


def measure_floor(stores: Stores, backend: str, run: Run, analyze: bool) -> None:
    store = stores.create(backend)
    try:
        floor_admit(store, run.count)
        if analyze:
            analyze_store(store)
        run.floor_s = run_floor(store, run.count)
        audit = audit_store(store, run.count)
    finally:
        stores.remove(store)
    run.floor_per_s = run.count / run.floor_s
    run.floor_audit = _audit_dict(audit)
    run.violations += [f"floor: {v}" for v in audit.violations]
    progress(
        f"[{backend:8} repeat {run.repeat + 1}] floor    {run.count} in {run.floor_s:6.2f}s = "
        f"{run.floor_per_s:7.0f}/s"
        + (f"  VIOLATIONS: {'; '.join(audit.violations)}" if audit.violations else "  ok")
    )


def measure_pickup_run(stores: Stores, backend: str, run: Run, args: argparse.Namespace) -> None:
    store = stores.create(backend)
    try:
        result = measure_pickup(
            store,
            count=args.pickup_count,
            warmup=args.pickup_warmup,
            interval_s=args.pickup_interval_ms / 1000.0,
            concurrency=run.concurrency,
            log_dir=stores.directory,
        )
    finally:
        stores.remove(store)
    lat = result["latencies_ms"]
    run.pickup = {
        "count": len(lat),
        "p50_ms": percentile(lat, 50),
        "p95_ms": percentile(lat, 95),
        "p99_ms": percentile(lat, 99),
        "min_ms": min(lat) if lat else float("nan"),
        "max_ms": max(lat) if lat else float("nan"),
        "worker_ready_s": result["worker_ready_s"],
        "latencies_ms": [round(v, 3) for v in lat],
    }
    if result["missing"]:
        run.violations.append(f"pickup: {result['missing']} tasks have no running fact")
    if result["completed"] != result["expected"]:
        run.violations.append(
            f"pickup: {result['completed']} of {result['expected']} tasks completed"
        )
    progress(
        f"[{backend:8} repeat {run.repeat + 1}] pickup   {len(lat)} tasks: p50 "
        f"{run.pickup['p50_ms']:.1f} ms, p95 {run.pickup['p95_ms']:.1f} ms, p99 "
        f"{run.pickup['p99_ms']:.1f} ms (min {run.pickup['min_ms']:.1f}, max "
        f"{run.pickup['max_ms']:.1f})"
    )


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=10000, help="tasks drained per run")
    parser.add_argument(
        "--concurrency", type=int, default=16, help="the worker's --concurrency (default 16)"
    )
    parser.add_argument("--pickup-count", type=int, default=200, help="tasks timed for pickup")
    parser.add_argument(
        "--pickup-warmup", type=int, default=10, help="untimed submissions before the pickup ones"
    )
    parser.add_argument(
        "--pickup-interval-ms", type=float, default=20.0, help="spacing of pickup submissions"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per backend; medians shown")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument(
        "--sqlite-dir",
        type=Path,
        default=None,
        help="where the SQLite files go (default: the system temp dir)",
    )
    parser.add_argument(
        "--analyze",
        action="store_true",
        help="run ANALYZE after the (untimed) admission on both sides (taskward never does)",
    )
    parser.add_argument("--skip-floor", action="store_true", help="no raw-SQL floor")
    parser.add_argument("--skip-pickup", action="store_true", help="no pickup latency")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    args.backends = _csv(args.backends)
    unknown = set(args.backends) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends {sorted(unknown)}; allowed: sqlite, postgres")
    if min(args.count, args.concurrency, args.repeat, args.pickup_count) < 1:
        parser.error("--count, --concurrency, --repeat and --pickup-count must be positive")
    return args


def summarise(runs: list[Run], backends: list[str], args: argparse.Namespace) -> list[dict]:
    results = []
    for backend in backends:
        mine = [r for r in runs if r.backend == backend]
        if not mine:
            continue

        def med(values: list[float]) -> float:
            return median(values) if values else float("nan")

        ours = med([r.drain["per_s"] for r in mine if r.drain])
        span = med([r.drain["span_per_s"] for r in mine if r.drain])
        floor = med([r.floor_per_s for r in mine if r.floor_per_s])
        pooled = [v for r in mine for v in r.pickup.get("latencies_ms", [])]
        audit = mine[-1].audit.get("per_task", {})
        results.append(
            {
                "backend": backend,
                "concurrency": args.concurrency,
                "count": args.count,
                "taskward_per_s": ours,
                "taskward_span_per_s": span,
                "floor_per_s": floor,
                "ratio": ours / floor if floor == floor and floor else float("nan"),
                "span_ratio": span / floor if floor == floor and floor else float("nan"),
                "wall_s": med([r.drain["wall_s"] for r in mine if r.drain]),
                "startup_s": med([r.drain["startup_s"] for r in mine if r.drain]),
                "worker_reported_s": med(
                    [r.drain["reported_s"] for r in mine if r.drain.get("reported_s")]
                ),
                "pickup_p50_ms": med([r.pickup["p50_ms"] for r in mine if r.pickup]),
                "pickup_p95_ms": med([r.pickup["p95_ms"] for r in mine if r.pickup]),
                "pickup_p99_ms": med([r.pickup["p99_ms"] for r in mine if r.pickup]),
                "pickup_pooled": {
                    "n": len(pooled),
                    "p50_ms": percentile(pooled, 50),
                    "p95_ms": percentile(pooled, 95),
                    "p99_ms": percentile(pooled, 99),
                    "negative": sum(1 for v in pooled if v < 0),
                },
                "rows_per_task": audit,
                "taskward_samples": [round(r.drain["per_s"], 1) for r in mine if r.drain],
                "floor_samples": [round(r.floor_per_s, 1) for r in mine if r.floor_per_s],
            }
        )
    return results


def _fmt(value: float, spec: str = ".0f") -> str:
    return "-" if value != value else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stores = Stores(args.pg_url, args.sqlite_dir, prefix="worker")
    context = {**machine_description(), **code_version()}
    runs: list[Run] = []
    try:
        if "postgres" in args.backends:
            context["postgres"] = stores.pg_version()
        for repeat in range(args.repeat):
            for backend in args.backends:  # interleaved: drift does not favour one backend
                run = Run(backend, repeat, args.count, args.concurrency)
                runs.append(run)
                sides = [measure_taskward] + ([] if args.skip_floor else [measure_floor])
                if repeat % 2 == 1:
                    sides.reverse()  # alternate which side goes first
                for side in sides:
                    side(stores, backend, run, args.analyze)
                if not args.skip_pickup:
                    measure_pickup_run(stores, backend, run, args)
    finally:
        stores.close()
        context["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)

    results = summarise(runs, args.backends, args)
    violations = [f"{r.backend} repeat {r.repeat + 1}: {v}" for r in runs for v in r.violations]
    goal = {
        r["backend"]: {
            "floor_ratio": r["ratio"],
            "floor_ratio_met": r["ratio"] >= GOAL_FLOOR_RATIO,
            "pickup_p50_ms": r["pickup_p50_ms"],
            "pickup_p50_goal_ms": GOAL_PICKUP_P50_MS[r["backend"]],
            "pickup_met": r["pickup_p50_ms"] < GOAL_PICKUP_P50_MS[r["backend"]],
        }
        for r in results
    }
    method = (
        f"{args.count} no-op tasks ({NOOP_KIND}, an async @taskward.task) admitted untimed with "
        f"submit_task, then ONE `taskward worker --burst --quiet --concurrency "
        f"{args.concurrency}` process timed from spawn until all rows are seen completed (50 ms "
        "polls); floor: the same claim and completion writes (claim tx: guarded UPDATE "
        "queued->running + fact + event; completion tx: guarded UPDATE running->completed + fact "
        "+ event + summary) one task at a time through the raw driver in one process; pickup: "
        f"{args.pickup_count} submissions {args.pickup_interval_ms:g} ms apart to an idle worker "
        f"(same concurrency), submit_task call -> running fact created_at. Fresh migrated store "
        f"per measurement{'; ANALYZE after admission' if args.analyze else ''}; median of "
        f"{args.repeat} interleaved runs."
    )
    if args.json:
        print(
            json.dumps(
                {
                    "benchmark": "worker",
                    "method": method,
                    "context": context,
                    "concurrency": args.concurrency,
                    "count": args.count,
                    "analyze": args.analyze,
                    "repeat": args.repeat,
                    "results": results,
                    "goal": goal,
                    "violations": violations,
                    "runs": [asdict(r) for r in runs],
                },
                indent=2,
            )
        )
        return 1 if violations else 0
    print(f"worker benchmark: {method}")
    print("context: " + ", ".join(f"{k} {v}" for k, v in context.items()))
    print(f"worker concurrency: {args.concurrency}")
    print()
    print(
        render_table(
            [
                "backend",
                "taskward tasks/s",
                "floor tasks/s",
                "ratio",
                "wall s",
                "startup s",
                "steady tasks/s",
                "steady ratio",
            ],
            [
                [
                    r["backend"],
                    _fmt(r["taskward_per_s"]),
                    _fmt(r["floor_per_s"]),
                    _fmt(r["ratio"], ".2f") + "x",
                    _fmt(r["wall_s"], ".2f"),
                    _fmt(r["startup_s"], ".2f"),
                    _fmt(r["taskward_span_per_s"]),
                    _fmt(r["span_ratio"], ".2f") + "x",
                ]
                for r in results
            ],
        )
    )
    print(
        "  wall s: worker spawn -> all completed; startup s: spawn -> first claim fact; steady: "
        "first claim fact -> last completion fact"
    )
    print()
    print(
        render_table(
            [
                "backend",
                "pickup p50 ms",
                "p95 ms",
                "p99 ms",
                "pooled p50",
                "pooled p95",
                "n",
                "n < 0",
            ],
            [
                [
                    r["backend"],
                    _fmt(r["pickup_p50_ms"], ".1f"),
                    _fmt(r["pickup_p95_ms"], ".1f"),
                    _fmt(r["pickup_p99_ms"], ".1f"),
                    _fmt(r["pickup_pooled"]["p50_ms"], ".1f"),
                    _fmt(r["pickup_pooled"]["p95_ms"], ".1f"),
                    str(r["pickup_pooled"]["n"]),
                    str(r["pickup_pooled"]["negative"]),
                ]
                for r in results
            ],
        )
    )
    print(
        "  pickup: running fact created_at - time just before submit_task; the fact carries the "
        "claim pass's clock, read before the pass looks for rows, so a pass already under way "
        "when the task was submitted gives a small or negative value (n < 0)"
    )
    print()
    print(
        render_table(
            ["backend", "facts/task", "events/task", "summaries/task", "audit rows/task"],
            [
                [
                    r["backend"],
                    _fmt(r["rows_per_task"].get("facts", float("nan")), ".2f"),
                    _fmt(r["rows_per_task"].get("events", float("nan")), ".2f"),
                    _fmt(r["rows_per_task"].get("summaries", float("nan")), ".2f"),
                    _fmt(r["rows_per_task"].get("audit_rows", float("nan")), ".2f"),
                ]
                for r in results
            ],
        )
    )
    print()
    for backend, verdict in goal.items():
        print(
            f"goal {backend}: taskward >= {GOAL_FLOOR_RATIO}x floor: "
            f"{_fmt(verdict['floor_ratio'], '.2f')}x "
            + ("met" if verdict["floor_ratio_met"] else "NOT met")
            + f"; pickup p50 < {verdict['pickup_p50_goal_ms']:.0f} ms: "
            f"{_fmt(verdict['pickup_p50_ms'], '.1f')} ms "
            + ("met" if verdict["pickup_met"] else "NOT met")
        )
    return report_violations(violations)


if __name__ == "__main__":
    sys.exit(main())
