"""Admission throughput: ``taskward.submit_task`` beside a raw-SQL floor, on both backends.

One admission is one ``submit_task`` call (one transaction). The floor is the same row written
by a bare ``INSERT`` in its own transaction through the raw driver (stdlib ``sqlite3`` /
synchronous psycopg, one connection per producer) against an identical schema: every store is
created by opening a taskward store at a fresh URL, so the migrations build the tables and
indexes. N producers are N spawned OS processes, each with its own event loop and store
(taskward) or its own connection (floor). Runs interleave (taskward, floor, floor, taskward, ...)
and each measurement starts from an empty store; the median of --repeat runs is reported.

Usage: .venv/bin/python bench/admission.py [--count N] [--repeat R] [--producers 1,4,16]
                                          [--backends sqlite,postgres] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg

import taskward
from taskward.admission import validate_application
from taskward.ids import new_id

# Run as a file (`python bench/x.py`) or as a module (`python -m bench.x`): either way the
# repository root is on the path and the shared helpers import as `bench._common`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._common import (
    DEFAULT_PG_URL,
    PgSchemas,
    machine_description,
    median,
    pg_schema_url,
    progress,
    remove_sqlite_file,
    render_table,
    run_producers,
    split_count,
    with_query,
)

DEFAULT_COUNTS = {"sqlite": 5000, "postgres": 3000}
GOAL_RATIO = 0.8
KINDS = ("taskward", "sync", "floor")
ACTION_KIND = "command"
ACTION_ARGS: dict[str, Any] = {"argv": ["true"]}
EXECUTION_TARGET = "host"
COMMAND_ALLOWLIST = frozenset({"true"})

# Every column submit_task's run_insert_if_new writes, in the same order. The floor binds the
# same values (status 'queued', chain_depth 0, invocation_id NULL are literals there too).
_COLUMNS = (
    "id, schedule_id, invocation_id, trigger_context, action_kind, action_args, status, "
    "chain_depth, fired_at, created_at, queued_at, concurrency_key, required_capabilities, "
    "execution_target, library_ref, library_content_hash, idempotency_key, application_hash, "
    "admission_source"
)
SQLITE_FLOOR_INSERT = (
    f"INSERT INTO schedule_runs ({_COLUMNS}) "
    "VALUES (?, ?, NULL, ?, ?, ?, 'queued', 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
PG_FLOOR_INSERT = (
    f"INSERT INTO schedule_runs ({_COLUMNS}) "
    "VALUES (%s, %s, NULL, %s::jsonb, %s, %s::jsonb, 'queued', 0, %s, %s, %s, %s, %s::jsonb, "
    "%s, %s, %s, %s, %s, %s)"
)
# Columns that must match between a taskward row and a floor row (the rest are id, key, times).
COMPARED_COLUMNS = (
    "schedule_id",
    "invocation_id",
    "trigger_context",
    "action_kind",
    "action_args",
    "status",
    "chain_depth",
    "concurrency_key",
    "required_capabilities",
    "execution_target",
    "library_ref",
    "library_content_hash",
    "application_hash",
    "admission_source",
    "lease_attempts",
    "exit_code",
)


def build_registry() -> taskward.TaskAdapterRegistry:
    return taskward.build_registry(taskward.AdapterConfig(command_allowlist=COMMAND_ALLOWLIST))


def application(key: str) -> taskward.TaskApplication:
    return taskward.TaskApplication(
        action_kind=ACTION_KIND,
        args=ACTION_ARGS,
        execution_target=EXECUTION_TARGET,
        idempotency_key=key,
    )


@dataclass(frozen=True)
class RowTemplate:
    """The constant part of an admitted row, computed once by taskward's own validation."""

    trigger_context: str
    action_kind: str
    action_args: str
    concurrency_key: str | None
    required_capabilities: str
    execution_target: str
    library_ref: str | None
    library_content_hash: str | None
    application_hash: str
    admission_source: str


