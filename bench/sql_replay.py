"""SQLite's own share of a drain: the exact statements a worker ran, replayed without taskward.

A per-layer budget for the SQLite drain goal (issue 7), measured rather than estimated. One
in-process drain (``bench/inprocess.py``'s: a ``WorkerRuntime`` over N admitted no-op tasks)
runs on a connection that records every statement it executes, with its parameters, in order.
The same statements are then replayed on a copy of the store as it was before the drain, by
the bare ``sqlite3`` module in a tight loop (same pragmas, every result read to its end), and
timed: what SQLite itself spends on exactly taskward's writes and reads, with no Python layer
above the driver. ``COMMIT`` is timed apart (the worker runs it on a thread, beside the loop).

The replay must reproduce the drain: every ``UPDATE`` guard must match again and the replayed
store must hold what the drained one holds (runs by status, facts, events, summaries); any
difference is a violation (exit 1). So does a failed audit of the drained store.

Usage::

    .venv/bin/python bench/sql_replay.py [--count 10000] [--concurrency 128] [--repeat 3]

It prints one JSON line: the drain's tasks/s and CPU a task, the replay's statement time a
task (apart from COMMIT, and COMMIT), statement calls and executions a task, and the
violations. With
``bench/host_overhead.py`` (the host alone) it bounds what a drain can reach: a worker cannot
spend less a task than the host's own cost plus SQLite's statements.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sqlite3
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # bench._common, after PYTHONPATH

from bench._common import Stores, audit_store, machine_description, progress
from bench.inprocess import admit_noops, drain_noops, noop_registry

# (method, sql, parameters): method "execute" (parameters a mapping or a sequence) or
# "executemany" (a list of parameter sequences).
Call = tuple[str, str, Any]


class RecordingConnection(sqlite3.Connection):
    """A ``sqlite3.Connection`` that appends every statement it runs to ``calls``. The COMMIT
    arrives from the store's commit thread; a list append is atomic under the GIL."""

    calls: list[Call]

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        self.calls.append(("execute", sql, parameters))
        return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        rows = list(parameters)
        self.calls.append(("executemany", sql, rows))
        return super().executemany(sql, rows)


@contextlib.contextmanager
def recording(calls: list[Call]) -> Iterator[None]:
    """While inside, ``sqlite3.connect`` makes recording connections (the worker's store opens
    its one connection here); restored on the way out."""
    original = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = original(*args, factory=RecordingConnection, **kwargs)
        assert isinstance(conn, RecordingConnection)
        conn.calls = calls
        return conn

    sqlite3.connect = connect  # type: ignore[assignment]
    try:
        yield
    finally:
        sqlite3.connect = original


async def admit(url: str, count: int) -> None:
    import taskward

    registry = noop_registry()
    async with taskward.open_db(url) as db:
        await admit_noops(db, registry, count, "replay")


async def drain(url: str, count: int, concurrency: int, calls: list[Call]) -> dict[str, float]:
    """``bench/inprocess.py``'s drain, its store on a recording connection: ``calls`` ends
    holding the statements run from the worker's start to the ``count``-th completion."""
    import taskward

    registry = noop_registry()
    marker: list[int] = []
    with recording(calls):
        db = await taskward.open_db(url)
    try:
        wall, cpu = await drain_noops(
            db,
            registry,
            count,
            concurrency,
            # The open's own statements (pragmas, the migration check) are not the drain's ...
            started=lambda runtime: calls.clear(),
            # ... nor are the shutdown's (the heartbeat's removal).
            finished=lambda runtime: marker.append(len(calls)),
        )
    finally:
        await db.close()
    del calls[marker[0] :]
    return {"tasks_per_s": count / wall, "cpu_us": cpu / count * 1e6}


# What is replayed: the drain's statements except the store's wake-up poll, which only reads a
# counter (``PRAGMA data_version``) and runs on a timer, not per task.
def _replayed(call: Call) -> bool:
    return not call[1].lstrip().upper().startswith("PRAGMA")


def replay(path: Path, calls: Sequence[Call], synchronous: str) -> dict[str, Any]:
    """Run ``calls`` on the store at ``path`` with the bare driver: the seconds spent in
    statements other than COMMIT and in COMMITs, and by statement (its first words) the
    seconds and executions."""
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=0)
    conn.execute("PRAGMA journal_mode=WAL").fetchone()
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA temp_store=MEMORY")
    seconds: Counter[str] = Counter()
    executions: Counter[str] = Counter()
    perf = time.perf_counter
    try:
        for method, sql, params in calls:
            t = perf()
            if method == "executemany":
                conn.executemany(sql, params)
            else:
                conn.execute(sql, params).fetchall()
            name = statement_name(sql)
            seconds[name] += perf() - t
            executions[name] += len(params) if method == "executemany" else 1
    finally:
        conn.close()
    return {
        "statements_s": sum(v for k, v in seconds.items() if k != "COMMIT"),
        "commits_s": seconds["COMMIT"],
        "by_statement": {k: (v, executions[k]) for k, v in seconds.items()},
    }


