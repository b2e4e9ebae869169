"""Cost in queue depth and in history: does a worker slow down as the store grows?

Two workloads of issue 7 ("cost flat in queue depth"), each measured on both backends:

- **queue**: ONE ``taskward worker --burst --quiet --concurrency C`` process drains ``--count``
  (10,000) ``bench.noop`` tasks from a store holding ``--shallow`` (10,000) queued rows and from
  one holding ``--deep`` (1,000,000). Timed from just before the spawn until the ``--count``-th
  completion is seen (50 ms polls); in the deep store the worker is then stopped with SIGTERM
  (it finishes what it holds). Goal: deep rate >= 0.8x the shallow rate.
- **history**: the same drain of ``--count`` freshly queued tasks, and a direct claim loop
  (``taskward.claims.claim_rows`` in this process, 20 rows a pass, ``--claim-count`` rows), on
  an empty store and on one that already holds ``--history-runs`` (5,000,000) completed runs
  with their full audit trail: 2 ``status_transitions`` facts each (10,000,000 facts), 2 events,
  1 summary and 1 pending outbox notification. Goal: with the history, claims >= 0.9x as fast.

The queued rows and the history are generated in SQL (PostgreSQL ``generate_series``, SQLite a
recursive CTE), chunk by chunk, with the columns and JSON text taskward itself writes. Before
the first measurement a shape check compares generated rows with rows written by a real
``submit_task`` and a real worker, column by column, and recomputes every hash (application,
transition request, summary) with taskward's own functions; a difference is a violation.

Every load is flushed to disk before anything is timed. Each drain and claim loop also reports
the I/O it caused per task (SQLite: the process's write_bytes; PostgreSQL: WAL bytes and
full-page images). ``--explain`` shows the claim statements' plans on every store, beside the
statements before migration 0005.

Every store is audited at the end (every run of the store, history included): queued rows have
no facts, completed ones exactly the full trail, claimed ones exactly their claim. Violations
must be 0.

Usage: .venv/bin/python bench/depth.py [--goals queue,history] [--quick] [--repeat R]
                                      [--backends sqlite,postgres] [--explain] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

# Run as a file (`python bench/x.py`) or as a module (`python -m bench.x`): either way the
# repository root is on the path and the shared helpers import as `bench._common`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._common import (
    ADMIT_COLUMNS,
    AUDIT_CTES,
    DEFAULT_PG_URL,
    EVENT_COLUMNS,
    FACT_COLUMNS,
    SUMMARY_COLUMNS,
    TASKS_MODULE,
    Store,
    Stores,
    WorkerProcess,
    admit_tasks,
    analyze_store,
    code_version,
    drain_with_worker,
    ensure_repo_on_path,
    machine_description,
    median,
    progress,
    raw_connection,
    raw_rows,
    raw_value,
    render_table,
    report_violations,
)

ensure_repo_on_path()

import taskward  # noqa: E402 - after the repository root is on sys.path
from taskward.admission import validate_application  # noqa: E402

NOOP_KIND = "bench.noop"
BACKENDS = ("sqlite", "postgres")
GOALS = ("queue", "history")
GOAL_QUEUE_RATIO = 0.8
GOAL_HISTORY_RATIO = 0.9

# History timing, in microseconds after a run is queued (one run every HISTORY_STEP_US): claimed
# 50 ms later, started 5 ms after the claim, ran 0.7-1.6 ms, summary 0.4 ms after the end,
# completion fact 1.2 ms after the summary. 5,000,000 runs span 2.9 days, inside the outbox's
# 7-day expiry, so their notifications are still pending (no delivery target is configured).
HISTORY_STEP_US = 50_000
QUEUED_STEP_US = 100
HISTORY_WORKERS = 20
LEASE_TTL_US = 300_000_000  # the worker's defaults: lease 300 s, deadline 240 s
TIMEOUT_US = 240_000_000
OUTBOX_TTL_S = 604800.0


# -- generated rows ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """What admission stores for the benchmark's no-op task (from taskward's own validation)."""

    kind: str
    args_json: str
    application_hash: str


def noop_shape() -> Shape:
    registry = taskward.build_registry(taskward.AdapterConfig(imports=(TASKS_MODULE,)))
    admitted = validate_application(
        taskward.TaskApplication(
            action_kind=NOOP_KIND, args={}, execution_target="host", idempotency_key="shape"
        ),
        registry,
    )
    if admitted.concurrency_key is not None or admitted.required_capabilities:
        raise RuntimeError("the no-op shape is expected to have no capabilities and no key")
    return Shape(admitted.action_kind, admitted.args_json, admitted.application_hash)


def history_workers(seed: str) -> list[str]:
    """Worker ids shaped like taskward's (``host:<8 hex>``) for the generated history."""
    return [
        "host:" + hashlib.sha256(f"{seed}:{i}".encode()).hexdigest()[:8]
        for i in range(HISTORY_WORKERS)
    ]


def now_us() -> int:
    return int(time.time() * 1_000_000)


# The JSON text taskward writes, built in SQL from the per-run values. SQLite stores the text as
# written: ``dumps`` keeps insertion order (events, evidence, outbox body), the summary and the
# hashed request are canonical (sorted keys). PostgreSQL stores jsonb, but the hashes are taken
# of the same text. ``{cat}`` is the dialect's concatenation of the pieces.
def _json_pieces() -> dict[str, list[str]]:
    evidence = ['\'[{"kind":"summary","session_key":"\'', "run_id", "':1\"}]'"]
    return {
        "evidence": evidence,
        "claim_request": [
            '\'{"actor":{"id":"\'',
            "w",
            '\'","type":"system"},"entity_id":"\'',
            "run_id",
            '\'","entity_type":"schedule_run","from_state":"queued","idempotency_key":"claim:\'',
            "w",
            '\':1","reason":{"code":"claimed","evidence_refs":[],"metadata":{},'
            '"summary":"attempt 1"},"to_state":"running"}\'',
        ],
        "done_request": [
            '\'{"actor":{"id":"\'',
            "w",
            '\'","type":"system"},"entity_id":"\'',
            "run_id",
            '\'","entity_type":"schedule_run","from_state":"running","idempotency_key":"ack:\'',
            "w",
            '\'/1","reason":{"code":"completed","evidence_refs":[{"kind":"summary",'
            '"session_key":"\'',
            "run_id",
            '\':1"}],"metadata":{},"summary":"adapter completed"},"to_state":"completed"}\'',
        ],
        "claim_payload": [
            '\'{"from":"queued","to":"running","reason_code":"claimed","actor":"system:\'',
            "w",
            "'\"}'",
        ],
        "done_payload": [
            '\'{"from":"running","to":"completed","reason_code":"completed","actor":"system:\'',
            "w",
            "'\"}'",
        ],
        "summary": [
            '\'{"facts":{"artifact_refs":[],"attempt":1,"degrade_reason":"","degraded":false,'
            '"elapsed_ms":\'',
            "ms",
            '\',"ended_at":"\'',
            "iso_e",
            '\'","operation_statuses":{"\'',
            "kind",
            '\'":"completed"},"run_id":"\'',
            "run_id",
            '\':1","started_at":"\'',
            "iso_s",
            '\'","task_id":"\'',
            "run_id",
            '\'","usage":{}},"manifest_ref":"taskward:schedule_runs/\'',
            "run_id",
            '\'?attempt=1","narrative":null}\'',
        ],
        "outbox_body": [
            '\'{"status":"completed","reason":{"code":"completed","summary":"adapter completed"},'
            '"evidence_refs":[{"kind":"summary","session_key":"\'',
            "run_id",
            "':1\"}]}'",
        ],
    }


def _cat(pieces: Sequence[str]) -> str:
    return " || ".join(pieces)


_RUN_COLUMNS = (
    "id, schedule_id, invocation_id, trigger_context, action_kind, action_args, status, "
    "exit_code, chain_parent_id, chain_depth, fired_at, ended_at, error_detail, created_at, "
    "updated_at, status_reason_code, status_reason_summary, status_evidence_refs, queued_at, "
    "leased_by, lease_expires_at, concurrency_key, lease_attempts, required_capabilities, "
    "execution_target, library_ref, library_content_hash, idempotency_key, application_hash, "
    "admission_source, retry_at, deadline_at, cancel_requested_at, cancel_requested_by"
)
_OUTBOX_COLUMNS = (
    "id, kind, dedup_key, schedule_run_id, transition_id, body, status, attempts, max_attempts, "
    "next_attempt_at, lease_owner, lease_expires_at, acked_targets, last_error, created_at, "
    "updated_at, delivered_at, expires_at"
)


@dataclass(frozen=True)
class Dialect:
    """The few expressions that differ between the generators of the two dialects."""

    name: str
    p: str  # placeholder
    j: str  # cast of JSON text to the column type
    seconds: Callable[[str], str]  # integer microseconds -> epoch seconds (float)
    iso: Callable[[str], str]  # integer microseconds -> datetime.isoformat() in UTC
    sha: Callable[[str], str]  # text -> 'sha256:<hex>'
    ms: Callable[[str], str]  # integer microseconds -> milliseconds text with 3 decimals
    mod: Callable[[str, str], str]  # a modulo b (psycopg reserves the % sign)