def row_template() -> RowTemplate:
    admitted = validate_application(application("template"), build_registry())
    return RowTemplate(
        trigger_context="{}",
        action_kind=admitted.action_kind,
        action_args=admitted.args_json,
        concurrency_key=admitted.concurrency_key,
        required_capabilities=json.dumps(admitted.required_capabilities, separators=(",", ":")),
        execution_target=admitted.execution_target,
        library_ref=admitted.library_ref,
        library_content_hash=admitted.library_content_hash,
        application_hash=admitted.application_hash,
        admission_source="library",
    )


@dataclass(frozen=True)
class Job:
    """What one producer process does."""

    backend: str
    target: str  # a taskward URL, a SQLite file path or a libpq conninfo
    count: int
    warmup: int
    key_prefix: str
    template: RowTemplate | None = None


# -- producers (run in spawned processes) -----------------------------------------------------


def taskward_producer(job: Job, start_gate: Any) -> dict[str, Any]:
    return asyncio.run(_taskward_producer(job, start_gate))


async def _taskward_producer(job: Job, start_gate: Any) -> dict[str, Any]:
    registry = build_registry()
    submit_task = taskward.submit_task
    async with taskward.open_db(job.target) as db:
        for i in range(job.warmup):
            await submit_task(db, application(f"{job.key_prefix}-w{i}"), registry=registry)
        start_gate()
        ids: list[str] = []
        start = time.monotonic()
        for i in range(job.count):
            app = application(f"{job.key_prefix}-{i}")
            ids.append(await submit_task(db, app, registry=registry))
        end = time.monotonic()
    return {"start": start, "end": end, "admitted": len(ids), "distinct_ids": len(set(ids))}


def taskward_sync_producer(job: Job, start_gate: Any) -> dict[str, Any]:
    """The synchronous client, as a program without an event loop admits (one statement per
    admission over the driver's synchronous path)."""
    with taskward.SyncClient(job.target, registry=build_registry()) as client:
        submit_task = client.submit_task
        for i in range(job.warmup):
            submit_task(application(f"{job.key_prefix}-w{i}"))
        start_gate()
        ids: list[str] = []
        start = time.monotonic()
        for i in range(job.count):
            ids.append(submit_task(application(f"{job.key_prefix}-{i}")))
        end = time.monotonic()
    return {"start": start, "end": end, "admitted": len(ids), "distinct_ids": len(set(ids))}


def _floor_params(template: RowTemplate, key: str) -> tuple[Any, ...]:
    now = time.time()
    return (
        new_id(),
        None,
        template.trigger_context,
        template.action_kind,
        template.action_args,
        now,
        now,
        now,
        template.concurrency_key,
        template.required_capabilities,
        template.execution_target,
        template.library_ref,
        template.library_content_hash,
        key,
        template.application_hash,
        template.admission_source,
    )


def sqlite_floor_producer(job: Job, start_gate: Any) -> dict[str, Any]:
    assert job.template is not None
    template = job.template
    # The pragmas SQLiteDB.connect sets: WAL, synchronous=FULL, foreign keys, busy_timeout=0
    # with a jittered 0.5 ms..20 ms sleep-and-retry on SQLITE_BUSY (the same backoff shape).
    conn = sqlite3.connect(job.target, isolation_level=None, check_same_thread=False, timeout=0)
    conn.execute("PRAGMA busy_timeout=0")

    def retry_busy(sql: str, params: tuple[Any, ...] = ()) -> None:
        delay = 0.0005
        while True:
            try:
                conn.execute(sql, params)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.02)

    retry_busy("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")

    def insert(key: str) -> None:
        # Autocommit: the bare INSERT is its own transaction.
        retry_busy(SQLITE_FLOOR_INSERT, _floor_params(template, key))

    for i in range(job.warmup):
        insert(f"{job.key_prefix}-w{i}")
    start_gate()
    start = time.monotonic()
    for i in range(job.count):
        insert(f"{job.key_prefix}-{i}")
    end = time.monotonic()
    conn.close()
    return {"start": start, "end": end, "admitted": job.count, "distinct_ids": job.count}


