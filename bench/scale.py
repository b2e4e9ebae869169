"""Scale-out on a latency-bound workload: one ``taskward worker`` process against two.

Each task is ``bench.sleep`` with ``{"seconds": 0.005}`` (an async ``@taskward.task`` awaiting
5 ms). For each process count P (``--processes``, default 1 and 2) and each per-process
concurrency C (``--concurrency``, default 2), P ``taskward worker --quiet --concurrency C``
processes are started on a fresh store and left idle until every one has its heartbeat row; then
``--count`` tasks are admitted in one ``submit_tasks`` call (untimed), and the clock runs from
that call's return until the last task's completion fact (the store's clock; polled every 20 ms).
The ideal is ``P * C / 0.005 s``. Goal (issue 7): 2 processes at least 1.6x one.

The table also shows each process's CPU (``/proc/<pid>/stat``) per task and as a share of one
core, and the whole machine's busy share during the run: a workload is latency-bound while a
process's share stays well below one core. Each store ends with the audit of
``bench/worker.py``: every task completed with exactly 2 facts, 2 events and 1 summary.

Usage: .venv/bin/python bench/scale.py [--count N] [--concurrency 1,2,4] [--processes 1,2]
                                      [--repeat R] [--quick] [--backends sqlite,postgres] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Run as a file (`python bench/x.py`) or as a module (`python -m bench.x`): either way the
# repository root is on the path and the shared helpers import as `bench._common`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._common import (
    DEFAULT_PG_URL,
    TASKS_MODULE,
    Store,
    Stores,
    WorkerProcess,
    audit_store,
    code_version,
    ensure_repo_on_path,
    machine_description,
    median,
    progress,
    raw_connection,
    raw_rows,
    raw_value,
    render_table,
    report_violations,
    wait_for_heartbeat,
)

ensure_repo_on_path()

import taskward  # noqa: E402 - after the repository root is on sys.path

SLEEP_KIND = "bench.sleep"
BACKENDS = ("sqlite", "postgres")
GOAL_RATIO = 1.6
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` so far (``/proc/<pid>/stat`` fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from ``/proc/stat``."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


@dataclass
class Run:
    backend: str
    processes: int
    concurrency: int
    repeat: int
    count: int
    seconds: float = 0.0  # submit_tasks returned -> last completion fact (store clock)
    per_s: float = 0.0
    poll_seconds: float = 0.0  # submit_tasks returned -> all completed seen by the 20 ms poll
    span_per_s: float = 0.0  # first claim fact -> last completion fact
    admit_s: float = 0.0
    cpu_s: list[float] = field(default_factory=list)  # per worker process, during the run
    completed_by: list[int] = field(default_factory=list)  # tasks each process completed
    machine_busy: float = 0.0  # share of all CPUs busy during the run (everyone's work)
    audit: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    @property
    def ideal_per_s(self) -> float:
        return self.processes * self.concurrency / 0.005


def admit_sleeps(store: Store, count: int, seconds: float, prefix: str) -> float:
    """``count`` sleep tasks through ``taskward.submit_tasks`` (chunks of 10,000, each one
    transaction); returns the time it took."""
    registry = taskward.build_registry(taskward.AdapterConfig(imports=(TASKS_MODULE,)))

    async def run() -> None:
        async with taskward.open_db(store.url) as db:
            for start in range(0, count, 10_000):
                apps = [
                    taskward.TaskApplication(
                        action_kind=SLEEP_KIND,
                        args={"seconds": seconds},
                        execution_target="host",
                        idempotency_key=f"{prefix}-{i}",
                    )
                    for i in range(start, min(count, start + 10_000))
                ]
                await taskward.submit_tasks(db, apps, registry=registry)

    began = time.monotonic()
    asyncio.run(run())
    return time.monotonic() - began


def measure(stores: Stores, run: Run, sleep_s: float) -> None:
    store = stores.create(run.backend)
    workers = [
        WorkerProcess(store, concurrency=run.concurrency, burst=False, log_dir=stores.directory)
        for _ in range(run.processes)
    ]
    try:
        with raw_connection(store) as conn:
            for worker in workers:
                worker.start()
            for worker in workers:
                wait_for_heartbeat(conn, worker)
            time.sleep(0.5)  # past every worker's first (empty) claim pass
            cpu_before = [cpu_seconds(w.pid) for w in workers]
            busy_before = machine_ticks()
            run.admit_s = admit_sleeps(store, run.count, sleep_s, f"scale-{run.repeat}")
            admitted_at = time.time()
            admitted_mono = time.monotonic()
            deadline = admitted_mono + max(600.0, run.count / 10.0)
            while True:
                done = int(
                    raw_value(conn, "SELECT count(*) FROM schedule_runs WHERE status = 'completed'")
                )
                if done >= run.count or time.monotonic() > deadline:
                    break
                if any(w.poll() is not None for w in workers):
                    run.violations.append("a worker exited during the run")
                    break
                time.sleep(0.02)
            run.poll_seconds = time.monotonic() - admitted_mono
            cpu_after = [cpu_seconds(w.pid) for w in workers]
            busy_after = machine_ticks()
            for worker in workers:
                code = worker.stop()
                if code != 0:
                    run.violations.append(
                        f"worker exited with {code}: {worker.stderr_text()[-300:]}"
                    )
            first_claim, last_end = raw_rows(
                conn,
                "SELECT (SELECT min(created_at) FROM status_transitions WHERE status = 'running'),"
                " (SELECT max(created_at) FROM status_transitions "
                "WHERE previous_status = 'running')",
            )[0]
            by_worker = raw_rows(
                conn,
                "SELECT actor, count(*) FROM status_transitions WHERE status = 'completed' "
                "GROUP BY actor ORDER BY 2 DESC",
            )
        audit = audit_store(store, run.count)
    finally:
        for worker in workers:
            worker.stop()
            worker.log_path.unlink(missing_ok=True)
        stores.remove(store)
    run.seconds = float(last_end) - admitted_at if last_end is not None else float("nan")
    run.per_s = run.count / run.seconds if run.seconds > 0 else float("nan")
    span = float(last_end) - float(first_claim) if first_claim is not None else float("nan")
    run.span_per_s = run.count / span if span > 0 else float("nan")
    run.cpu_s = [after - before for before, after in zip(cpu_before, cpu_after, strict=True)]
    run.completed_by = [int(n) for _, n in by_worker]
    busy = busy_after[0] - busy_before[0]
    total = busy_after[1] - busy_before[1]
    run.machine_busy = busy / total if total else float("nan")
    run.audit = {
        "tasks": audit.tasks,
        "per_task": audit.per_task(),
        "violations": audit.violations,
    }
    run.violations += audit.violations
    if len(run.completed_by) != run.processes:
        run.violations.append(
            f"{len(run.completed_by)} of {run.processes} processes completed tasks"
        )
    share = [c / run.seconds for c in run.cpu_s] if run.seconds > 0 else []
    progress(
        f"[{run.backend:8} repeat {run.repeat + 1}] {run.processes} x concurrency "
        f"{run.concurrency}: {run.count} in {run.seconds:.2f}s = {run.per_s:.0f}/s "
        f"({run.per_s / run.ideal_per_s:.0%} of ideal {run.ideal_per_s:.0f}/s; steady "
        f"{run.span_per_s:.0f}/s); per process CPU "
        + ", ".join(f"{s:.0%}" for s in share)
        + f" of a core, tasks {run.completed_by}; machine busy {run.machine_busy:.0%}; "
        f"admission {run.admit_s:.1f}s untimed"
        + (f"  VIOLATIONS: {'; '.join(run.violations)}" if run.violations else "  ok")
    )


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--count", type=int, default=None, help="tasks per measurement (4,000)")
    parser.add_argument(
        "--concurrency", default="2", help="per-process --concurrency levels (default 2)"
    )
    parser.add_argument("--processes", default="1,2", help="worker process counts (1,2)")
    parser.add_argument("--sleep-ms", type=float, default=5.0, help="each task awaits this (5)")
    parser.add_argument("--repeat", type=int, default=None, help="interleaved repeats (3)")
    parser.add_argument("--quick", action="store_true", help="1,000 tasks, 1 repeat")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--sqlite-dir", type=Path, default=None)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--json-out", type=Path, default=None, help="also write the JSON object to this file"
    )
    args = parser.parse_args(argv)
    if args.count is None:
        args.count = 1000 if args.quick else 4000
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    args.concurrency = _ints(args.concurrency)
    args.processes = _ints(args.processes)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if set(args.backends) - set(BACKENDS):
        parser.error(f"unknown backends {sorted(set(args.backends) - set(BACKENDS))}")
    if min([args.count, args.repeat, *args.concurrency, *args.processes]) < 1:
        parser.error("counts, levels and repeats must be positive")
    return args


def _fmt(value: float, spec: str = ".0f") -> str:
    return "-" if value != value else format(value, spec)


def summarise(runs: list[Run], args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    base, top = min(args.processes), max(args.processes)
    for backend in args.backends:
        for concurrency in args.concurrency:
            mine = [r for r in runs if r.backend == backend and r.concurrency == concurrency]
            row: dict[str, Any] = {"backend": backend, "concurrency": concurrency, "by": {}}
            for processes in args.processes:
                these = [r for r in mine if r.processes == processes]
                if not these:
                    continue
                row["by"][processes] = {
                    "per_s": median([r.per_s for r in these]),
                    "span_per_s": median([r.span_per_s for r in these]),
                    "ideal_per_s": these[0].ideal_per_s,
                    "cpu_per_task_ms": median([1000 * sum(r.cpu_s) / r.count for r in these]),
                    "cpu_share_per_process": median(
                        [sum(r.cpu_s) / r.processes / r.seconds for r in these]
                    ),
                    "machine_busy": median([r.machine_busy for r in these]),
                    "samples": [round(r.per_s, 1) for r in these],
                }
            pairs = [
                a.per_s / b.per_s
                for a in mine
                if a.processes == top
                for b in mine
                if b.processes == base and b.repeat == a.repeat
            ]
            if base in row["by"] and top in row["by"] and base != top:
                row["ratio"] = row["by"][top]["per_s"] / row["by"][base]["per_s"]
                row["ratio_range"] = [min(pairs), max(pairs)] if pairs else []
                row["met"] = row["ratio"] >= GOAL_RATIO
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stores = Stores(args.pg_url, args.sqlite_dir, prefix="scale")
    context: dict[str, Any] = {**machine_description(), **code_version()}
    runs: list[Run] = []
    try:
        if "postgres" in args.backends:
            context["postgres"] = stores.pg_version()
        for repeat in range(args.repeat):
            for backend in args.backends:
                for concurrency in args.concurrency:
                    order = list(args.processes)
                    if repeat % 2 == 1:
                        order.reverse()  # alternate which process count goes first
                    for processes in order:
                        run = Run(backend, processes, concurrency, repeat, args.count)
                        runs.append(run)
                        measure(stores, run, args.sleep_ms / 1000.0)
    finally:
        stores.close()
        context["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    results = summarise(runs, args)
    violations = [
        f"{r.backend} {r.processes}x{r.concurrency} repeat {r.repeat + 1}: {v}"
        for r in runs
        for v in r.violations
    ]
    method = (
        f"{args.count} {SLEEP_KIND} tasks awaiting {args.sleep_ms:g} ms, admitted in one "
        f"submit_tasks call to {', '.join(map(str, args.processes))} idle `taskward worker "
        f"--quiet --concurrency C` processes (C = {', '.join(map(str, args.concurrency))}); timed "
        "from the call's return to the last completion fact; fresh store per measurement; "
        f"median of {args.repeat} interleaved repeats"
    )
    report = {
        "benchmark": "scale",
        "method": method,
        "context": context,
        "results": results,
        "violations": violations,
        "runs": [asdict(r) for r in runs],
    }
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(report, indent=2))
    if args.json:
        print(json.dumps(report, indent=2))
        return 1 if violations else 0
    print(f"scale benchmark: {method}")
    print("context: " + ", ".join(f"{k} {v}" for k, v in context.items()))
    print()
    table = []
    for r in results:
        for processes, by in r["by"].items():
            last = processes == max(r["by"])
            table.append(
                [
                    r["backend"],
                    str(r["concurrency"]),
                    str(processes),
                    _fmt(by["per_s"]),
                    _fmt(by["ideal_per_s"]),
                    _fmt(by["per_s"] / by["ideal_per_s"] * 100, ".0f") + "%",
                    _fmt(by["span_per_s"]),
                    _fmt(by["cpu_per_task_ms"], ".2f"),
                    _fmt(by["cpu_share_per_process"] * 100, ".0f") + "%",
                    _fmt(by["machine_busy"] * 100, ".0f") + "%",
                    (_fmt(r["ratio"], ".2f") + "x") if last and "ratio" in r else "",
                    " to ".join(_fmt(v, ".2f") for v in r.get("ratio_range", [])) if last else "",
                    ("met" if r["met"] else "MISSED") if last and "met" in r else "",
                ]
            )
    print(
        render_table(
            [
                "backend",
                "concurrency",
                "processes",
                "tasks/s",
                "ideal",
                "of ideal",
                "steady",
                "CPU ms/task",
                "CPU/process",
                "machine busy",
                "ratio",
                "range",
                f"goal >= {GOAL_RATIO}x",
            ],
            table,
        )
    )
    print(
        "  tasks/s: submit_tasks returned -> last completion fact; CPU: worker processes only "
        "(the database's own CPU is in machine busy); range: within one repeat"
    )
    per_task = runs[-1].audit.get("per_task", {}) if runs else {}
    if per_task:
        print(
            f"rows per task: facts {per_task['facts']:.2f}, events {per_task['events']:.2f}, "
            f"summaries {per_task['summaries']:.2f}"
        )
    return report_violations(violations)


if __name__ == "__main__":
    sys.exit(main())