def _pg_iso(us: str) -> str:
    # datetime.isoformat() omits the fraction when the microsecond is 0.
    return (
        f"to_char(to_timestamp(({us}) / 1000000) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS')"
        f" || CASE WHEN mod({us}, 1000000) = 0 THEN '' ELSE '.' || "
        f"lpad(mod({us}, 1000000)::text, 6, '0') END || '+00:00'"
    )


def _sqlite_iso(us: str) -> str:
    return (
        f"strftime('%Y-%m-%dT%H:%M:%S', ({us}) / 1000000, 'unixepoch')"
        f" || CASE WHEN ({us}) % 1000000 = 0 THEN '' ELSE '.' || "
        f"printf('%06d', ({us}) % 1000000) END || '+00:00'"
    )


PG = Dialect(
    name="postgres",
    p="%s",
    j="::jsonb",
    seconds=lambda us: f"(({us})::float8 / 1000000.0)",
    iso=_pg_iso,
    sha=lambda text: f"'sha256:' || encode(sha256(convert_to({text}, 'UTF8')), 'hex')",
    ms=lambda us: f"(({us})::numeric / 1000)::numeric(12,3)::text",
    mod=lambda a, b: f"mod({a}, {b})",
)
SQLITE = Dialect(
    name="sqlite",
    p="?",
    j="",
    seconds=lambda us: f"(({us}) / 1000000.0)",
    iso=_sqlite_iso,
    sha=lambda text: f"'sha256:' || tw_sha256({text})",
    ms=lambda us: f"printf('%.3f', ({us}) / 1000.0)",
    mod=lambda a, b: f"(({a}) % ({b}))",
)


def _dialect(backend: str) -> Dialect:
    return PG if backend == "postgres" else SQLITE


def queued_sql(d: Dialect) -> str:
    """Queued rows exactly as ``run_insert_if_new`` writes them, numbered ``lo..hi``: params
    in the order ``queued_params`` gives. Ids are version 7, from each row's own time, as
    ``taskward.ids.new_id`` makes them."""
    p = d.p
    if d.name == "postgres":
        numbers = (
            f"SELECT n, {_uuid_sql(d)} AS id FROM generate_series({p}::bigint, {p}::bigint) AS n"
        )
        head = ""
    else:
        numbers = f"SELECT n, {_uuid_sql(d, 'x')} AS id FROM r"
        head = (
            f"WITH RECURSIVE g(n) AS (SELECT {p} UNION ALL SELECT n + 1 FROM g WHERE n < {p}), "
            "r AS MATERIALIZED (SELECT n, lower(hex(randomblob(16))) AS x FROM g) "
        )
    return (
        f"INSERT INTO schedule_runs ({ADMIT_COLUMNS}) {head}"
        f"SELECT {_uuid7_sql(d, 'us', 'id')}, NULL, NULL, '{{}}', kind, args{d.j}, 'queued', 0, "
        f"t, t, t, NULL, '[]', 'host', NULL, NULL, prefix || '-' || n, app_hash, 'library' FROM ("
        f"SELECT id, kind, args, app_hash, prefix, n, us, {d.seconds('us')} AS t FROM ("
        f"SELECT id, {p} AS kind, {p} AS args, {p} AS app_hash, {p} AS prefix, n, "
        f"({p} + n * {p}) AS us FROM ({numbers}) AS numbers) AS q0) AS q"
    )


def queued_params(
    backend: str, shape: Shape, prefix: str, t0_us: int, step_us: int, lo: int, hi: int
) -> tuple[Any, ...]:
    common = (shape.kind, shape.args_json, shape.application_hash, prefix, t0_us, step_us)
    # Placeholders appear in this order: [lo, hi (SQLite's CTE)], kind, args, hash, prefix, t0,
    # step, [lo, hi (PostgreSQL's generate_series)].
    if backend == "postgres":
        return (*common, lo, hi)
    return (lo, hi, *common)


def _uuid_sql(d: Dialect, hex_text: str = "", offset: int = 0) -> str:
    """A random version-4 UUID in its text form (what ``str(uuid.uuid4())`` gives).

    On SQLite it is cut from ``hex_text`` (at least ``offset + 32`` random hex digits, made once
    per row by a materialised CTE): 122 random bits, version 4, variant 10xx.
    """
    if d.name == "postgres":
        return "gen_random_uuid()::text"
    x, k = hex_text, offset
    return (
        f"substr({x}, {k + 1}, 8) || '-' || substr({x}, {k + 9}, 4) || '-4' || "
        f"substr({x}, {k + 13}, 3) || '-' || substr('89ab', 1 + (abs(random()) % 4), 1) || "
        f"substr({x}, {k + 16}, 3) || '-' || substr({x}, {k + 19}, 12)"
    )


def _uuid7_sql(d: Dialect, us: str, v4: str) -> str:
    """``v4`` (a version-4 UUID's text) made version 7 at the integer microseconds ``us``: 48
    bits of milliseconds, then its own random bits, as ``taskward.ids.new_id`` makes ids.

    Rows taskward writes carry time-ordered ids, so new index entries land together at one
    edge of each index; generated rows with random ids scattered the facts and events of new
    tasks across a history's indexes, and every such insert dirtied a page of its own (4 full
    page images per task in PostgreSQL's WAL after a checkpoint, none with taskward's ids).
    """
    if d.name == "postgres":
        millis = f"lpad(to_hex(({us}) / 1000), 12, '0')"
    else:
        millis = f"printf('%012x', ({us}) / 1000)"
    return f"substr({millis}, 1, 8) || '-' || substr({millis}, 9, 4) || '-7' || substr({v4}, 16)"


# The history: one temporary table of per-run values (ids and times, in microseconds), then one
# INSERT ... SELECT per table. Runs are numbered; run n is queued at t0 + n * step.
_GEN_TABLE = (
    "CREATE TEMP TABLE IF NOT EXISTS tw_gen (n BIGINT, run_id TEXT, f1 TEXT, f2 TEXT, e1 TEXT, "
    "e2 TEXT, o TEXT, w TEXT, q BIGINT, c BIGINT, s BIGINT, e BIGINT, sc BIGINT, f BIGINT)"
)
_GEN_WORKERS = "CREATE TEMP TABLE IF NOT EXISTS tw_gen_workers (i BIGINT PRIMARY KEY, w TEXT)"


def history_fill_sql(d: Dialect) -> str:
    """Fill tw_gen for runs lo..hi: params in the order ``history_fill_params`` gives."""
    p = d.p
    if d.name == "postgres":
        head = ""
        ids = ", ".join(f"{_uuid_sql(d)} AS u{i}" for i in range(6))
        numbers = (
            f"SELECT {p}::bigint AS t0, {p}::bigint AS step, n, {ids} "
            f"FROM generate_series({p}::bigint, {p}::bigint) AS n"
        )
    else:
        # One random hex string per run, materialised, cut into the run's six ids.
        head = (
            f"WITH RECURSIVE g(n) AS (SELECT {p} UNION ALL SELECT n + 1 FROM g WHERE n < {p}), "
            "r AS MATERIALIZED (SELECT n, lower(hex(randomblob(96))) AS x FROM g) "
        )
        ids = ", ".join(f"{_uuid_sql(d, 'x', 32 * i)} AS u{i}" for i in range(6))
        numbers = f"SELECT {p} AS t0, {p} AS step, n, {ids} FROM r"
    # c = claim, s = start, e = end of the task, sc = summary, f = completion fact.
    inner = (
        f"SELECT n, u0 AS run_id, u1 AS f1, u2 AS f2, u3 AS e1, u4 AS e2, u5 AS o, "
        f"t0 + n * step AS q, t0 + n * step + 50000 + {d.mod('n', '997')} AS c "
        f"FROM ({numbers}) AS numbers"
    )
    ran = f"701 + 2 * {d.mod('x.n', '450')}"
    done = f"c + 5000 + {ran} + 1600"  # the completion (its fact, event, notification)
    ids = ", ".join(
        _uuid7_sql(d, at, column)
        for column, at in (
            ("run_id", "q"),
            ("f1", "c"),
            ("f2", done),
            ("e1", "c"),
            ("e2", done),
            ("o", done),
        )
    )
    select = (
        f"SELECT x.n, {ids}, (SELECT wk.w FROM tw_gen_workers wk "
        f"WHERE wk.i = {d.mod('x.n', str(HISTORY_WORKERS))}), q, c, c + 5000, c + 5000 + {ran}, "
        f"c + 5000 + {ran} + 400, c + 5000 + {ran} + 1600 FROM ({inner}) AS x"
    )
    # SQLite takes the CTE between INSERT INTO t and its SELECT.
    return f"INSERT INTO tw_gen {head}{select}"


def history_fill_params(backend: str, t0_us: int, step_us: int, lo: int, hi: int) -> tuple:
    if backend == "postgres":
        return (t0_us, step_us, lo, hi)
    return (lo, hi, t0_us, step_us)