def pg_floor_producer(job: Job, start_gate: Any) -> dict[str, Any]:
    assert job.template is not None
    template = job.template
    with psycopg.connect(job.target, autocommit=True) as conn:

        def insert(key: str) -> None:
            # Autocommit: the bare INSERT is its own transaction (one round trip).
            conn.execute(PG_FLOOR_INSERT, _floor_params(template, key))

        for i in range(job.warmup):
            insert(f"{job.key_prefix}-w{i}")
        start_gate()
        start = time.monotonic()
        for i in range(job.count):
            insert(f"{job.key_prefix}-{i}")
        end = time.monotonic()
    return {"start": start, "end": end, "admitted": job.count, "distinct_ids": job.count}


# -- stores -----------------------------------------------------------------------------------


async def _create_store(url: str) -> None:
    async with taskward.open_db(url):  # the migrations create the schema
        pass


class Stores:
    """Fresh, identical, migrated stores per measurement; everything is removed at the end."""

    def __init__(self, pg_url: str, sqlite_dir: Path | None) -> None:
        self.pg_url = pg_url
        self._tmp = Path(tempfile.mkdtemp(prefix="taskward-bench-", dir=sqlite_dir))
        self._schemas = PgSchemas(pg_url, prefix="bench_admission")
        self._n = 0

    def create(self, backend: str) -> dict[str, str]:
        """Returns the taskward URL (``url``), the raw target (``raw``) and a ``handle``."""
        self._n += 1
        if backend == "sqlite":
            path = self._tmp / f"admission-{self._n}.db"
            url = f"sqlite:///{path}"
            asyncio.run(_create_store(url))
            return {"url": with_query(url, migrate="false"), "raw": str(path), "handle": str(path)}
        schema = self._schemas.create()
        url = pg_schema_url(self.pg_url, schema)
        asyncio.run(_create_store(url))
        return {"url": with_query(url, migrate="false"), "raw": url, "handle": schema}

    def count_rows(self, backend: str, store: dict[str, str]) -> int:
        return int(self._fetch(backend, store, "SELECT count(*) AS n FROM schedule_runs")["n"])

    def sample_row(self, backend: str, store: dict[str, str]) -> dict[str, Any]:
        return self._fetch(backend, store, "SELECT * FROM schedule_runs LIMIT 1")

    def _fetch(self, backend: str, store: dict[str, str], sql: str) -> dict[str, Any]:
        if backend == "sqlite":
            conn = sqlite3.connect(store["raw"])
            try:
                cur = conn.execute(sql)
                names = [d[0] for d in cur.description]
                return dict(zip(names, cur.fetchone(), strict=True))
            finally:
                conn.close()
        with psycopg.connect(store["raw"]) as conn:
            cur = conn.execute(sql)
            names = [d.name for d in cur.description or ()]
            row = cur.fetchone()
            assert row is not None
            return dict(zip(names, row, strict=True))

    def remove(self, backend: str, store: dict[str, str]) -> None:
        if backend == "sqlite":
            remove_sqlite_file(Path(store["handle"]))
        else:
            self._schemas.drop(store["handle"])

    def pg_version(self) -> str:
        return self._schemas.server_version()

    def close(self) -> None:
        try:
            self._schemas.drop_all()
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)


