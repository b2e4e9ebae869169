"""Resident host concurrency and memory: ``taskward worker`` running tasks that each await 50 ms.

Concurrency: for each ``--concurrency`` level (default 1, 8, 32) N ``bench.sleep`` tasks (an
async ``@taskward.task`` awaiting ``asyncio.sleep(0.05)``; 200 at 1, 2,000 at 8 and 32) are
admitted untimed, then ONE ``taskward worker --burst --quiet --concurrency C`` process is timed
from just before its spawn until every row is seen ``completed`` (50 ms polls). The ideal is
``C / 0.05 s`` tasks per second; the table shows the rate from spawn (process start-up
included) and the steady rate (first claim fact to last completion fact) beside it. Each drain
ends with the same audit check as ``bench/worker.py``.

Memory: an idle worker (``--concurrency 32``) is started; once its heartbeat row exists and it
has idled a few seconds its VmRSS is read from ``/proc/<pid>/status``; then 10,000 no-op tasks
are submitted while it runs, and once all are completed and it has idled ~2 s, VmRSS is read
again.

Usage: .venv/bin/python bench/host.py [--quick] [--levels 1,8,32] [--backends sqlite,postgres]
                                     [--memory-count N] [--repeat R] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Run as a file (`python bench/x.py`) or as a module (`python -m bench.x`): either way the
# repository root is on the path and the shared helpers import as `bench._common`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._common import (
    DEFAULT_PG_URL,
    Stores,
    WorkerProcess,
    admit_tasks,
    audit_store,
    code_version,
    drain_with_worker,
    machine_description,
    median,
    progress,
    raw_connection,
    read_rss_mb,
    render_table,
    report_violations,
    wait_for_completed,
    wait_for_heartbeat,
)

SLEEP_KIND = "bench.sleep"
SLEEP_S = 0.05
NOOP_KIND = "bench.noop"
BACKENDS = ("sqlite", "postgres")
DEFAULT_COUNTS = {1: 200, 8: 2000, 32: 2000}
QUICK_COUNTS = {1: 50, 8: 500, 32: 500}
DEFAULT_MEMORY_COUNT = 10000
QUICK_MEMORY_COUNT = 2000
MEMORY_CONCURRENCY = 32
IDLE_BEFORE_S = 3.0
IDLE_AFTER_S = 2.0
GOAL_LEVEL = 32
GOAL_IDEAL_FRACTION = 0.8
GOAL_MEMORY_GROWTH = 0.2


def count_for(level: int, quick: bool) -> int:
    table = QUICK_COUNTS if quick else DEFAULT_COUNTS
    if level in table:
        return table[level]
    return max(level * (12 if quick else 50), 50)  # ~0.6 s / 2.5 s of ideal work


@dataclass
class LevelRun:
    backend: str
    concurrency: int
    repeat: int
    count: int
    ideal_per_s: float
    wall_s: float = 0.0
    per_s: float = 0.0
    span_s: float = 0.0
    span_per_s: float = 0.0
    startup_s: float = 0.0
    reported_s: float | None = None
    audit_per_task: dict[str, float] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)


@dataclass
class MemoryRun:
    backend: str
    concurrency: int
    count: int
    idle_mb: float = 0.0
    after_mb: float = 0.0
    peak_mb: float = 0.0
    growth: float = 0.0
    drain_s: float = 0.0
    violations: list[str] = field(default_factory=list)


def measure_level(stores: Stores, backend: str, level: int, repeat: int, count: int) -> LevelRun:
    run = LevelRun(backend, level, repeat, count, ideal_per_s=level / SLEEP_S)
    store = stores.create(backend)
    try:
        ids = admit_tasks(
            store, SLEEP_KIND, {"seconds": SLEEP_S}, count, key_prefix=f"host-{level}-{repeat}"
        )
        drain = drain_with_worker(store, count, level, stores.directory)
        audit = audit_store(store, count)
    finally:
        stores.remove(store)
    run.wall_s, run.per_s = drain.wall_s, drain.per_s
    run.span_s, run.span_per_s = drain.span_s, drain.span_per_s
    run.startup_s, run.reported_s = drain.startup_s, drain.reported_s
    run.audit_per_task = audit.per_task()
    run.violations += audit.violations
    if len(set(ids)) != count:
        run.violations.append(f"{len(set(ids))} distinct ids for {count} tasks")
    if drain.exit_code != 0:
        run.violations.append(f"worker exited with {drain.exit_code}")
    progress(
        f"[{backend:8} concurrency {level:>3} repeat {repeat + 1}] {count} x {SLEEP_S * 1000:.0f}"
        f" ms in {drain.wall_s:6.2f}s = {drain.per_s:6.1f}/s ({drain.per_s / run.ideal_per_s:.0%}"
        f" of {run.ideal_per_s:.0f}/s; steady {drain.span_per_s:.1f}/s = "
        f"{drain.span_per_s / run.ideal_per_s:.0%}, startup {drain.startup_s:.2f}s)"
        + (f"  VIOLATIONS: {'; '.join(run.violations)}" if run.violations else "  ok")
    )
    return run


def measure_memory(stores: Stores, backend: str, count: int) -> MemoryRun:
    run = MemoryRun(backend, MEMORY_CONCURRENCY, count)
    store = stores.create(backend)
    try:
        with raw_connection(store) as conn:
            worker = WorkerProcess(
                store, concurrency=MEMORY_CONCURRENCY, burst=False, log_dir=stores.directory
            )
            with worker:
                wait_for_heartbeat(conn, worker)
                time.sleep(IDLE_BEFORE_S)
                run.idle_mb = read_rss_mb(worker.pid)["VmRSS"]
                began = time.monotonic()
                admit_tasks(store, NOOP_KIND, {}, count, key_prefix=f"mem-{uuid.uuid4().hex[:6]}")
                completed, seen = wait_for_completed(conn, count, worker=worker, timeout_s=1800)
                run.drain_s = seen - began
                time.sleep(IDLE_AFTER_S)
                if worker.poll() is not None:
                    run.violations.append(f"worker exited early with {worker.poll()}")
                else:
                    rss = read_rss_mb(worker.pid)
                    run.after_mb, run.peak_mb = rss["VmRSS"], rss.get("VmHWM", 0.0)
        audit = audit_store(store, count)
    finally:
        stores.remove(store)
    if completed != count:
        run.violations.append(f"{completed} of {count} tasks completed")
    run.violations += audit.violations
    run.growth = (run.after_mb - run.idle_mb) / run.idle_mb if run.idle_mb else float("nan")
    progress(
        f"[{backend:8} memory concurrency {MEMORY_CONCURRENCY}] idle {run.idle_mb:.1f} MiB, after "
        f"{count} tasks {run.after_mb:.1f} MiB ({run.growth:+.1%}), peak {run.peak_mb:.1f} MiB; "
        f"submit+drain {run.drain_s:.1f}s"
        + (f"  VIOLATIONS: {'; '.join(run.violations)}" if run.violations else "  ok")
    )
    return run


def _csv(kind: type, text: str) -> list[Any]:
    return [kind(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,8,32", help="worker --concurrency values")
    parser.add_argument(
        "--quick", action="store_true", help="smaller counts (50/500/500 tasks, 2,000 for memory)"
    )
    parser.add_argument("--count", type=int, default=None, help="tasks per level (all levels)")
    parser.add_argument("--memory-count", type=int, default=None, help="tasks for the memory run")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--repeat", type=int, default=1, help="runs per level; medians shown")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--sqlite-dir", type=Path, default=None)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    args.levels = _csv(int, args.levels)
    args.backends = _csv(str, args.backends)
    unknown = set(args.backends) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends {sorted(unknown)}; allowed: sqlite, postgres")
    if args.repeat < 1 or any(level < 1 for level in args.levels):
        parser.error("--repeat and --levels must be positive")
    if args.memory_count is None:
        args.memory_count = QUICK_MEMORY_COUNT if args.quick else DEFAULT_MEMORY_COUNT
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stores = Stores(args.pg_url, args.sqlite_dir, prefix="host")
    context = {**machine_description(), **code_version()}
    levels: list[LevelRun] = []
    memory: list[MemoryRun] = []
    try:
        if "postgres" in args.backends:
            context["postgres"] = stores.pg_version()
        for repeat in range(args.repeat):
            for backend in args.backends:
                for level in args.levels:
                    count = args.count or count_for(level, args.quick)
                    levels.append(measure_level(stores, backend, level, repeat, count))
        if not args.skip_memory:
            for backend in args.backends:
                memory.append(measure_memory(stores, backend, args.memory_count))
    finally:
        stores.close()
        context["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)

    results = []
    for backend in args.backends:
        for level in args.levels:
            mine = [r for r in levels if (r.backend, r.concurrency) == (backend, level)]
            per_s = median([r.per_s for r in mine])
            span = median([r.span_per_s for r in mine])
            ideal = level / SLEEP_S
            results.append(
                {
                    "backend": backend,
                    "concurrency": level,
                    "count": mine[0].count,
                    "per_s": per_s,
                    "ideal_per_s": ideal,
                    "of_ideal": per_s / ideal,
                    "steady_per_s": span,
                    "steady_of_ideal": span / ideal,
                    "wall_s": median([r.wall_s for r in mine]),
                    "startup_s": median([r.startup_s for r in mine]),
                    "samples": [round(r.per_s, 1) for r in mine],
                }
            )
    violations = [
        f"{r.backend} concurrency {r.concurrency} repeat {r.repeat + 1}: {v}"
        for r in levels
        for v in r.violations
    ]
    violations += [f"{m.backend} memory: {v}" for m in memory for v in m.violations]
    goal: dict[str, Any] = {}
    for r in results:
        if r["concurrency"] == GOAL_LEVEL:
            goal.setdefault(r["backend"], {}).update(
                of_ideal=r["of_ideal"],
                steady_of_ideal=r["steady_of_ideal"],
                ideal_met=r["of_ideal"] >= GOAL_IDEAL_FRACTION,
                steady_ideal_met=r["steady_of_ideal"] >= GOAL_IDEAL_FRACTION,
            )
    for m in memory:
        goal.setdefault(m.backend, {}).update(
            memory_growth=m.growth, memory_met=m.growth < GOAL_MEMORY_GROWTH
        )
    method = (
        f"{SLEEP_KIND} tasks (async @taskward.task awaiting {SLEEP_S * 1000:.0f} ms) admitted "
        "untimed, then ONE `taskward worker --burst --quiet --concurrency C` timed from spawn "
        "until every row is seen completed (50 ms polls); ideal = C / 0.05 s; steady = first "
        "claim fact -> last completion fact. Memory: VmRSS of an idle `--concurrency "
        f"{MEMORY_CONCURRENCY}` worker after its heartbeat + {IDLE_BEFORE_S:.0f} s idle, then "
        f"after {args.memory_count} no-op tasks + {IDLE_AFTER_S:.0f} s idle. Fresh migrated store "
        f"per measurement; median of {args.repeat} run(s)."
    )
    if args.json:
        print(
            json.dumps(
                {
                    "benchmark": "host",
                    "method": method,
                    "context": context,
                    "quick": args.quick,
                    "results": results,
                    "memory": [asdict(m) for m in memory],
                    "goal": goal,
                    "violations": violations,
                    "runs": [asdict(r) for r in levels],
                },
                indent=2,
            )
        )
        return 1 if violations else 0
    print(f"host benchmark: {method}")
    print("context: " + ", ".join(f"{k} {v}" for k, v in context.items()))
    print()
    print(
        render_table(
            [
                "backend",
                "concurrency",
                "tasks",
                "tasks/s",
                "ideal/s",
                "% of ideal",
                "wall s",
                "startup s",
                "steady/s",
                "steady %",
            ],
            [
                [
                    r["backend"],
                    str(r["concurrency"]),
                    str(r["count"]),
                    f"{r['per_s']:.1f}",
                    f"{r['ideal_per_s']:.0f}",
                    f"{r['of_ideal']:.0%}",
                    f"{r['wall_s']:.2f}",
                    f"{r['startup_s']:.2f}",
                    f"{r['steady_per_s']:.1f}",
                    f"{r['steady_of_ideal']:.0%}",
                ]
                for r in results
            ],
        )
    )
    print(
        "  tasks/s: from worker spawn (start-up included); steady: first claim fact -> last "
        "completion fact"
    )
    if memory:
        print()
        print(
            render_table(
                ["backend", "concurrency", "tasks", "idle MiB", "after MiB", "growth", "peak MiB"],
                [
                    [
                        m.backend,
                        str(m.concurrency),
                        str(m.count),
                        f"{m.idle_mb:.1f}",
                        f"{m.after_mb:.1f}",
                        f"{m.growth:+.1%}",
                        f"{m.peak_mb:.1f}",
                    ]
                    for m in memory
                ],
            )
        )
    print()
    for backend, verdict in goal.items():
        parts = []
        if "of_ideal" in verdict:
            parts.append(
                f">= {GOAL_IDEAL_FRACTION:.0%} of ideal at {GOAL_LEVEL}: {verdict['of_ideal']:.0%} "
                + ("met" if verdict["ideal_met"] else "NOT met")
                + f" (steady {verdict['steady_of_ideal']:.0%} "
                + ("met" if verdict["steady_ideal_met"] else "NOT met")
                + ")"
            )
        if "memory_growth" in verdict:
            parts.append(
                f"memory growth < {GOAL_MEMORY_GROWTH:.0%}: {verdict['memory_growth']:+.1%} "
                + ("met" if verdict["memory_met"] else "NOT met")
            )
        print(f"goal {backend}: " + "; ".join(parts))
    return report_violations(violations)


if __name__ == "__main__":
    sys.exit(main())