def statement_name(sql: str) -> str:
    """A statement's first words without its comments: enough to tell the drain's apart
    (``UPDATE ... WITH v(g_id, g_status, g_lease_attempts`` is a claim, ``... g_leased_by`` a
    completion)."""
    words = " ".join(
        line for line in sql.splitlines() if not line.lstrip().startswith("--")
    ).split()
    return " ".join(words)[:72]


_STATE = (
    ("runs by status", "SELECT status, count(*) FROM schedule_runs GROUP BY status ORDER BY 1"),
    ("facts", "SELECT count(*) FROM status_transitions"),
    ("events", "SELECT count(*) FROM task_events"),
    ("summaries", "SELECT state, count(*) FROM task_summaries GROUP BY state ORDER BY 1"),
    ("leases", "SELECT sum(lease_attempts) FROM schedule_runs"),
)


def store_state(path: Path) -> dict[str, Any]:
    with contextlib.closing(sqlite3.connect(str(path))) as conn:
        return {name: conn.execute(sql).fetchall() for name, sql in _STATE}


def checkpoint(path: Path) -> None:
    """Fold the WAL into the main file, so a copy of the file alone is the whole store."""
    with contextlib.closing(sqlite3.connect(str(path), isolation_level=None)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


def one_run(stores: Stores, count: int, concurrency: int) -> dict[str, Any]:
    store = stores.create("sqlite")
    path = Path(store.handle)
    snapshot = path.with_name(path.stem + "-before.db")
    try:
        asyncio.run(admit(store.url, count))
        checkpoint(path)
        shutil.copyfile(path, snapshot)
        calls: list[Call] = []
        try:
            import uvloop  # the CLI's worker runs on uvloop where it is installed

            loop_factory: Any = uvloop.new_event_loop
        except ImportError:
            loop_factory = None
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            drained = runner.run(drain(store.url, count, concurrency, calls))
        audit = audit_store(store, count)
        replayed_calls = [call for call in calls if _replayed(call)]
        replayed = replay(snapshot, replayed_calls, "FULL")
        violations = list(audit.violations)
        drained_state, replayed_state = store_state(path), store_state(snapshot)
        if drained_state != replayed_state:
            violations.append(
                f"the replay differs from the drain: {replayed_state} vs {drained_state}"
            )
        executed = sum(len(c[2]) if c[0] == "executemany" else 1 for c in replayed_calls)
        return {
            "tasks_per_s": drained["tasks_per_s"],
            "drain_cpu_us": drained["cpu_us"],
            "sql_us": replayed["statements_s"] / count * 1e6,
            "commit_us": replayed["commits_s"] / count * 1e6,
            "by_statement": {
                name: (secs / count * 1e6, n / count)
                for name, (secs, n) in replayed["by_statement"].items()
            },
            "calls_per_task": len(replayed_calls) / count,
            "executions_per_task": executed / count,
            "commits_per_task": sum(1 for c in replayed_calls if c[1] == "COMMIT") / count,
            "violations": violations,
        }
    finally:
        stores.remove(store)
        for suffix in ("", "-wal", "-shm"):
            Path(str(snapshot) + suffix).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000, help="tasks drained (10,000)")
    parser.add_argument("--concurrency", type=int, default=128, help="host slots (128)")
    parser.add_argument("--repeat", type=int, default=3, help="runs; medians shown (3)")
    args = parser.parse_args(argv)
    if args.count < 1 or args.repeat < 1 or args.concurrency < 1:
        parser.error("--count, --concurrency and --repeat must be at least 1")
    stores = Stores("postgresql://unused", None, "replay")
    runs = []
    try:
        for i in range(args.repeat):
            result = one_run(stores, args.count, args.concurrency)
            progress(
                f"[{i + 1}/{args.repeat}] drain {result['tasks_per_s']:,.0f}/s, "
                f"{result['drain_cpu_us']:.0f} us CPU a task; replay: statements "
                f"{result['sql_us']:.1f} us a task, COMMIT {result['commit_us']:.1f} us; "
                f"{len(result['violations'])} violation(s)"
            )
            runs.append(result)
    finally:
        stores.close()
    keys = ("tasks_per_s", "drain_cpu_us", "sql_us", "commit_us")
    summary: dict[str, Any] = {k: round(statistics.median(r[k] for r in runs), 1) for k in keys}
    last = runs[-1]
    summary.update(
        {
            k: round(last[k], 2)
            for k in (
                "calls_per_task",
                "executions_per_task",
                "commits_per_task",
            )
        }
    )
    summary["by_statement_us_per_task"] = sorted(
        (
            {"us": round(us, 1), "executions": round(n, 2), "statement": name}
            for name, (us, n) in last["by_statement"].items()
            if us >= 0.05
        ),
        key=lambda entry: -entry["us"],
    )
    summary["repeats"] = [{k: round(r[k], 1) for k in keys} for r in runs]
    violations = [v for r in runs for v in r["violations"]]
    summary["violations"] = violations
    summary["count"], summary["concurrency"] = args.count, args.concurrency
    summary["load"] = machine_description().get("loadavg_1m_at_start")
    print(json.dumps(summary))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