def _normalise(value: Any) -> Any:
    """SQLite keeps JSON as text, PostgreSQL returns parsed jsonb: compare parsed values."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


# -- measurement ------------------------------------------------------------------------------


@dataclass
class Sample:
    backend: str
    producers: int
    kind: str  # "taskward" (async submit_task), "sync" (SyncClient.submit_task) or "floor"
    repeat: int
    count: int
    wall_s: float
    per_s: float
    rows: int
    expected_rows: int
    violations: list[str]


def measure(
    stores: Stores,
    backend: str,
    producers: int,
    kind: str,
    repeat: int,
    count: int,
    warmup: int,
    template: RowTemplate,
    samples_rows: dict[tuple[str, str], dict[str, Any]],
) -> Sample:
    store = stores.create(backend)
    try:
        run_id = uuid.uuid4().hex[:8]
        if kind == "taskward":
            target, producer = store["url"], taskward_producer
        elif kind == "sync":
            target, producer = store["url"], taskward_sync_producer
        else:
            target = store["raw"]
            producer = sqlite_floor_producer if backend == "sqlite" else pg_floor_producer
        jobs = [
            Job(backend, target, share, warmup, f"bench-{run_id}-p{i}", template)
            for i, share in enumerate(split_count(count, producers))
        ]
        run = run_producers(producer, jobs)
        timed = sum(r["admitted"] for r in run.results)
        expected = timed + warmup * producers
        rows = stores.count_rows(backend, store)
        violations: list[str] = []
        if timed != count:
            violations.append(f"{timed} admissions timed, {count} requested")
        if rows != expected:
            violations.append(f"{rows} rows stored after {expected} admissions")
        for i, r in enumerate(run.results):
            if r["distinct_ids"] != r["admitted"]:
                violations.append(
                    f"producer {i}: {r['distinct_ids']} distinct ids for {r['admitted']} admissions"
                )
        samples_rows.setdefault((backend, kind), stores.sample_row(backend, store))
    finally:
        stores.remove(backend, store)
    per_s = count / run.wall_s
    progress(
        f"[{backend:8} producers={producers:<2} repeat {repeat + 1}] {kind:8} "
        f"{count} in {run.wall_s:6.2f}s = {per_s:8.0f}/s  rows {rows}/{expected}"
        + (f"  VIOLATIONS: {'; '.join(violations)}" if violations else "  ok")
    )
    return Sample(
        backend, producers, kind, repeat, count, run.wall_s, per_s, rows, expected, violations
    )


def compare_rows(samples_rows: dict[tuple[str, str], dict[str, Any]], backend: str) -> list[str]:
    """Columns where a floor row or a SyncClient row differs from an async submit_task row
    (both must write the same)."""
    ours = samples_rows.get((backend, "taskward"))
    if ours is None:
        return []
    return [
        f"{backend}: {column} taskward={ours[column]!r} {kind}={other[column]!r}"
        for kind in ("sync", "floor")
        if (other := samples_rows.get((backend, kind))) is not None
        for column in COMPARED_COLUMNS
        if _normalise(ours[column]) != _normalise(other[column])
    ]


def _csv(kind: type, text: str) -> list[Any]:
    return [kind(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--count",
        type=int,
        default=None,
        help="admissions per measurement (default 5000 sqlite, 3000 postgres)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="interleaved taskward/floor runs; the median is reported",
    )
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--producers", default="1,4,16")
    parser.add_argument(
        "--warmup",
        type=int,
        default=20,
        help="untimed admissions per producer before the start gate",
    )
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument(
        "--sqlite-dir",
        type=Path,
        default=None,
        help="where the SQLite files go (default: the system temp dir)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    args.backends = _csv(str, args.backends)
    args.producers = _csv(int, args.producers)
    unknown = set(args.backends) - set(DEFAULT_COUNTS)
    if unknown:
        parser.error(f"unknown backends {sorted(unknown)}; allowed: sqlite, postgres")
    if args.repeat < 1 or any(p < 1 for p in args.producers):
        parser.error("--repeat and --producers must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    template = row_template()
    stores = Stores(args.pg_url, args.sqlite_dir)
    samples: list[Sample] = []
    sample_rows: dict[tuple[str, str], dict[str, Any]] = {}
    context = machine_description()
    try:
        if "postgres" in args.backends:
            context["postgres"] = stores.pg_version()
        for backend in args.backends:
            count = args.count or DEFAULT_COUNTS[backend]
            for producers in args.producers:
                for repeat in range(args.repeat):
                    # Rotate which side goes first so drift (WAL growth, cache, autovacuum,
                    # other load on the machine) does not always favour the same side.
                    order = KINDS[repeat % len(KINDS) :] + KINDS[: repeat % len(KINDS)]
                    for kind in order:
                        samples.append(
                            measure(
                                stores,
                                backend,
                                producers,
                                kind,
                                repeat,
                                count,
                                args.warmup,
                                template,
                                sample_rows,
                            )
                        )
    finally:
        stores.close()

    results = []
    for backend in args.backends:
        for producers in args.producers:

            def rates(kind: str, backend: str = backend, producers: int = producers) -> list[float]:
                return [
                    s.per_s
                    for s in samples
                    if (s.backend, s.producers, s.kind) == (backend, producers, kind)
                ]

            ours, floor = median(rates("taskward")), median(rates("floor"))
            sync = median(rates("sync"))
            results.append(
                {
                    "backend": backend,
                    "producers": producers,
                    "taskward_per_s": round(ours, 1),
                    "sync_per_s": round(sync, 1),
                    "floor_per_s": round(floor, 1),
                    "ratio": round(ours / floor, 3),
                    "sync_ratio": round(sync / floor, 3),
                    "taskward_samples": [round(r, 1) for r in rates("taskward")],
                    "sync_samples": [round(r, 1) for r in rates("sync")],
                    "floor_samples": [round(r, 1) for r in rates("floor")],
                }
            )
    violations = [
        f"{s.backend} producers={s.producers} {s.kind} repeat {s.repeat + 1}: {v}"
        for s in samples
        for v in s.violations
    ]
    violations += [f"row differs: {d}" for b in args.backends for d in compare_rows(sample_rows, b)]
    # The goal, per backend and per API: the async submit_task on the caller's event loop, and
    # the synchronous client, the like-for-like match of the floor's synchronous driver.
    goal = {
        r["backend"]: {
            "ratio": r["ratio"],
            "met": r["ratio"] >= GOAL_RATIO,
            "sync_ratio": r["sync_ratio"],
            "sync_met": r["sync_ratio"] >= GOAL_RATIO,
        }
        for r in results
        if r["producers"] == 1
    }
    method = (
        "producers are separate OS processes (multiprocessing spawn); taskward: each runs its own "
        "event loop and store (taskward.open_db) and calls submit_task once per admission; sync: "
        "each has one taskward.SyncClient and calls its submit_task once per admission; floor: "
        "each has its own raw connection (sqlite3 / sync psycopg) and runs one bare INSERT of the "
        "same row per transaction (autocommit). Every measurement starts from a fresh migrated "
        "store; SQLite in WAL with synchronous=FULL; PostgreSQL in a throwaway schema. "
        f"{args.warmup} untimed warm-up admissions per producer; median of {args.repeat} "
        "interleaved runs."
    )
    if args.json:
        print(
            json.dumps(
                {
                    "benchmark": "admission",
                    "method": method,
                    "context": context,
                    "counts": {b: args.count or DEFAULT_COUNTS[b] for b in args.backends},
                    "repeat": args.repeat,
                    "results": results,
                    "goal_single_producer_ratio": GOAL_RATIO,
                    "goal": goal,
                    "violations": violations,
                    "samples": [asdict(s) for s in samples],
                },
                indent=2,
            )
        )
    else:
        print(f"admission benchmark: {method}")
        print("context: " + ", ".join(f"{k} {v}" for k, v in context.items()))
        print(
            "counts per measurement: "
            + ", ".join(f"{b} {args.count or DEFAULT_COUNTS[b]}" for b in args.backends)
        )
        print()
        print(
            render_table(
                [
                    "backend",
                    "producers",
                    "async adm/s",
                    "sync adm/s",
                    "floor ins/s",
                    "async ratio",
                    "sync ratio",
                ],
                [
                    [
                        r["backend"],
                        str(r["producers"]),
                        f"{r['taskward_per_s']:.0f}",
                        f"{r['sync_per_s']:.0f}",
                        f"{r['floor_per_s']:.0f}",
                        f"{r['ratio']:.2f}x",
                        f"{r['sync_ratio']:.2f}x",
                    ]
                    for r in results
                ],
            )
        )
        print()
        for backend, verdict in goal.items():
            print(
                f"goal (1 producer >= {GOAL_RATIO}x floor) {backend}: async submit_task "
                f"{verdict['ratio']:.2f}x " + ("met" if verdict["met"] else "NOT met") + "; "
                f"SyncClient.submit_task {verdict['sync_ratio']:.2f}x "
                + ("met" if verdict["sync_met"] else "NOT met")
            )
        print(f"violations: {len(violations)}")
        for v in violations:
            print(f"  {v}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