def history_insert_sql(d: Dialect) -> list[tuple[str, str]]:
    """(table, INSERT ... SELECT FROM tw_gen) per table; params (kind, args, hash, prefix)
    for runs, (kind,) for summaries, none for the others."""
    pieces = _json_pieces()

    def js(name: str, **subst: str) -> str:
        return _cat([subst.get(piece, piece) for piece in pieces[name]])

    sec = d.seconds
    p = d.p
    runs = (
        f"INSERT INTO schedule_runs ({_RUN_COLUMNS}) SELECT run_id, NULL, NULL, '{{}}', "
        f"kind, args{d.j}, 'completed', 0, NULL, 0, {sec('q')}, {sec('f')}, NULL, {sec('q')}, "
        f"{sec('f')}, 'completed', 'adapter completed', ({js('evidence')}){d.j}, {sec('q')}, w, "
        f"{sec(f'c + {LEASE_TTL_US}')}, NULL, 1, '[]', 'host', NULL, NULL, "
        f"prefix || '-' || n, app_hash, 'library', NULL, {sec(f'c + {TIMEOUT_US}')}, NULL, NULL "
        f"FROM tw_gen, (SELECT {p} AS kind, {p} AS args, {p} AS app_hash, {p} AS prefix) AS k"
    )
    claim_facts = (
        f"INSERT INTO status_transitions ({FACT_COLUMNS}) SELECT f1, 'schedule_run', run_id, "
        f"'queued', 'running', 'claimed', 'attempt 1', '[]', 'system', 'system:' || w, "
        f"{sec('c')}, '{{}}', 'claim:' || w || ':1', {d.sha(js('claim_request'))}, e1, "
        f"w || '/1' FROM tw_gen"
    )
    done_facts = (
        f"INSERT INTO status_transitions ({FACT_COLUMNS}) SELECT f2, 'schedule_run', run_id, "
        f"'running', 'completed', 'completed', 'adapter completed', ({js('evidence')}){d.j}, "
        f"'system', 'system:' || w, {sec('f')}, '{{}}', 'ack:' || w || '/1', "
        f"{d.sha(js('done_request'))}, e2, w || '/1' FROM tw_gen"
    )
    claim_events = (
        f"INSERT INTO task_events ({EVENT_COLUMNS}) SELECT e1, run_id, 'transition', f1, "
        f"'running', ({js('claim_payload')}){d.j}, {sec('c')} FROM tw_gen"
    )
    done_events = (
        f"INSERT INTO task_events ({EVENT_COLUMNS}) SELECT e2, run_id, 'transition', f2, "
        f"'completed', ({js('done_payload')}){d.j}, {sec('f')} FROM tw_gen"
    )
    body = js("summary", ms=d.ms("e - s"), iso_e=d.iso("e"), iso_s=d.iso("s"))
    summaries = (
        f"INSERT INTO task_summaries ({SUMMARY_COLUMNS}) SELECT run_id || ':1', run_id, 1, "
        f"'complete', body{d.j}, {d.sha('body')}, NULL, {sec('sc')}, {sec('sc')} FROM ("
        f"SELECT run_id, sc, {body} AS body FROM tw_gen, (SELECT {p} AS kind) AS k) AS b"
    )
    outbox = (
        f"INSERT INTO dispatch_outbox ({_OUTBOX_COLUMNS}) SELECT o, 'task_terminal', "
        f"'task-terminal:' || f2, run_id, f2, ({js('outbox_body')}){d.j}, 'pending', 0, 10, "
        f"{sec('f')}, NULL, NULL, '[]', NULL, {sec('f')}, {sec('f')}, NULL, "
        f"{sec('f')} + {OUTBOX_TTL_S} FROM tw_gen"
    )
    return [
        ("schedule_runs", runs),
        ("status_transitions", claim_facts),
        ("status_transitions", done_facts),
        ("task_events", claim_events),
        ("task_events", done_events),
        ("task_summaries", summaries),
        ("dispatch_outbox", outbox),
    ]


def _sqlite_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Loader:
    """One raw connection that writes generated rows in large transactions."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.d = _dialect(store.backend)
        self.conn: Any
        if store.backend == "sqlite":
            import sqlite3

            self.conn = sqlite3.connect(store.raw, isolation_level=None, timeout=60)
            self.conn.execute("PRAGMA synchronous=FULL")  # as SQLiteDB; commits are rare here
            self.conn.execute("PRAGMA cache_size=-1000000")  # 1 GB of page cache for the load
            self.conn.execute("PRAGMA temp_store=MEMORY")
            self.conn.create_function("tw_sha256", 1, _sqlite_sha256, deterministic=True)
        else:
            self.conn = psycopg.connect(store.raw, autocommit=True)
        self.seconds_by_table: dict[str, float] = {}

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, sql: str, params: Sequence[Any]) -> None:
        began = time.monotonic()
        self.conn.execute(sql, tuple(params))
        match = re.match(r"\s*(?:WITH .*?\) )?INSERT INTO (\w+)", sql, re.S)
        key = match.group(1) if match else "other"
        self.seconds_by_table[key] = self.seconds_by_table.get(key, 0.0) + (
            time.monotonic() - began
        )

    def _tx(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        if self.store.backend == "sqlite":
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    self._run(sql, params)
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            began = time.monotonic()
            self.conn.execute("COMMIT")
            self.seconds_by_table["commit"] = self.seconds_by_table.get("commit", 0.0) + (
                time.monotonic() - began
            )
        else:
            with self.conn.transaction():
                for sql, params in statements:
                    self._run(sql, params)

    def queued(
        self,
        shape: Shape,
        count: int,
        *,
        prefix: str,
        end_us: int | None = None,
        chunk: int = 100_000,
        label: str = "",
    ) -> int:
        """Insert ``count`` queued rows, queued ``QUEUED_STEP_US`` apart and ending at
        ``end_us`` (default now); returns the first row's ``queued_at`` in microseconds."""
        end = now_us() if end_us is None else end_us
        t0 = end - count * QUEUED_STEP_US
        sql = queued_sql(self.d)
        began = time.monotonic()
        done = 0
        while done < count:
            n = min(chunk, count - done)
            params = queued_params(
                self.store.backend, shape, prefix, t0, QUEUED_STEP_US, done, done + n - 1
            )
            self._tx([(sql, params)])
            done += n
            if count > chunk:
                rate = done / max(time.monotonic() - began, 1e-9)
                progress(f"    {label}queued rows {done:,}/{count:,} ({rate:,.0f} rows/s)")
        return t0

    def history(
        self,
        shape: Shape,
        runs: int,
        *,
        prefix: str,
        workers: Sequence[str],
        end_us: int | None = None,
        chunk: int = 100_000,
        label: str = "",
    ) -> int:
        """Insert ``runs`` completed runs with their audit trail (2 facts, 2 events, 1 summary,
        1 outbox row each) ending before ``end_us`` (default now minus a minute); returns the
        first run's ``queued_at`` in microseconds."""
        end = now_us() - 60_000_000 if end_us is None else end_us
        t0 = end - runs * HISTORY_STEP_US
        p = self.d.p
        setup = [
            (_GEN_TABLE, ()),
            (_GEN_WORKERS, ()),
            ("DELETE FROM tw_gen_workers", ()),
        ]
        setup += [
            (f"INSERT INTO tw_gen_workers (i, w) VALUES ({p}, {p})", (i, w))
            for i, w in enumerate(workers)
        ]
        self._tx(setup)
        fill = history_fill_sql(self.d)
        inserts = history_insert_sql(self.d)
        run_params = (shape.kind, shape.args_json, shape.application_hash, prefix)
        began = time.monotonic()
        done = 0
        while done < runs:
            n = min(chunk, runs - done)
            statements: list[tuple[str, Sequence[Any]]] = [
                ("DELETE FROM tw_gen", ()),
                (
                    fill,
                    history_fill_params(
                        self.store.backend, t0, HISTORY_STEP_US, done, done + n - 1
                    ),
                ),
            ]
            for table, sql in inserts:
                if table == "schedule_runs":
                    statements.append((sql, run_params))
                elif table == "task_summaries":
                    statements.append((sql, (shape.kind,)))
                else:
                    statements.append((sql, ()))
            statements.append(("DELETE FROM tw_gen", ()))
            self._tx(statements)
            done += n
            elapsed = time.monotonic() - began
            progress(
                f"    {label}history runs {done:,}/{runs:,} ({2 * done:,} facts; "
                f"{done / max(elapsed, 1e-9):,.0f} runs/s, {elapsed:.0f}s)"
            )
        return t0


# -- the shape check --------------------------------------------------------------------------

_ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?\+00:00")
_SHA = re.compile(r"sha256:[0-9a-f]{64}")
_MS_TEXT = re.compile(r'"elapsed_ms":[0-9.eE+-]+')
_TRAIL_QUERIES = {
    "schedule_runs": "SELECT * FROM schedule_runs WHERE id = ?",
    "status_transitions": (
        "SELECT * FROM status_transitions WHERE entity_id = ? ORDER BY created_at"
    ),
    "task_events": "SELECT * FROM task_events WHERE task_id = ? ORDER BY created_at",
    "task_summaries": "SELECT * FROM task_summaries WHERE task_id = ?",
    "dispatch_outbox": "SELECT * FROM dispatch_outbox WHERE schedule_run_id = ?",
}


