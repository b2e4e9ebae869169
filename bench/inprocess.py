"""One in-process drain: a ``WorkerRuntime`` draining N no-op tasks in this process, with the
CPU each side spent (this process; the PostgreSQL server's backends) and the audit check.

For A/B pairs of two source trees: run it alternately with ``PYTHONPATH`` pointing at each
tree's ``src`` (the taskward imported is whichever comes first on the path, and the script
prints which), e.g.::

    for i in 1 2 3; do
      PYTHONPATH=/tmp/base/src .venv/bin/python bench/inprocess.py --backend postgres
      PYTHONPATH=src          .venv/bin/python bench/inprocess.py --backend postgres
    done

It prints one JSON line: tasks/s (from the runtime's start to the N-th completion the host
counted), this process's CPU and the server's CPU per task in microseconds, and the audit
(exactly 2 facts, 2 events and 1 summary per task, or the violations). A measurement, not a
test: the CLI's worker process, start-up included, is what ``bench/compare`` and
``taskward bench`` time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # bench._common, after PYTHONPATH

from bench import noop
from bench._common import Stores, audit_store, machine_description


def server_cpu_s() -> float:
    """utime + stime of every process named postgres on this machine (its backends and
    helpers), in seconds: the server's share of a drain, read from /proc before and after."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name_end = stat.rfind(")")
        if "postgres" not in stat[stat.find("(") + 1 : name_end]:
            continue
        fields = stat[name_end + 2 :].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


def loopback_bytes() -> int:
    """Bytes the loopback interface carried (both directions: each packet is sent once)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, data = line.partition(":")
            if name.strip() == "lo":
                return int(data.split()[8])
    return 0


NOOP_KIND = noop.KIND  # bench/noop.py's no-op @taskward.task


def noop_registry() -> Any:
    """The registry of the drains: the built-in kinds and ``bench/noop.py``'s no-op."""
    import taskward

    return taskward.build_registry(taskward.AdapterConfig(imports=(noop.MODULE,)))


async def admit_noops(db: Any, registry: Any, count: int, prefix: str) -> None:
    """``count`` queued no-op tasks, keys ``<prefix>-<i>``, admitted in bulk (untimed)."""
    import taskward

    apps = [
        taskward.TaskApplication(
            action_kind=NOOP_KIND, args={}, execution_target="host", idempotency_key=f"{prefix}-{i}"
        )
        for i in range(count)
    ]
    for start in range(0, count, 1000):
        await taskward.submit_tasks(db, apps[start : start + 1000], registry=registry)


async def drain_noops(
    db: Any,
    registry: Any,
    count: int,
    concurrency: int,
    *,
    started: Callable[[Any], None] | None = None,
    finished: Callable[[Any], None] | None = None,
) -> tuple[float, float]:
    """A ``WorkerRuntime`` over ``db`` (as ``taskward worker`` runs one, without the scheduler
    or the outbox deliverer) until its host counted ``count`` completions; then stopped. Returns
    the wall and CPU seconds from its start to the ``count``-th completion. ``started(runtime)``
    is called just before it starts, ``finished(runtime)`` at the ``count``-th completion,
    before it is stopped."""
    from taskward.cli.common import tune_gc
    from taskward.runtime import WorkerConfig, WorkerRuntime

    tune_gc()  # as the CLI's worker process does before its loop starts
    config = WorkerConfig(
        concurrency=concurrency,
        exit_when_idle=True,
        idle_wait_s=0.05,
        run_scheduler=False,
        deliver_outbox=False,
    )
    runtime = WorkerRuntime(db, registry, config)
    done = asyncio.Event()

    def on_event(kind: str, task: Any, data: dict[str, Any]) -> None:
        if runtime.host.stats.completed >= count:
            done.set()

    runtime.host.on_event = on_event
    if started is not None:
        started(runtime)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    serve = asyncio.create_task(runtime.run())
    await asyncio.wait_for(done.wait(), timeout=600)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if finished is not None:
        finished(runtime)
    runtime.request_stop()
    await serve
    return wall, cpu


async def drain(url: str, count: int, concurrency: int) -> dict[str, Any]:
    import taskward

    registry = noop_registry()
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}

    def counters(runtime: Any) -> dict[str, Any]:
        group = runtime.summaries.group
        return {
            "batches": group.batches,
            "units": group.units,
            "lo": loopback_bytes(),
            "server": server_cpu_s(),
        }

    async with taskward.open_db(url) as db:
        await admit_noops(db, registry, count, "inproc")
        wall, cpu = await drain_noops(
            db,
            registry,
            count,
            concurrency,
            started=lambda runtime: before.update(counters(runtime)),
            finished=lambda runtime: after.update(counters(runtime)),
        )
    batches, units = after["batches"] - before["batches"], after["units"] - before["units"]
    return {
        "tasks_per_s": round(count / wall, 1),
        "worker_cpu_us": round(cpu / count * 1e6, 1),
        "server_cpu_us": round((after["server"] - before["server"]) / count * 1e6, 1),
        "wall_s": round(wall, 3),
        "loopback_bytes_per_task": round((after["lo"] - before["lo"]) / count),
        "batches": batches,
        "units_per_batch": round(units / max(batches, 1), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="postgres")
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--pg-url",
        default=os.environ.get(
            "TASKWARD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
        ),
    )
    parser.add_argument("--label", default="")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="MODULE:NAME=VALUE",
        help="an experiment: set a module constant (an int or float) before the drain, "
        "e.g. taskward.groupcommit:POSTGRES_LANES=3 (repeatable)",
    )
    parser.add_argument(
        "--ddl",
        default="",
        help="SQL run on the fresh store before the drain (an experiment: indexes, settings); "
        "split at ';' unless it holds a dollar-quoted body ($$), which is sent whole "
        "(CREATE OR REPLACE FUNCTION ...)",
    )
    args = parser.parse_args(argv)

    import importlib

    import taskward

    for setting in args.set:
        target, _, value = setting.partition("=")
        module_name, _, name = target.partition(":")
        module = importlib.import_module(module_name)
        if not hasattr(module, name):
            parser.error(f"--set {setting}: {module_name} has no {name}")
        setattr(module, name, float(value) if "." in value else int(value))
    stores = Stores(args.pg_url, None, "inproc")
    try:
        store = stores.create(args.backend)
        if args.ddl:
            from bench._common import raw_connection

            with raw_connection(store) as conn:
                statements = [args.ddl] if "$$" in args.ddl else args.ddl.split(";")
                for statement in filter(str.strip, statements):
                    conn.execute(statement)
        # The CLI's worker runs on uvloop where it is installed; so does this drain.
        try:
            import uvloop

            loop_factory: Any = uvloop.new_event_loop
        except ImportError:
            loop_factory = None
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            result = runner.run(drain(store.url, args.count, args.concurrency))
        audit = audit_store(store, args.count)
        result.update(
            backend=args.backend,
            label=args.label,
            settings=args.set,
            taskward=str(Path(taskward.__file__).parent),
            violations=len(audit.violations),
            rows_per_task=audit.per_task(),
            load=machine_description().get("loadavg_1m_at_start"),
        )
        print(json.dumps(result))
        return 1 if audit.violations else 0
    finally:
        stores.close()


if __name__ == "__main__":
    sys.exit(main())
