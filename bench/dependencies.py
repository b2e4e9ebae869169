"""What dependencies cost and how fast they move (issue 26; DESIGN.md R21), with real
``taskward worker`` processes (``bench.tasks``) on fresh stores (``bench/_common.Stores``).

- ``readiness``: an idle worker; chains ``A -> B`` admitted one after another (50 ms apart).
  For each B: the time from A's terminal fact to B's ``dependencies_met`` fact (the settle, in
  A's own transaction: the two facts share the transaction's time), and from A's terminal fact
  to B's ``running`` fact (what a user waits for: the settle, the wake-up and the claim), p50
  and p95.
- ``fanin``: 1,000 no-op tasks and one fan-in after all of them, admitted as one ``Workflow``
  (one transaction) and drained by one burst worker, against the same 1,001 tasks without
  dependencies (``submit_tasks``), interleaved: admission time, drain time (worker spawn to the
  last completion) and the facts and events written.

A measurement, not a test: it prints numbers and exits 1 only on a violation (a task not
completed, a dependent started before its dependency ended).

    .venv/bin/python bench/dependencies.py                      # both, both backends
    .venv/bin/python bench/dependencies.py --only fanin --repeat 3 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import (
    Store,
    Stores,
    WorkerProcess,
    median,
    percentile,
    progress,
    raw_connection,
    raw_value,
    render_table,
    wait_for_completed,
    wait_for_heartbeat,
)
from bench.tasks import NOOP_KIND

import taskward

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _registry() -> taskward.TaskAdapterRegistry:
    return taskward.build_registry(taskward.AdapterConfig(imports=("bench.tasks",)))


def app(**fields: Any) -> taskward.TaskApplication:
    return taskward.TaskApplication(
        action_kind=NOOP_KIND,
        args={},
        execution_target="host",
        idempotency_key=f"bench:{uuid.uuid4()}",
        **fields,
    )


def measure_readiness(stores: Stores, backend: str, count: int, log_dir: Path) -> dict[str, Any]:
    store = stores.create(backend)
    worker = WorkerProcess(store, concurrency=4, burst=False, log_dir=log_dir)
    settle: list[float] = []
    start: list[float] = []
    try:
        worker.start()
        with raw_connection(store) as conn:
            wait_for_heartbeat(conn, worker)

        async def run() -> None:
            async with taskward.open_db(store.url) as db:
                pairs = []
                for _ in range(count):
                    a = await taskward.submit_task(db, app(), registry=_registry())
                    b = await taskward.submit_task(db, app(depends_on=[a]), registry=_registry())
                    pairs.append((a, b))
                    await asyncio.sleep(0.05)
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    counts = await taskward.reads.count_by_status(db)
                    if counts["completed"] >= 2 * count:
                        break
                    await asyncio.sleep(0.1)
                for a, b in pairs:
                    ended = next(
                        f["created_at"]
                        for f in await taskward.list_transitions(db, a)
                        if f["status"] == "completed"
                    )
                    facts = await taskward.list_transitions(db, b)
                    met = [f["created_at"] for f in facts if f["reason_code"] == "dependencies_met"]
                    ran = [f["created_at"] for f in facts if f["status"] == "running"]
                    if not ran:
                        raise SystemExit(f"violation: {b} never ran")
                    # B admitted after A ended stays queued (no dependencies_met fact)
                    if met:
                        settle.append(met[0] - ended)
                    start.append(ran[0] - ended)

        asyncio.run(run())
        if min(start) < 0:
            raise SystemExit("violation: a dependent started before its dependency ended")
        return {
            "backend": backend,
            "count": count,
            "settled": len(settle),
            "settle_p50_ms": percentile(settle, 50) * 1000 if settle else None,
            "settle_p95_ms": percentile(settle, 95) * 1000 if settle else None,
            "start_p50_ms": percentile(start, 50) * 1000,
            "start_p95_ms": percentile(start, 95) * 1000,
        }
    finally:
        worker.stop()
        stores.remove(store)


def _admit(store: Store, fan: int, with_dependencies: bool) -> float:
    async def run() -> float:
        async with taskward.open_db(store.url) as db:
            began = time.perf_counter()
            if with_dependencies:
                wf = taskward.Workflow(f"bench:{uuid.uuid4()}")
                parts = wf.group([(f"p{n}", NOOP_KIND, {}) for n in range(fan)])
                wf.step("join", NOOP_KIND, {}, after=parts)
                await wf.submit(db, registry=_registry())
            else:
                await taskward.submit_tasks(
                    db, [app() for _ in range(fan + 1)], registry=_registry()
                )
            return time.perf_counter() - began

    return asyncio.run(run())


def measure_fanin(
    stores: Stores, backend: str, fan: int, repeat: int, log_dir: Path
) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "fanin": []}
    for round_ in range(repeat):
        for label in ("plain", "fanin") if round_ % 2 == 0 else ("fanin", "plain"):
            store = stores.create(backend)
            try:
                admit_s = _admit(store, fan, label == "fanin")
                worker = WorkerProcess(store, concurrency=64, burst=True, log_dir=log_dir)
                began = time.monotonic()
                worker.start()
                with raw_connection(store) as conn:
                    done, seen = wait_for_completed(conn, fan + 1, worker=worker, timeout_s=600)
                    facts = int(raw_value(conn, "SELECT count(*) FROM status_transitions"))
                    events = int(raw_value(conn, "SELECT count(*) FROM task_events"))
                worker.wait(120)
                if done != fan + 1:
                    raise SystemExit(f"violation: {done} of {fan + 1} completed ({label})")
                run = {
                    "admit_s": admit_s,
                    "drain_s": seen - began,
                    "facts": facts,
                    "events": events,
                }
                runs[label].append(run)
                progress(
                    f"{backend} {label}: admit {admit_s * 1000:.0f} ms, "
                    f"drain {run['drain_s']:.2f} s, {facts} facts"
                )
            finally:
                stores.remove(store)

    def med(label: str, name: str) -> float:
        return median([r[name] for r in runs[label]])

    return {
        "backend": backend,
        "tasks": fan + 1,
        **{
            f"{label}_{name}": med(label, name)
            for label in ("plain", "fanin")
            for name in ("admit_s", "drain_s", "facts", "events")
        },
        "drain_ratio": med("fanin", "drain_s") / med("plain", "drain_s"),
        "runs": runs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("readiness", "fanin"), action="append")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg-url", default=PG_URL)
    parser.add_argument("--count", type=int, default=40, help="chains for readiness")
    parser.add_argument("--fan", type=int, default=1000, help="tasks fanned out before the join")
    parser.add_argument("--repeat", type=int, default=3, help="fan-in drains of each kind")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    only = set(args.only or ("readiness", "fanin"))
    stores = Stores(args.pg_url, None, "deps")
    result: dict[str, Any] = {"readiness": [], "fanin": []}
    try:
        for backend in args.backends.split(","):
            if "readiness" in only:
                result["readiness"].append(
                    measure_readiness(stores, backend, args.count, stores.directory)
                )
            if "fanin" in only:
                result["fanin"].append(
                    measure_fanin(stores, backend, args.fan, args.repeat, stores.directory)
                )
    finally:
        stores.close()
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if result["readiness"]:
        print(
            render_table(
                ["backend", "chains", "settle p50/p95 ms", "dependent start p50/p95 ms"],
                [
                    [
                        r["backend"],
                        str(r["count"]),
                        f"{r['settle_p50_ms']:.1f} / {r['settle_p95_ms']:.1f}",
                        f"{r['start_p50_ms']:.1f} / {r['start_p95_ms']:.1f}",
                    ]
                    for r in result["readiness"]
                ],
            )
        )
    if result["fanin"]:
        print(
            render_table(
                [
                    "backend",
                    "tasks",
                    "admit ms plain / fan-in",
                    "drain s plain / fan-in",
                    "ratio",
                    "facts plain / fan-in",
                ],
                [
                    [
                        r["backend"],
                        str(r["tasks"]),
                        f"{r['plain_admit_s'] * 1000:.0f} / {r['fanin_admit_s'] * 1000:.0f}",
                        f"{r['plain_drain_s']:.2f} / {r['fanin_drain_s']:.2f}",
                        f"{r['drain_ratio']:.2f}",
                        f"{r['plain_facts']:.0f} / {r['fanin_facts']:.0f}",
                    ]
                    for r in result["fanin"]
                ],
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