def _trail(conn: Any, run_id: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for table, sql in _TRAIL_QUERIES.items():
        if isinstance(conn, psycopg.Connection):
            cur = conn.execute(sql.replace("?", "%s"), (run_id,))
        else:
            cur = conn.execute(sql, (run_id,))
        names = [c[0] for c in cur.description]
        out[table] = [
            {k: v for k, v in zip(names, row, strict=True) if k != "seq"} for row in cur.fetchall()
        ]
    return out


def _normalise(trail: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """The trail with its per-run values (ids, worker, key, times, hashes, elapsed) replaced by
    placeholders; what remains must be identical for a real and a generated run. JSON text
    (SQLite) is compared as text, so key order counts too."""
    run = trail["schedule_runs"][0]
    tokens: dict[str, str] = {run["id"]: "<run>", run["idempotency_key"]: "<key>"}
    if run.get("leased_by"):
        tokens[run["leased_by"]] = "<worker>"
    for i, fact in enumerate(trail["status_transitions"]):
        tokens[fact["id"]] = f"<fact{i}>"
    for i, event in enumerate(trail["task_events"]):
        tokens[event["id"]] = f"<event{i}>"
    for i, row in enumerate(trail["dispatch_outbox"]):
        tokens[row["id"]] = f"<outbox{i}>"
    ordered = sorted(tokens, key=len, reverse=True)

    def text(value: str) -> str:
        for token in ordered:
            value = value.replace(token, tokens[token])
        value = _MS_TEXT.sub('"elapsed_ms":<ms>', value)
        return _SHA.sub("<sha256>", _ISO.sub("<iso>", value))

    def walk(value: Any, key: str = "") -> Any:
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, float):
            return "<number>"
        if isinstance(value, int):
            return "<time>" if key.endswith("_at") else value
        if isinstance(value, str):
            return text(value)
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return text(str(value))

    return {
        table: [{k: walk(v, k) for k, v in row.items()} for row in rows]
        for table, rows in trail.items()
    }


def _hash_problems(trail: dict[str, list[dict[str, Any]]], shape: Shape) -> list[str]:
    """Recompute every hash of the trail with taskward's own functions."""
    from taskward.canonical import content_hash
    from taskward.models import Actor, StateReason, TransitionRequest
    from taskward.transitions import request_hash

    def parsed(value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value

    problems = []
    for run in trail["schedule_runs"]:
        if run["application_hash"] != shape.application_hash:
            problems.append(f"run {run['id']}: application_hash differs from submit_task's")
    for fact in trail["status_transitions"]:
        source, _, actor_id = fact["actor"].partition(":")
        request = TransitionRequest(
            entity_id=fact["entity_id"],
            from_state=fact["previous_status"],
            to_state=fact["status"],
            reason=StateReason(
                code=fact["reason_code"],
                summary=fact["reason_summary"] or "",
                evidence_refs=parsed(fact["evidence_refs"]) or [],
                metadata=parsed(fact["metadata"]) or {},
            ),
            actor=Actor(type=source, id=actor_id),  # type: ignore[arg-type]
            idempotency_key=fact["idempotency_key"],
        )
        if request_hash(request) != fact["request_hash"]:
            problems.append(f"fact {fact['id']}: request_hash is not the request's hash")
    for summary in trail["task_summaries"]:
        if content_hash(parsed(summary["summary"])) != summary["summary_hash"]:
            problems.append(f"summary {summary['session_key']}: summary_hash is not its hash")
    return problems


def _diff(real: Any, generated: Any, path: str = "") -> list[str]:
    if isinstance(real, dict) and isinstance(generated, dict):
        out = []
        for key in sorted(set(real) | set(generated)):
            out += _diff(real.get(key, "<absent>"), generated.get(key, "<absent>"), f"{path}.{key}")
        return out
    if isinstance(real, list) and isinstance(generated, list):
        if len(real) != len(generated):
            return [f"{path}: {len(real)} rows written by taskward, {len(generated)} generated"]
        return [
            m
            for i, (a, b) in enumerate(zip(real, generated, strict=True))
            for m in _diff(a, b, f"{path}[{i}]")
        ]
    return (
        [] if real == generated else [f"{path}: taskward wrote {real!r}, generated {generated!r}"]
    )


def shape_check(stores: Stores, backend: str, shape: Shape) -> dict[str, Any]:
    """Generated rows against rows taskward writes itself, on one small store."""
    store = stores.create(backend)
    try:
        real_done = admit_tasks(store, NOOP_KIND, {}, 2, key_prefix="real-done")
        drain_with_worker(store, 2, 4, stores.directory)
        real_queued = admit_tasks(store, NOOP_KIND, {}, 1, key_prefix="real-queued")
        with raw_connection(store) as conn:
            before = {r[0] for r in raw_rows(conn, "SELECT id FROM schedule_runs")}
        with Loader(store) as loader:
            loader.history(
                shape,
                2,
                prefix="gen-done",
                workers=history_workers("shape"),
                end_us=now_us(),
                label=f"[{backend}] shape check: ",
            )
            loader.queued(shape, 1, prefix="gen-queued")
        with raw_connection(store) as conn:
            rows = raw_rows(conn, "SELECT id, status FROM schedule_runs")
            generated = {
                status: [i for i, s in rows if s == status and i not in before]
                for status in ("completed", "queued")
            }
            pairs = [
                (real_done[0], generated["completed"][0]),
                (real_done[1], generated["completed"][1]),
                (real_queued[0], generated["queued"][0]),
            ]
            problems: list[str] = []
            checked = 0
            for real_id, gen_id in pairs:
                real, gen = _trail(conn, real_id), _trail(conn, gen_id)
                problems += [f"taskward's run: {p}" for p in _hash_problems(real, shape)]
                problems += [f"generated run: {p}" for p in _hash_problems(gen, shape)]
                problems += _diff(_normalise(real), _normalise(gen))
                checked += sum(len(v) for v in gen.values())
        audit = audit_mixed(store)
    finally:
        stores.remove(store)
    progress(
        f"[{backend:8}] shape check: {checked} generated rows against taskward's own, "
        + (
            "identical up to ids, times and hashes; every hash recomputes"
            if not problems
            else f"{len(problems)} DIFFERENCES: " + "; ".join(problems[:5])
        )
    )
    return {"rows_compared": checked, "problems": problems, "audit": audit.as_dict()}


# -- the audit --------------------------------------------------------------------------------

_MIXED_AUDIT_SQL = (
    AUDIT_CTES
    + """,
o AS (
  SELECT schedule_run_id, count(*) AS n FROM dispatch_outbox GROUP BY schedule_run_id)
SELECT r.status, count(*),
  sum(CASE
    WHEN r.status = 'queued' THEN
      CASE WHEN f.n IS NULL AND e.n IS NULL AND s.n IS NULL AND o.n IS NULL
                AND r.leased_by IS NULL AND r.lease_attempts = 0 THEN 0 ELSE 1 END
    WHEN r.status = 'running' THEN
      CASE WHEN f.n = 1 AND f.claims = 1 AND e.n = 1 AND e.transitions = 1 AND s.n IS NULL
                AND o.n IS NULL AND r.leased_by IS NOT NULL AND r.lease_attempts = 1
           THEN 0 ELSE 1 END
    WHEN r.status = 'completed' THEN
      CASE WHEN f.n = 2 AND f.claims = 1 AND f.completions = 1 AND e.n = 2
                AND e.transitions = 2 AND s.n = 1 AND s.complete = 1 AND o.n = 1
           THEN 0 ELSE 1 END
    ELSE 1 END),
  sum(coalesce(f.n, 0)), sum(coalesce(e.n, 0)), sum(coalesce(s.n, 0)), sum(coalesce(o.n, 0))
FROM schedule_runs r
LEFT JOIN f ON f.entity_id = r.id
LEFT JOIN e ON e.task_id = r.id
LEFT JOIN s ON s.task_id = r.id
LEFT JOIN o ON o.schedule_run_id = r.id
GROUP BY r.status
"""
)

_MIXED_LINKS_SQL = """
SELECT
  (SELECT count(*) FROM task_events ev WHERE ev.kind = 'transition' AND NOT EXISTS (
     SELECT 1 FROM status_transitions t WHERE t.id = ev.transition_id
       AND t.entity_id = ev.task_id AND t.status = ev.status AND t.event_id = ev.id)),
  (SELECT count(*) FROM task_summaries su JOIN schedule_runs r ON r.id = su.task_id
     WHERE su.session_key <> r.id || ':' || CAST(r.lease_attempts AS TEXT)),
  (SELECT count(*) FROM dispatch_outbox ob
     WHERE ob.dedup_key <> 'task-terminal:' || ob.transition_id OR NOT EXISTS (
       SELECT 1 FROM status_transitions t WHERE t.id = ob.transition_id
       AND t.entity_id = ob.schedule_run_id AND t.status = 'completed')),
  (SELECT count(*) FROM status_transitions t
     WHERE NOT EXISTS (SELECT 1 FROM schedule_runs r WHERE r.id = t.entity_id))
  + (SELECT count(*) FROM task_events ev
     WHERE NOT EXISTS (SELECT 1 FROM schedule_runs r WHERE r.id = ev.task_id))
  + (SELECT count(*) FROM task_summaries su
     WHERE su.task_id IS NULL OR NOT EXISTS (SELECT 1 FROM schedule_runs r WHERE r.id = su.task_id))
"""


@dataclass
class MixedAudit:
    """Every run of a store checked against what its status demands: ``queued`` — no fact,
    event, summary or notification and no lease; ``running`` (claimed by the claim loop) —
    exactly its claim fact and event; ``completed`` — exactly 2 facts (queued -> running ->
    completed), 2 transition events linked to them, 1 complete summary keyed
    ``<id>:<attempt>`` and 1 outbox notification of its terminal fact. Any other status, and any
    audit row of a run that does not exist, is a violation."""

    by_status: dict[str, int]
    rows_by_status: dict[str, dict[str, int]]
    violations: list[str]
    seconds: float

    def per_completed_task(self) -> dict[str, float]:
        n = self.by_status.get("completed", 0) or 1
        rows = self.rows_by_status.get("completed", {})
        out = {k: rows.get(k, 0) / n for k in ("facts", "events", "summaries", "outbox")}
        out["audit_rows"] = out["facts"] + out["events"] + out["summaries"]
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "by_status": self.by_status,
            "rows_by_status": self.rows_by_status,
            "per_completed_task": self.per_completed_task(),
            "violations": self.violations,
            "seconds": round(self.seconds, 1),
        }


def audit_mixed(store: Store, expected: dict[str, int] | None = None) -> MixedAudit:
    began = time.monotonic()
    with raw_connection(store) as conn:
        if store.backend == "postgres":
            conn.execute("SET work_mem = '256MB'")  # the history's aggregates fit in memory
        rows = raw_rows(conn, _MIXED_AUDIT_SQL)
        unlinked, bad_keys, bad_outbox, orphans = (
            int(v or 0) for v in raw_rows(conn, _MIXED_LINKS_SQL)[0]
        )
    by_status = {str(r[0]): int(r[1]) for r in rows}
    bad = {str(r[0]): int(r[2] or 0) for r in rows}
    rows_by_status = {
        str(r[0]): {
            "facts": int(r[3]),
            "events": int(r[4]),
            "summaries": int(r[5]),
            "outbox": int(r[6]),
        }
        for r in rows
    }
    violations = [
        f"{n} {status} runs whose audit rows differ from what {status} demands"
        for status, n in bad.items()
        if n
    ]
    for status, want in (expected or {}).items():
        if by_status.get(status, 0) != want:
            violations.append(f"{by_status.get(status, 0)} {status} runs, expected {want}")
    checks = [
        (unlinked, f"{unlinked} transition events not linked to their fact"),
        (bad_keys, f"{bad_keys} summaries not keyed <task-id>:<attempt>"),
        (bad_outbox, f"{bad_outbox} notifications not keyed by a completion fact of their run"),
        (orphans, f"{orphans} audit rows for runs that do not exist"),
    ]
    violations += [text for failed, text in checks if failed]
    return MixedAudit(by_status, rows_by_status, violations, time.monotonic() - began)


# -- drains and claims ------------------------------------------------------------------------


def _count_done_since(conn: Any, since_s: float) -> int:
    # (status, created_at, id) index: only this batch's completed rows are counted.
    return int(
        raw_value(
            conn,
            "SELECT count(*) FROM schedule_runs WHERE status = 'completed' AND created_at >= ?",
            (since_s,),
        )
    )


def drain_batch(
    store: Store, count: int, concurrency: int, log_dir: Path, *, since_s: float
) -> dict[str, Any]:
    """Time ONE burst worker until ``count`` runs queued at or after ``since_s`` are completed;
    a worker that is still busy then (a deeper queue) is stopped with SIGTERM and drains."""
    timeout_s = max(900.0, count / 10.0)
    with raw_connection(store) as conn:
        worker = WorkerProcess(store, concurrency=concurrency, burst=True, log_dir=log_dir)
        wal_before = _pg_wal(conn)
        with worker:
            deadline = time.monotonic() + timeout_s
            while True:
                done = _count_done_since(conn, since_s)
                seen = time.monotonic()
                if done >= count or seen >= deadline or worker.poll() is not None:
                    break
                time.sleep(0.05)
            wall_s = seen - worker.spawned_mono
            io = _process_io(worker.pid)
            wal_after = _pg_wal(conn)
            exit_code = worker.wait(3.0)
            stopped = exit_code is None
            if stopped:
                exit_code = worker.stop(60.0)
            stats = worker.reported()
        batch = (
            "FROM schedule_runs r JOIN status_transitions t ON t.entity_id = r.id "
            "WHERE r.created_at >= ? "
        )
        first_claim = raw_value(
            conn, f"SELECT min(t.created_at) {batch} AND t.status = 'running'", (since_s,)
        )
        nth_end = raw_value(
            conn,
            f"SELECT t.created_at {batch} AND t.status = 'completed' "
            "ORDER BY t.created_at LIMIT 1 OFFSET ?",
            (since_s, count - 1),
        )
    span_s = float(nth_end) - float(first_claim) if first_claim and nth_end else float("nan")
    return {
        "count": count,
        "completed": done,
        "wall_s": wall_s,
        "per_s": min(done, count) / wall_s if wall_s > 0 else 0.0,
        "span_s": span_s,
        "span_per_s": count / span_s if span_s == span_s and span_s > 0 else float("nan"),
        "startup_s": float(first_claim) - worker.spawned_at if first_claim else float("nan"),
        "stopped_with_sigterm": stopped,
        "exit_code": exit_code,
        "worker": stats,
        "io_per_task": _io_per_task(io, wal_before, wal_after, done),
    }


def _process_io(pid: int) -> dict[str, int]:
    """The process's storage I/O so far (``/proc/<pid>/io``: bytes that reached the block layer
    or the page cache's write-back): on SQLite the worker's own WAL and database writes."""
    try:
        with open(f"/proc/{pid}/io") as f:
            pairs = (line.split(":") for line in f)
            return {
                k.strip(): int(v)
                for k, v in pairs
                if k.strip() in ("read_bytes", "write_bytes", "wchar")
            }
    except OSError:
        return {}


def _pg_wal(conn: Any) -> dict[str, int]:
    """The server's WAL position and full-page-image count (whole cluster: other sessions'
    writes count too), or nothing on SQLite."""
    if not isinstance(conn, psycopg.Connection):
        return {}
    lsn = raw_value(conn, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
    fpi = raw_value(conn, "SELECT wal_fpi FROM pg_stat_wal")
    return {"wal_bytes": int(lsn), "wal_fpi": int(fpi)}


def _io_per_task(
    io: dict[str, int], wal_before: dict[str, int], wal_after: dict[str, int], tasks: int
) -> dict[str, float]:
    n = max(tasks, 1)
    out = {f"worker_{k}": v / n for k, v in io.items()}
    out.update({k: (wal_after[k] - wal_before[k]) / n for k in wal_before if k in wal_after})
    return out


def claim_loop(store: Store, count: int) -> dict[str, Any]:
    """``claim_rows`` in this process, 20 rows a pass, until ``count`` rows are claimed. The
    leases last a day (so no worker's reaper takes the rows back before the audit); the rows
    stay ``running`` with their claim fact and event."""
    from taskward.claims import WorkerSpec, claim_rows, new_worker_id

    registry = taskward.build_registry(taskward.AdapterConfig(imports=(TASKS_MODULE,)))
    spec = WorkerSpec(worker_id=new_worker_id(), kinds=tuple(registry.kinds()), lease_ttl=86400.0)

    async def run() -> tuple[int, int, float]:
        async with taskward.open_db(store.url) as db:
            claimed = passes = 0
            began = time.monotonic()
            while claimed < count:
                got = await claim_rows(db, spec, limit=min(20, count - claimed))
                if not got:
                    break
                claimed += len(got)
                passes += 1
            return claimed, passes, time.monotonic() - began

    with raw_connection(store) as conn:
        io_before, wal_before = _process_io(os.getpid()), _pg_wal(conn)
        claimed, passes, seconds = asyncio.run(run())
        io_after, wal_after = _process_io(os.getpid()), _pg_wal(conn)
    io = {k: io_after[k] - io_before[k] for k in io_before if k in io_after}
    return {
        "count": count,
        "claimed": claimed,
        "passes": passes,
        "seconds": seconds,
        "per_s": claimed / seconds if seconds > 0 else 0.0,
        "io_per_claim": _io_per_task(io, wal_before, wal_after, claimed),
    }


# -- planner check ----------------------------------------------------------------------------


# The claim statements as they were before migration 0005, run by ``--explain`` beside the
# current ones to show what the change does on the same store.
FORMER_STATEMENTS = {
    "postgres": {
        "run_claim_page": (
            "SELECT id, queued_at, action_kind, execution_target, required_capabilities, "
            "concurrency_key, lease_attempts, CASE WHEN jsonb_typeof(action_args -> 'timeout_s') "
            "= 'number' THEN (action_args ->> 'timeout_s')::float8 END AS timeout_s "
            "FROM schedule_runs WHERE status = 'queued' AND lease_attempts < %(max_attempts)s "
            "AND cancel_requested_at IS NULL "
            "AND action_kind IN (SELECT jsonb_array_elements_text(%(kinds)s::jsonb)) "
            "AND (%(cursor_queued_at)s::float8 IS NULL "
            "OR (queued_at, id) > (%(cursor_queued_at)s::float8, %(cursor_id)s::text)) "
            "ORDER BY queued_at, id LIMIT %(page_size)s"
        ),
        "run_lock_candidates": (
            "SELECT id FROM schedule_runs WHERE id IN "
            "(SELECT jsonb_array_elements_text(%(ids)s::jsonb)) AND status = 'queued' "
            "FOR UPDATE SKIP LOCKED"
        ),
    },
    "sqlite": {
        "run_lock_candidates": (
            "SELECT id FROM schedule_runs WHERE id IN (SELECT value FROM json_each(:ids)) "
            "AND status = 'queued'"
        ),
    },
}


_PLAN_NODE = re.compile(
    r"(Limit|Index|Seq Scan|Bitmap|Sort|Nested Loop|Hash|LockRows|Result|Function Scan|"
    r"Aggregate|ProjectSet|Subquery Scan|Incremental Sort|Merge|Materialize)"
)


def _numbered(sql: str) -> tuple[str, list[str]]:
    """psycopg's ``%(name)s`` binds as ``$1..$n`` for a server-side PREPARE."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, sql).replace("%%", "%"), names


def _pg_explain(conn: Any, sql: str, params: dict[str, Any], mode: str) -> dict[str, Any]:
    """EXPLAIN ANALYZE of ``sql`` prepared on the server with a forced custom or generic plan;
    auto_explain adds the plans of the statements run inside a function."""
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    prepared, names = _numbered(sql)
    conn.execute(f"SET plan_cache_mode = force_{mode}_plan")
    conn.execute(f"PREPARE tw_explain AS {prepared}")
    literal = ", ".join("NULL" if params[n] is None else f"'{params[n]}'" for n in names)
    began = time.monotonic()
    plan = [
        r[0] for r in conn.execute(f"EXPLAIN (ANALYZE) EXECUTE tw_explain({literal})").fetchall()
    ]
    ms = (time.monotonic() - began) * 1000
    conn.execute("DEALLOCATE tw_explain")
    nested: list[str] = []
    for note in notices:  # "duration: ... plan:", "Query Text: <sql>", then the plan's lines
        lines = note.splitlines()
        starts = [i for i, line in enumerate(lines) if _PLAN_NODE.match(line)]
        if starts and "FROM schedule_runs" in note and "taskward_claim_lock_page" not in note:
            nested = lines[starts[0] :]
    return {"ms": ms, "plan": plan, "nested_plan": nested}


def explain_claim(store: Store) -> dict[str, Any]:
    """The plans of the claim pass's statements on this store, as a worker runs them (the first
    candidate page, which locks 20 of its rows on PostgreSQL, inside a rolled-back transaction),
    beside the statements before migration 0005 (page, then a lock of 20 of its ids). On
    PostgreSQL both the custom plan and the generic plan a prepared statement ends up with;
    SQLite's plan and the statement's time."""
    from taskward.store.queries import load_queries

    registry = taskward.build_registry(taskward.AdapterConfig(imports=(TASKS_MODULE,)))
    kinds = json.dumps(sorted(set(registry.kinds())))
    page: dict[str, Any] = {
        "max_attempts": 3,  # the former statement's ceiling (R18: today's reads the row's own)
        "now": time.time(),  # R16: the rows due by now (every row the benchmark queued)
        "kinds": kinds,
        "targets": json.dumps(["host"]),
        "capabilities": "[]",
        "soft": json.dumps(["warmed-cache"]),
        "held": "[]",
        "cursor_rank": None,
        "cursor_queued_at": None,
        "cursor_id": None,
        "page_size": 50,
        "lock": 20,
    }
    queries = load_queries(store.backend)
    former = FORMER_STATEMENTS[store.backend]
    out: dict[str, Any] = {}
    if store.backend == "sqlite":
        import sqlite3

        conn = sqlite3.connect(store.raw, isolation_level=None)
        try:
            ids = [r[0] for r in conn.execute(queries["run_claim_page"], page).fetchall()]
            lock = {"ids": json.dumps(ids[:20])}
            statements = [("run_claim_page", queries["run_claim_page"], page)] + [
                (f"{name} (before 0005)", sql, lock) for name, sql in former.items()
            ]
            for name, sql, params in statements:
                plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
                began = time.monotonic()
                conn.execute(sql, params).fetchall()
                out[name] = {"plan": plan, "ms": (time.monotonic() - began) * 1000}
        finally:
            conn.close()
        return out
    with psycopg.connect(store.raw) as conn:
        ids = [r[0] for r in conn.execute(queries["run_claim_page"], page).fetchall()]
        conn.rollback()
        try:  # the plan inside taskward_claim_lock_page (superuser, or auto_explain preloaded)
            conn.execute("LOAD 'auto_explain'")
            for setting in (
                "log_min_duration = 0",
                "log_nested_statements = on",
                "log_analyze = on",
                "log_level = notice",
            ):
                conn.execute(f"SET auto_explain.{setting}")
            conn.commit()
        except psycopg.Error:
            conn.rollback()
        lock = {"ids": json.dumps(ids[:20])}
        statements = [
            ("run_claim_page", queries["run_claim_page"], page),
            ("run_claim_page (before 0005)", former["run_claim_page"], page),
            ("run_lock_candidates (before 0005)", former["run_lock_candidates"], lock),
        ]
        for name, sql, params in statements:
            out[name] = {
                mode: _pg_explain(conn, sql, params, mode) for mode in ("custom", "generic")
            }
            conn.rollback()
    return out


def _plan_summary(explained: dict[str, Any]) -> str:
    parts = []
    for name, entry in explained.items():
        if "plan" in entry:
            parts.append(f"{name} {entry['ms']:.1f} ms: {' / '.join(entry['plan'])}")
            continue
        for mode, plan in entry.items():
            lines = plan["nested_plan"] or plan["plan"]
            top = [
                " ".join(line.split())
                for line in lines
                if line.strip().startswith("->") or line == lines[0]
            ]
            short = [re.sub(r"\s*\(cost=[^)]*\)", "", line) for line in top[:4]]
            parts.append(f"{name} ({mode}) {plan['ms']:.1f} ms: {' | '.join(short)}")
    return "\n      ".join(parts)


def store_size(store: Store) -> dict[str, Any]:
    if store.backend == "sqlite":
        path = Path(store.raw)
        wal = path.with_name(path.name + "-wal")
        return {"bytes": path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)}
    with raw_connection(store) as conn:
        rows = raw_rows(
            conn,
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind = 'r'",
        )
    tables = {str(name): int(size) for name, size in rows}
    return {"bytes": sum(tables.values()), "tables": tables}


# -- measurements -----------------------------------------------------------------------------


def settle(store: Store) -> None:
    """Write what a load left in memory to disk before anything is timed: a queue or a history
    that built up over days would not have gigabytes of dirty pages waiting to be flushed
    (PostgreSQL: a CHECKPOINT; SQLite: a WAL checkpoint; then sync(2) for the OS cache)."""
    with raw_connection(store) as conn:
        if store.backend == "postgres":
            # Needs superuser (or pg_checkpoint); the OS sync below runs either way.
            with contextlib.suppress(psycopg.Error):
                conn.execute("CHECKPOINT")
        else:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    os.sync()


def _load_queued(store: Store, shape: Shape, count: int, *, prefix: str, label: str) -> float:
    """Queue ``count`` generated rows; returns their first ``created_at`` (epoch seconds)."""
    with Loader(store) as loader:
        first = loader.queued(shape, count, prefix=prefix, label=label) / 1_000_000
    settle(store)
    return first


def measure_queue(
    stores: Stores,
    backend: str,
    depth: str,
    queued: int,
    repeat: int,
    shape: Shape,
    args: argparse.Namespace,
) -> dict[str, Any]:
    label = f"[{backend:8} repeat {repeat + 1}] {depth:7} "
    store = stores.create(backend)
    try:
        began = time.monotonic()
        since = _load_queued(store, shape, queued, prefix=f"q{repeat}", label=label)
        load_s = time.monotonic() - began
        if args.analyze:
            analyze_store(store)
        explained = explain_claim(store) if args.explain else None
        drain = drain_batch(store, args.count, args.concurrency, stores.directory, since_s=since)
        completed = drain_completed(store, since)
        audit = audit_mixed(store, {"queued": queued - completed, "completed": completed})
    finally:
        stores.remove(store)
    if drain["completed"] < args.count:
        audit.violations.append(f"only {drain['completed']} of {args.count} tasks completed")
    if drain["exit_code"] != 0:
        audit.violations.append(f"the worker exited with {drain['exit_code']}")
    result = {
        "backend": backend,
        "repeat": repeat,
        "depth": depth,
        "queued": queued,
        "load_s": load_s,
        "drain": drain,
        "audit": audit.as_dict(),
        "explain": explained,
    }
    progress(
        f"{label}{queued:>9,} queued (loaded in {load_s:.0f}s): {args.count:,} drained in "
        f"{drain['wall_s']:.2f}s = {drain['per_s']:.0f}/s (steady {drain['span_per_s']:.0f}/s, "
        f"startup {drain['startup_s']:.2f}s"
        + (", then SIGTERM" if drain["stopped_with_sigterm"] else "")
        + f"); {_io_text(drain)}; audit {audit.by_status}"
        + (f"  VIOLATIONS: {'; '.join(audit.violations)}" if audit.violations else "  ok")
    )
    if explained:
        progress(f"      {_plan_summary(explained)}")
    return result


def _io_text(drain: dict[str, Any]) -> str:
    io = drain.get("io_per_task", {})
    if "wal_bytes" in io:
        return f"WAL {io['wal_bytes'] / 1024:.1f} KiB/task, {io['wal_fpi']:.2f} full pages/task"
    if "worker_write_bytes" in io:
        return f"worker writes {io['worker_write_bytes'] / 1024:.1f} KiB/task"
    return "no I/O figures"


def drain_completed(store: Store, since_s: float) -> int:
    with raw_connection(store) as conn:
        return _count_done_since(conn, since_s)


def measure_history_side(
    stores: Stores,
    backend: str,
    side: str,
    store: Store,
    repeat: int,
    shape: Shape,
    args: argparse.Namespace,
) -> dict[str, Any]:
    label = f"[{backend:8} repeat {repeat + 1}] {side:7} "
    since = _load_queued(store, shape, args.count, prefix=f"d{repeat}", label=label)
    if args.analyze:
        analyze_store(store)
    explained = explain_claim(store) if args.explain else None
    drain = drain_batch(store, args.count, args.concurrency, stores.directory, since_s=since)
    _load_queued(store, shape, args.claim_count, prefix=f"c{repeat}", label=label)
    claims = claim_loop(store, args.claim_count)
    problems = []
    if drain["completed"] < args.count:
        problems.append(f"only {drain['completed']} of {args.count} tasks completed")
    if drain["exit_code"] != 0:
        problems.append(f"the worker exited with {drain['exit_code']}")
    if claims["claimed"] < args.claim_count:
        problems.append(f"only {claims['claimed']} of {args.claim_count} rows claimed")
    progress(
        f"{label}drain {args.count:,} in {drain['wall_s']:.2f}s = {drain['per_s']:.0f}/s "
        f"(steady {drain['span_per_s']:.0f}/s; {_io_text(drain)}); claim loop "
        f"{claims['claimed']:,} in {claims['seconds']:.2f}s = {claims['per_s']:.0f} claims/s "
        f"({claims['passes']} passes)"
    )
    if explained:
        progress(f"      {_plan_summary(explained)}")
    return {
        "backend": backend,
        "repeat": repeat,
        "side": side,
        "drain": drain,
        "claims": claims,
        "explain": explained,
        "problems": problems,
    }


def run_history(
    stores: Stores, backend: str, shape: Shape, args: argparse.Namespace
) -> dict[str, Any]:
    history = stores.create(backend)
    out: dict[str, Any] = {"backend": backend, "runs": []}
    try:
        progress(
            f"[{backend:8}] history: {args.history_runs:,} completed runs, "
            f"{2 * args.history_runs:,} facts"
        )
        began = time.monotonic()
        with Loader(history) as loader:
            loader.history(
                shape,
                args.history_runs,
                prefix="hist",
                workers=history_workers(f"{backend}-history"),
                label=f"[{backend:8}] ",
            )
            out["load_seconds_by_table"] = {
                k: round(v, 1) for k, v in loader.seconds_by_table.items()
            }
        _register_history_workers(history)
        settle(history)
        out["load_s"] = time.monotonic() - began
        out["size"] = store_size(history)
        progress(
            f"[{backend:8}] history loaded in {out['load_s']:.0f}s, "
            f"{out['size']['bytes'] / 2**30:.2f} GiB"
        )
        for repeat in range(args.repeat):
            sides = ["none", "history"] if repeat % 2 == 0 else ["history", "none"]
            for side in sides:
                if side == "history":
                    out["runs"].append(
                        measure_history_side(stores, backend, side, history, repeat, shape, args)
                    )
                    continue
                empty = stores.create(backend)
                try:
                    run = measure_history_side(stores, backend, side, empty, repeat, shape, args)
                    audit = audit_mixed(
                        empty, {"completed": args.count, "running": args.claim_count}
                    )
                finally:
                    stores.remove(empty)
                run["audit"] = audit.as_dict()
                if audit.violations:
                    progress(
                        f"[{backend:8} repeat {repeat + 1}] none    VIOLATIONS: {audit.violations}"
                    )
                out["runs"].append(run)
        progress(
            f"[{backend:8}] auditing the history store (every run, {args.history_runs:,} + "
            f"{args.repeat * (args.count + args.claim_count):,})..."
        )
        expected = {
            "completed": args.history_runs + args.repeat * args.count,
            "running": args.repeat * args.claim_count,
        }
        audit = audit_mixed(history, expected)
        out["audit"] = audit.as_dict()
        progress(
            f"[{backend:8}] history audit in {audit.seconds:.0f}s: {audit.by_status}"
            + (f"  VIOLATIONS: {'; '.join(audit.violations)}" if audit.violations else "  ok")
        )
    finally:
        stores.remove(history)
    return out


def _register_history_workers(store: Store) -> None:
    """The history's workers have heartbeat rows, as workers that ran and stopped leave them
    (written by taskward's own heartbeat, dated at the end of the history)."""
    from taskward.worker import register_heartbeat

    registry = taskward.build_registry(taskward.AdapterConfig(imports=(TASKS_MODULE,)))
    workers = history_workers(f"{store.backend}-history")

    async def run() -> None:
        async with taskward.open_db(store.url) as db:
            for worker_id in workers:
                await register_heartbeat(
                    db,
                    worker_id=worker_id,
                    now=time.time() - 60.0,
                    served_kinds=registry.kinds(),
                    concurrency=16,
                )

    asyncio.run(run())


# -- command line and report ------------------------------------------------------------------


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--goals", default="queue,history", help="queue, history or both")
    parser.add_argument(
        "--count", type=int, default=None, help="tasks drained per measurement (10,000)"
    )
    parser.add_argument(
        "--shallow", type=int, default=None, help="queued rows, shallow store (10,000)"
    )
    parser.add_argument(
        "--deep", type=int, default=None, help="queued rows, deep store (1,000,000)"
    )
    parser.add_argument(
        "--history-runs",
        type=int,
        default=None,
        help="completed runs in the history store, 2 facts each (5,000,000 = 10,000,000 facts)",
    )
    parser.add_argument(
        "--claim-count", type=int, default=None, help="rows claimed by the claim loop (5,000)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=16, help="the worker's --concurrency (16)"
    )
    parser.add_argument(
        "--repeat", type=int, default=None, help="interleaved repeats; medians shown (3)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1,000 tasks, deep 100,000, history 100,000 runs, 1,000 claims, 1 repeat",
    )
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--sqlite-dir", type=Path, default=None, help="where SQLite files go")
    parser.add_argument(
        "--analyze",
        action="store_true",
        help="ANALYZE every store after loading (taskward never does)",
    )
    parser.add_argument(
        "--explain", action="store_true", help="print the claim statements' plans on every store"
    )
    parser.add_argument("--skip-shape-check", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--json-out", type=Path, default=None, help="also write the JSON object to this file"
    )
    args = parser.parse_args(argv)
    quick = {
        "count": 1000,
        "shallow": 1000,
        "deep": 100_000,
        "history_runs": 100_000,
        "claim_count": 1000,
        "repeat": 1,
    }
    full = {
        "count": 10_000,
        "shallow": 10_000,
        "deep": 1_000_000,
        "history_runs": 5_000_000,
        "claim_count": 5000,
        "repeat": 3,
    }
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.backends = _csv(args.backends)
    args.goals = _csv(args.goals)
    if set(args.backends) - set(BACKENDS):
        parser.error(f"unknown backends {sorted(set(args.backends) - set(BACKENDS))}")
    if set(args.goals) - set(GOALS):
        parser.error(
            f"unknown goals {sorted(set(args.goals) - set(GOALS))}; allowed: queue, history"
        )
    if args.count > args.shallow:
        parser.error("--count cannot exceed --shallow: both stores must hold the tasks drained")
    if min(args.count, args.concurrency, args.repeat, args.claim_count, args.history_runs) < 1:
        parser.error("sizes, --concurrency and --repeat must be positive")
    return args


def _fmt(value: float, spec: str = ".0f") -> str:
    return "-" if value != value else format(value, spec)


def _med(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return median(values) if values else float("nan")


def summarise_queue(runs: list[dict[str, Any]], backends: list[str]) -> list[dict[str, Any]]:
    out = []
    for backend in backends:
        mine = [r for r in runs if r["backend"] == backend]
        if not mine:
            continue
        row: dict[str, Any] = {"backend": backend}
        for depth in ("shallow", "deep"):
            these = [r for r in mine if r["depth"] == depth]
            row[depth] = {
                "queued": these[0]["queued"] if these else 0,
                "per_s": _med([r["drain"]["per_s"] for r in these]),
                "span_per_s": _med([r["drain"]["span_per_s"] for r in these]),
                "startup_s": _med([r["drain"]["startup_s"] for r in these]),
                "samples": [round(r["drain"]["per_s"], 1) for r in these],
                "per_completed_task": these[-1]["audit"]["per_completed_task"] if these else {},
            }
        row["ratio"] = row["deep"]["per_s"] / row["shallow"]["per_s"]
        row["span_ratio"] = row["deep"]["span_per_s"] / row["shallow"]["span_per_s"]
        pairs = [
            a["drain"]["per_s"] / b["drain"]["per_s"]
            for a in mine
            if a["depth"] == "deep"
            for b in mine
            if b["depth"] == "shallow" and b["repeat"] == a["repeat"]
        ]
        row["ratio_range"] = [min(pairs), max(pairs)] if pairs else []
        row["met"] = row["ratio"] >= GOAL_QUEUE_RATIO
        out.append(row)
    return out


def summarise_history(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for result in results:
        runs = result["runs"]
        row: dict[str, Any] = {"backend": result["backend"], "history_runs": None}
        for side in ("none", "history"):
            these = [r for r in runs if r["side"] == side]
            row[side] = {
                "drain_per_s": _med([r["drain"]["per_s"] for r in these]),
                "drain_span_per_s": _med([r["drain"]["span_per_s"] for r in these]),
                "claims_per_s": _med([r["claims"]["per_s"] for r in these]),
                "drain_samples": [round(r["drain"]["per_s"], 1) for r in these],
                "claim_samples": [round(r["claims"]["per_s"], 1) for r in these],
            }
        row["drain_ratio"] = row["history"]["drain_per_s"] / row["none"]["drain_per_s"]
        row["drain_span_ratio"] = (
            row["history"]["drain_span_per_s"] / row["none"]["drain_span_per_s"]
        )
        row["claim_ratio"] = row["history"]["claims_per_s"] / row["none"]["claims_per_s"]
        for key, metric in (
            ("drain", lambda r: r["drain"]["per_s"]),
            ("claim", lambda r: r["claims"]["per_s"]),
        ):
            pairs = [
                metric(a) / metric(b)
                for a in runs
                if a["side"] == "history"
                for b in runs
                if b["side"] == "none" and b["repeat"] == a["repeat"]
            ]
            row[f"{key}_ratio_range"] = [min(pairs), max(pairs)] if pairs else []
        row["met"] = min(row["drain_ratio"], row["claim_ratio"]) >= GOAL_HISTORY_RATIO
        row["load_s"] = result.get("load_s")
        row["size_bytes"] = result.get("size", {}).get("bytes")
        row["per_completed_task"] = result.get("audit", {}).get("per_completed_task", {})
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stores = Stores(args.pg_url, args.sqlite_dir, prefix="depth")
    context: dict[str, Any] = {**machine_description(), **code_version()}
    shape = noop_shape()
    shape_checks: dict[str, Any] = {}
    queue_runs: list[dict[str, Any]] = []
    history_results: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        if "postgres" in args.backends:
            context["postgres"] = stores.pg_version()
            with psycopg.connect(args.pg_url, autocommit=True) as conn:
                for name in ("autovacuum", "shared_buffers", "synchronous_commit", "jit"):
                    context[f"pg_{name}"] = conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
        if not args.skip_shape_check:
            for backend in args.backends:
                shape_checks[backend] = shape_check(stores, backend, shape)
        if "queue" in args.goals:
            for repeat in range(args.repeat):
                for backend in args.backends:
                    depths = [("shallow", args.shallow), ("deep", args.deep)]
                    if repeat % 2 == 1:
                        depths.reverse()
                    for depth, queued in depths:
                        queue_runs.append(
                            measure_queue(stores, backend, depth, queued, repeat, shape, args)
                        )
        if "history" in args.goals:
            for backend in args.backends:
                history_results.append(run_history(stores, backend, shape, args))
    finally:
        stores.close()
        context["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
        context["minutes"] = round((time.monotonic() - started) / 60, 1)

    queue = summarise_queue(queue_runs, args.backends)
    history = summarise_history(history_results)
    for row in history:
        row["history_runs"] = args.history_runs
    violations = [f"shape check {b}: {p}" for b, c in shape_checks.items() for p in c["problems"]]
    violations += [
        f"shape check {b} audit: {v}"
        for b, c in shape_checks.items()
        for v in c["audit"]["violations"]
    ]
    violations += [
        f"queue {r['backend']} {r['depth']} repeat {r['repeat'] + 1}: {v}"
        for r in queue_runs
        for v in r["audit"]["violations"]
    ]
    for result in history_results:
        violations += [
            f"history {result['backend']} store: {v}" for v in result["audit"]["violations"]
        ]
        for r in result["runs"]:
            violations += [
                f"history {r['backend']} {r['side']} repeat {r['repeat'] + 1}: {v}"
                for v in r.get("audit", {}).get("violations", []) + r["problems"]
            ]
    parts = [
        f"ONE `taskward worker --burst --quiet --concurrency {args.concurrency}` drains "
        f"{args.count:,} {NOOP_KIND} tasks, timed from spawn until the {args.count:,}th "
        "completion is seen (50 ms polls)"
    ]
    if "queue" in args.goals:
        parts.append(
            f"queue: fresh stores holding {args.shallow:,} and {args.deep:,} queued rows (a deep "
            "store's worker is stopped with SIGTERM afterwards)"
        )
    if "history" in args.goals:
        parts.append(
            f"history: a fresh empty store against one holding {args.history_runs:,} completed "
            f"runs ({2 * args.history_runs:,} facts), each also measured with a claim loop "
            f"(taskward.claims.claim_rows, 20 a pass) of {args.claim_count:,} rows"
        )
    parts.append(
        "rows generated in SQL with taskward's own columns, JSON and hashes (shape-checked); "
        f"medians of {args.repeat} interleaved repeats"
        + ("; ANALYZE after every load" if args.analyze else "; no ANALYZE (taskward runs none)")
    )
    method = "; ".join(parts)
    report = {
        "benchmark": "depth",
        "method": method,
        "context": context,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "shape_checks": shape_checks,
        "queue": queue,
        "history": history,
        "violations": violations,
        "queue_runs": queue_runs,
        "history_results": history_results,
    }
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(report, indent=2, default=str))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 1 if violations else 0
    print(f"depth benchmark: {method}")
    print("context: " + ", ".join(f"{k} {v}" for k, v in context.items()))
    if queue:
        print()
        print(
            render_table(
                [
                    "backend",
                    "shallow queued",
                    "tasks/s",
                    "deep queued",
                    "tasks/s",
                    "ratio",
                    "range",
                    "steady shallow",
                    "steady deep",
                    "steady ratio",
                    f"goal >= {GOAL_QUEUE_RATIO}x",
                ],
                [
                    [
                        r["backend"],
                        f"{r['shallow']['queued']:,}",
                        _fmt(r["shallow"]["per_s"]),
                        f"{r['deep']['queued']:,}",
                        _fmt(r["deep"]["per_s"]),
                        _fmt(r["ratio"], ".2f") + "x",
                        " to ".join(_fmt(v, ".2f") for v in r["ratio_range"]),
                        _fmt(r["shallow"]["span_per_s"]),
                        _fmt(r["deep"]["span_per_s"]),
                        _fmt(r["span_ratio"], ".2f") + "x",
                        "met" if r["met"] else "MISSED",
                    ]
                    for r in queue
                ],
            )
        )
        print(
            "  tasks/s: spawn -> the Nth completion seen; steady: first claim fact -> Nth "
            "completion fact; range: deep/shallow within one repeat"
        )
    if history:
        print()
        print(
            render_table(
                [
                    "backend",
                    "history facts",
                    "drain none",
                    "drain history",
                    "ratio",
                    "range",
                    "steady ratio",
                    "claims/s none",
                    "claims/s history",
                    "ratio",
                    "range",
                    f"goal >= {GOAL_HISTORY_RATIO}x",
                ],
                [
                    [
                        r["backend"],
                        f"{2 * r['history_runs']:,}",
                        _fmt(r["none"]["drain_per_s"]),
                        _fmt(r["history"]["drain_per_s"]),
                        _fmt(r["drain_ratio"], ".2f") + "x",
                        " to ".join(_fmt(v, ".2f") for v in r["drain_ratio_range"]),
                        _fmt(r["drain_span_ratio"], ".2f") + "x",
                        _fmt(r["none"]["claims_per_s"]),
                        _fmt(r["history"]["claims_per_s"]),
                        _fmt(r["claim_ratio"], ".2f") + "x",
                        " to ".join(_fmt(v, ".2f") for v in r["claim_ratio_range"]),
                        "met" if r["met"] else "MISSED",
                    ]
                    for r in history
                ],
            )
        )
        for r in history:
            print(
                f"  {r['backend']}: history loaded in {_fmt(r['load_s'] or float('nan'))}s, "
                f"store {(r['size_bytes'] or 0) / 2**30:.2f} GiB"
            )
    print()
    rows = [
        [
            f"queue {r['backend']}",
            *(
                _fmt(r["shallow"]["per_completed_task"].get(k, float("nan")), ".2f")
                for k in ("facts", "events", "summaries", "outbox")
            ),
        ]
        for r in queue
    ]
    rows += [
        [
            f"history {r['backend']}",
            *(
                _fmt(r["per_completed_task"].get(k, float("nan")), ".2f")
                for k in ("facts", "events", "summaries", "outbox")
            ),
        ]
        for r in history
    ]
    if rows:
        print(
            render_table(
                ["store", "facts/task", "events/task", "summaries/task", "outbox/task"], rows
            )
        )
        print(
            "  rows per completed task (history: every run of the store, generated ones included)"
        )
    return report_violations(violations)


if __name__ == "__main__":
    sys.exit(main())
