"""Issue 27's kill storm: worker processes SIGKILLed one after another while tasks arrive.

The scenario (the issue's "Recovery under a kill storm" goal), per backend:

- ``--workers`` (4) ``taskward worker`` processes over one fresh store, each with a lease of
  ``--lease`` (5 s: R5's ``max(now + lease_ttl, deadline + slack)`` with a ttl of the lease and a
  default timeout and slack of half of it each), reapers every ``--reap-interval`` and the
  worker's default retry backoff (``--retry-base``, 2 s doubling);
- once all serve, a random live worker is SIGKILLed every ``--kill-every`` (0.5 s) for
  ``--kill-for`` (60 s) and started again at once (a fresh worker id for each start);
- meanwhile a separate submitter process admits ``--tasks`` (10,000) no-op tasks, one
  ``submit_task`` a call, spread evenly over the kill period;
- after the kills the workers run on until every admitted task is terminal, then drain on
  SIGTERM.

What it measures, from the store's records (facts) and the kill times it recorded itself:

- every orphan: a claim whose next fact is the reaper's ``lease_expired``; its worker is known
  from the claim's lease id (``<worker>/<attempt>``, R4) and the kill of that worker is the one
  that orphaned it. Recovery = the task's next claim - the kill. It splits into the lease wait
  (kill -> lease expiry, the expiry being the claim's time + the lease, R5), the reaper's lag
  (expiry -> ``lease_expired`` fact), the retry backoff and its promotion (-> ``retry_ready``)
  and the queue wait (-> the next claim). Each is checked against its due bound: lease +
  reaper interval + the most that attempt's backoff may be (jitter included) + 2 s;
- the backlog when the kills stop (admitted, not yet terminal) and the time until the last
  task is terminal;
- restarts: how many restarted workers claimed before they were killed again, their start-up
  (spawn -> first heartbeat, spawn -> first claim), and the time no worker was serving;
- the audit: every acknowledged admission is there, exactly one terminal fact per task, no
  failure, and the invariant checker (``taskward.checker``) passes.

A table on stderr, one JSON line on stdout, progress lines while it runs; exit 1 on a violation
(a lost task, a double terminal, the checker, an orphan no kill explains). A missed goal is
reported, not a violation.

    .venv/bin/python bench/killstorm.py [--backend sqlite|postgres|both] [--quick]

``--quick`` is the development form (about 10 s a backend: 8 s of kills, 1,000 tasks, a 2 s
lease).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    DEFAULT_PG_URL,
    TASKS_MODULE,
    Store,
    Stores,
    WorkerProcess,
    ensure_repo_on_path,
    machine_description,
    percentile,
    progress,
    raw_connection,
    raw_rows,
    raw_value,
    render_table,
)
from bench.tasks import NOOP_KIND

GRACE_S = 2.0  # the goal's slack over lease + reaper interval + backoff
DRAIN_GOAL_S = 20.0  # the goal: backlog drained this long after the kills stop
JITTER = 0.2  # RetryPolicy's default jitter: the most an attempt's backoff may be is (1 + it)x
ACTIVE_STATUSES = ("queued", "running", "retry_wait", "waiting_dependency")


@dataclass(frozen=True)
class Storm:
    workers: int = 4
    concurrency: int = 8
    kill_every_s: float = 0.5
    kill_for_s: float = 60.0
    lease_s: float = 5.0
    tasks: int = 10_000
    reap_interval_s: float = 1.0
    retry_base_s: float = 2.0
    drain_timeout_s: float = 300.0
    seed: int = 27

    def worker_args(self, worker_id: str) -> list[str]:
        half = f"{self.lease_s / 2:g}"
        return [
            "--worker-id",
            worker_id,
            "--lease-ttl",
            f"{self.lease_s:g}",
            "--default-timeout",
            half,
            "--lease-slack",
            half,
            "--reap-interval",
            f"{self.reap_interval_s:g}",
            "--retry-base",
            f"{self.retry_base_s:g}",
            "--heartbeat-interval",
            "1",
        ]

    def backoff_max_s(self, attempt: int) -> float:
        """The longest backoff the worker's default policy gives after ``attempt`` (R18)."""
        return min(300.0, self.retry_base_s * 2.0 ** max(0, attempt - 1)) * (1 + JITTER)

    def due_s(self, attempt: int) -> float:
        """The goal's bound on an orphan's recovery: lease + reaper + backoff + 2 s."""
        return self.lease_s + self.reap_interval_s + self.backoff_max_s(attempt) + GRACE_S


QUICK = {"kill_for_s": 8.0, "tasks": 1000, "lease_s": 2.0, "drain_timeout_s": 120.0}


# -- the submitter (its own process) ------------------------------------------------------------


def submit_paced(url: str, tasks: int, spread_s: float, out_path: str, start_at: float) -> None:
    """Admit ``tasks`` no-ops one ``submit_task`` at a time, the i-th not before ``start_at + i
    * spread_s / tasks`` (wall clock); write key -> task id to ``out_path``."""
    ensure_repo_on_path()
    import taskward

    registry = taskward.build_registry(taskward.AdapterConfig(imports=(TASKS_MODULE,)))

    async def run() -> dict[str, str]:
        acknowledged: dict[str, str] = {}
        async with taskward.open_db(url) as db:
            for i in range(tasks):
                wait = start_at + i * spread_s / tasks - time.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                key = f"storm-{i}"
                app = taskward.TaskApplication(
                    action_kind=NOOP_KIND, args={}, execution_target="host", idempotency_key=key
                )
                acknowledged[key] = await taskward.submit_task(db, app, registry=registry)
        return acknowledged

    acknowledged = asyncio.run(run())
    Path(out_path).write_text(json.dumps(acknowledged))


# -- the storm ----------------------------------------------------------------------------------


@dataclass
class Start:
    """One worker process start: its slot, id, spawn time and, if it was killed, when."""

    slot: int
    worker_id: str
    spawned_at: float
    restart: bool
    killed_at: float | None = None
    exit_code: int | None = None


@dataclass
class Run:
    storm: Storm
    backend: str
    began_at: float = 0.0  # kills and admissions start (wall clock)
    stopped_at: float = 0.0  # the last kill
    backlog_at_stop: dict[str, int] = field(default_factory=dict)
    drained_at: float | None = None  # every admitted task terminal (seen by polling)
    starts: list[Start] = field(default_factory=list)
    acknowledged: dict[str, str] = field(default_factory=dict)
    final_exits: list[int | None] = field(default_factory=list)


def counts_by_status(conn: Any) -> dict[str, int]:
    rows = raw_rows(conn, "SELECT status, count(*) FROM schedule_runs GROUP BY status")
    return {str(status): int(n) for status, n in rows}


def storm_once(stores: Stores, backend: str, storm: Storm, log_dir: Path) -> dict[str, Any]:
    store = stores.create(backend)
    try:
        run = _storm(store, storm, log_dir)
        return analyse(store, run)
    finally:
        stores.remove(store)


def _set_max_attempts(store: Store, value: int) -> None:
    import taskward
    from taskward.settings import set_max_attempts

    async def go() -> None:
        async with taskward.open_db(store.url) as db:
            await set_max_attempts(db, value)

    asyncio.run(go())


def _storm(store: Store, storm: Storm, log_dir: Path) -> Run:
    # Kills, not poison: no task may run out of attempts however often its worker dies.
    _set_max_attempts(store, 100)
    run = Run(storm, store.backend)
    rng = random.Random(storm.seed)
    slots: list[WorkerProcess] = []
    starts: list[Start] = []
    tag = f"storm{os.getpid() % 10000}"

    def spawn(slot: int, restart: bool) -> WorkerProcess:
        worker_id = f"{tag}-{slot}-{len(starts) + 1}"
        worker = WorkerProcess(
            store,
            concurrency=storm.concurrency,
            burst=False,
            log_dir=log_dir,
            extra_args=storm.worker_args(worker_id),
        )
        worker.start()
        starts.append(Start(slot, worker_id, worker.spawned_at, restart))
        return worker

    slot_start: list[int] = []
    for slot in range(storm.workers):
        slots.append(spawn(slot, restart=False))
        slot_start.append(len(starts) - 1)
    ack_path = log_dir / f"acknowledged-{store.backend}.json"
    with raw_connection(store) as conn:
        _wait_serving(conn, [starts[i].worker_id for i in slot_start], slots)
        run.began_at = time.time()
        ctx = multiprocessing.get_context("spawn")
        submitter = ctx.Process(
            target=submit_paced,
            args=(store.url, storm.tasks, storm.kill_for_s, str(ack_path), run.began_at),
            name="submitter",
            daemon=True,
        )
        submitter.start()
        try:
            next_kill = run.began_at + storm.kill_every_s
            next_report = run.began_at + 5.0
            while True:
                now = time.time()
                if now >= run.began_at + storm.kill_for_s:
                    break
                if now < next_kill:
                    time.sleep(min(next_kill, run.began_at + storm.kill_for_s) - now)
                    continue
                next_kill += storm.kill_every_s
                slot = rng.randrange(storm.workers)
                victim = slots[slot]
                victim.process.send_signal(signal.SIGKILL)
                victim.wait(10.0)
                record = starts[slot_start[slot]]
                record.killed_at = time.time()
                record.exit_code = victim.poll()
                slots[slot] = spawn(slot, restart=True)
                slot_start[slot] = len(starts) - 1
                if now >= next_report:
                    next_report += 5.0
                    _report(conn, run, starts)
            run.stopped_at = time.time()
            run.backlog_at_stop = counts_by_status(conn)
            kills = sum(1 for s in starts if s.killed_at is not None)
            progress(
                f"  {store.backend}: kills stopped after {kills} kills; at that moment "
                f"{_describe(run.backlog_at_stop)}"
            )
            submitter.join(timeout=storm.drain_timeout_s)
            if submitter.exitcode != 0:
                raise RuntimeError(f"the submitter exited with {submitter.exitcode}")
            run.acknowledged = json.loads(ack_path.read_text())
            run.drained_at = _wait_terminal(conn, storm, run)
            # a worker still starting has no signal handler yet: SIGTERM would end it (-15)
            # rather than drain it
            _wait_serving(conn, [starts[i].worker_id for i in slot_start], slots)
        finally:
            if submitter.is_alive():
                submitter.terminate()
            run.final_exits = [w.stop() for w in slots]
    run.starts = starts
    return run


def _wait_serving(conn: Any, worker_ids: list[str], workers: list[WorkerProcess]) -> None:
    deadline = time.monotonic() + 60.0
    marks = ",".join("?" for _ in worker_ids)
    while time.monotonic() < deadline:
        n = raw_value(
            conn, f"SELECT count(*) FROM workers WHERE worker_id IN ({marks})", worker_ids
        )
        if int(n) == len(worker_ids):
            return
        for worker in workers:
            if worker.poll() is not None:
                raise RuntimeError(f"worker exited with {worker.poll()}:\n{worker.stderr_text()}")
        time.sleep(0.02)
    raise RuntimeError("the workers did not all start serving within 60 s")


def _wait_terminal(conn: Any, storm: Storm, run: Run) -> float | None:
    deadline = time.monotonic() + storm.drain_timeout_s
    next_report = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        counts = counts_by_status(conn)
        if sum(counts.values()) >= storm.tasks and not any(
            counts.get(s, 0) for s in ACTIVE_STATUSES
        ):
            return time.time()
        if time.monotonic() >= next_report:
            next_report += 5.0
            progress(
                f"  {run.backend}: +{time.time() - run.stopped_at:5.1f}s after the kills: "
                f"{_describe(counts)}"
            )
        time.sleep(0.05)
    return None


def _report(conn: Any, run: Run, starts: list[Start]) -> None:
    kills = sum(1 for s in starts if s.killed_at is not None)
    progress(
        f"  {run.backend}: t={time.time() - run.began_at:5.1f}s  {kills} kills  "
        f"{_describe(counts_by_status(conn))}"
    )


def _describe(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no rows"


# -- what the records say -----------------------------------------------------------------------


@dataclass
class Orphan:
    task_id: str
    attempt: int
    worker_id: str
    killed_at: float
    expired_at: float
    reaped_at: float
    ready_at: float | None
    claimed_at: float | None

    @property
    def recovery_s(self) -> float | None:
        return None if self.claimed_at is None else self.claimed_at - self.killed_at


def _facts(conn: Any, backend: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every task's facts in the order they were written (``seq`` / SQLite's rowid)."""
    order = "rowid" if backend == "sqlite" else "seq"
    rows = raw_rows(
        conn,
        "SELECT entity_id, previous_status, status, reason_code, created_at, lease_id "
        f"FROM status_transitions ORDER BY entity_id, {order}",
    )
    by_task: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for row in rows:
        by_task[str(row[0])].append(row[1:])
    return by_task


def analyse(store: Store, run: Run) -> dict[str, Any]:
    storm = run.storm
    violations: list[str] = []
    killed = {s.worker_id: s for s in run.starts if s.killed_at is not None}
    with raw_connection(store) as conn:
        by_task = _facts(conn, store.backend)
        heartbeats = {
            str(worker_id): float(started)
            for worker_id, started in raw_rows(conn, "SELECT worker_id, started_at FROM workers")
        }
        statuses = counts_by_status(conn)

    orphans: list[Orphan] = []
    unexplained: list[str] = []
    first_claim: dict[str, float] = {}
    terminal_facts: dict[str, int] = defaultdict(int)
    last_terminal = 0.0
    for task_id, facts in by_task.items():
        for i, (prev, status, reason, created_at, lease_id) in enumerate(facts):
            if status in ("completed", "failed", "timed_out", "cancelled", "skipped"):
                terminal_facts[task_id] += 1
                last_terminal = max(last_terminal, float(created_at))
            if prev == "queued" and status == "running" and lease_id:
                worker_id = str(lease_id).rsplit("/", 1)[0]
                first_claim[worker_id] = min(
                    first_claim.get(worker_id, float("inf")), float(created_at)
                )
            if reason != "lease_expired":
                continue
            claim = facts[i - 1]
            worker_id, attempt = str(claim[4]).rsplit("/", 1)
            start = killed.get(worker_id)
            if start is None or start.killed_at is None:
                unexplained.append(f"{task_id} attempt {attempt} of {worker_id}")
                continue
            later = facts[i + 1 :]
            ready = next((f for f in later if f[2] == "retry_ready"), None)
            again = next((f for f in later if f[0] == "queued" and f[1] == "running"), None)
            orphans.append(
                Orphan(
                    task_id,
                    int(attempt),
                    worker_id,
                    start.killed_at,
                    # R5: this claim's lease ends lease_s after it (ttl = lease, timeout + slack
                    # = lease: bench/killstorm's worker arguments)
                    float(claim[3]) + storm.lease_s,
                    float(created_at),
                    None if ready is None else float(ready[3]),
                    None if again is None else float(again[3]),
                )
            )

    # -- the audit
    if unexplained:
        violations.append(f"{len(unexplained)} lease(s) expired without a kill: {unexplained[:5]}")
    missing = sorted(set(run.acknowledged.values()) - set(by_task))
    if len(run.acknowledged) != storm.tasks:
        violations.append(f"{len(run.acknowledged)} of {storm.tasks} admissions acknowledged")
    if missing:
        violations.append(f"{len(missing)} acknowledged task(s) never ran: {missing[:5]}")
    doubles = [t for t, n in terminal_facts.items() if n != 1]
    not_terminal = [t for t in run.acknowledged.values() if terminal_facts.get(t, 0) == 0]
    if doubles:
        violations.append(f"{len(doubles)} task(s) with more than one terminal fact: {doubles[:5]}")
    if not_terminal:
        violations.append(f"{len(not_terminal)} task(s) never terminal: {not_terminal[:5]}")
    if statuses.get("completed", 0) != storm.tasks:
        violations.append(f"statuses at the end: {_describe(statuses)}")
    if any(o.claimed_at is None for o in orphans):
        violations.append("an orphan never claimed again")
    bad_exits = [code for code in run.final_exits if code != 0]
    if bad_exits:
        violations.append(f"workers drained with exit codes {run.final_exits}")
    violations += _checker(store, run.acknowledged)

    # -- recovery and where it went
    recovered = [o for o in orphans if o.recovery_s is not None and o.ready_at is not None]
    recoveries = [o.recovery_s for o in recovered if o.recovery_s is not None]
    late = [o for o in recovered if (o.recovery_s or 0) > storm.due_s(o.attempt)]
    parts = {
        "lease_wait": [o.expired_at - o.killed_at for o in recovered],
        "reaper_lag": [o.reaped_at - o.expired_at for o in recovered],
        "backoff_and_promotion": [(o.ready_at or 0) - o.reaped_at for o in recovered],
        "queue_wait": [(o.claimed_at or 0) - (o.ready_at or 0) for o in recovered],
    }
    slowest = max(recovered, key=lambda o: o.recovery_s or 0, default=None)
    spans = _serving_spans(run, heartbeats)

    # -- restarts and start-up
    restarts = [s for s in run.starts if s.restart]
    claimed_first = [s for s in restarts if s.worker_id in first_claim]
    served = [s for s in restarts if s.worker_id in heartbeats]
    to_claim = [first_claim[s.worker_id] - s.spawned_at for s in claimed_first]
    to_heartbeat = [heartbeats[s.worker_id] - s.spawned_at for s in served]
    lost_before_claim = [s for s in restarts if s.killed_at is not None and s not in claimed_first]
    serving_gap = _no_serving_time(run, heartbeats)

    backlog = sum(run.backlog_at_stop.get(s, 0) for s in ACTIVE_STATUSES)
    admitted_late = storm.tasks - sum(run.backlog_at_stop.values())
    drain_s = max(0.0, last_terminal - run.stopped_at) if run.drained_at is not None else None
    if run.drained_at is None:
        violations.append(f"not drained within {storm.drain_timeout_s:g}s after the kills")
    due_first = storm.due_s(1)
    return {
        "backend": store.backend,
        "storm": asdict(storm),
        "kills": sum(1 for s in run.starts if s.killed_at is not None),
        "kill_period_s": run.stopped_at - run.began_at,
        "orphans": len(orphans),
        "orphaned_tasks": len({o.task_id for o in orphans}),
        "orphan_attempts_max": max((o.attempt for o in orphans), default=0),
        "recovery_s": _summary(recoveries),
        "due_s_attempt_1": due_first,
        "late": len(late),
        "recovery_goal_met": bool(recoveries) and not late,
        "slowest": None if slowest is None else _orphan_dict(slowest, spans),
        "late_orphans": [
            _orphan_dict(o, spans) for o in sorted(late, key=lambda o: -(o.recovery_s or 0))[:20]
        ],
        # how long after its lease expired no worker was serving (none could reap it)
        "unserved_after_expiry_s": _summary(
            [_unserved(spans, o.expired_at, o.reaped_at) for o in recovered]
        ),
        "attribution_s": {name: _summary(values) for name, values in parts.items()},
        "backlog_at_stop": backlog,
        "statuses_at_stop": run.backlog_at_stop,
        "not_yet_admitted_at_stop": admitted_late,
        "drained_after_stop_s": drain_s,
        "drain_goal_met": drain_s is not None and drain_s <= DRAIN_GOAL_S,
        "restarts": len(restarts),
        "restarts_killed": sum(1 for s in restarts if s.killed_at is not None),
        "restarts_claimed": len(claimed_first),
        "restarts_killed_before_first_claim": len(lost_before_claim),
        "restarts_killed_before_heartbeat": sum(
            1 for s in restarts if s.killed_at is not None and s.worker_id not in heartbeats
        ),
        "startup_to_heartbeat_s": _summary(to_heartbeat),
        "startup_to_first_claim_s": _summary(to_claim),
        "no_worker_serving_s": serving_gap,
        "violations": violations,
    }


def _orphan_dict(o: Orphan, spans: list[tuple[float, float]]) -> dict[str, Any]:
    return {
        "serving_at_expiry": sum(1 for b, e in spans if b <= o.expired_at < e),
        "unserved_after_expiry_s": _unserved(spans, o.expired_at, o.reaped_at),
        "serving_at_ready": None
        if o.ready_at is None
        else sum(1 for b, e in spans if b <= o.ready_at < e),
        "task_id": o.task_id,
        "attempt": o.attempt,
        "worker_id": o.worker_id,
        "recovery_s": o.recovery_s,
        "lease_wait_s": o.expired_at - o.killed_at,
        "reaper_lag_s": o.reaped_at - o.expired_at,
        "backoff_and_promotion_s": None if o.ready_at is None else o.ready_at - o.reaped_at,
        "queue_wait_s": None
        if o.ready_at is None or o.claimed_at is None
        else o.claimed_at - o.ready_at,
    }


def _serving_spans(run: Run, heartbeats: dict[str, float]) -> list[tuple[float, float]]:
    """When each worker served: from its first heartbeat to its kill (or forever)."""
    spans = []
    for s in run.starts:
        ready = heartbeats.get(s.worker_id)
        if ready is not None:
            spans.append((ready, s.killed_at if s.killed_at is not None else float("inf")))
    return sorted(spans)


def _unserved(spans: list[tuple[float, float]], begin: float, end: float) -> float:
    """Seconds of [begin, end) in which no worker was serving."""
    covered, cursor = 0.0, begin
    for b, e in spans:
        b, e = max(b, cursor), min(e, end)
        if e > b:
            covered += e - b
            cursor = e
    return max(0.0, (end - begin) - covered)


def _no_serving_time(run: Run, heartbeats: dict[str, float]) -> float:
    """Seconds of the kill period in which no worker was serving (first heartbeat written and
    not yet killed): neither a claim nor a reaper pass can happen then."""
    spans = []
    for s in run.starts:
        ready = heartbeats.get(s.worker_id)
        if ready is None:
            continue
        end = s.killed_at if s.killed_at is not None else run.stopped_at
        spans.append((max(ready, run.began_at), min(end, run.stopped_at)))
    spans = sorted(span for span in spans if span[1] > span[0])
    covered, cursor = 0.0, run.began_at
    for begin, end in spans:
        if end <= cursor:
            continue
        covered += end - max(begin, cursor)
        cursor = end
    return max(0.0, (run.stopped_at - run.began_at) - covered)


def _summary(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p100": max(values),
        "mean": sum(values) / len(values),
    }


def _checker(store: Store, acknowledged: dict[str, str]) -> list[str]:
    """The invariant checker over the quiescent store (every task terminal)."""
    import taskward
    from taskward.checker import check_invariants

    async def go() -> list[str]:
        async with taskward.open_db(store.url) as db:
            found = await check_invariants(db, acknowledged=acknowledged)
        return [f"checker: {v}" for v in found]

    return asyncio.run(go())


# -- output -------------------------------------------------------------------------------------


def _fmt(summary: dict[str, float] | None, key: str) -> str:
    return "-" if summary is None else f"{summary[key]:.2f}"


def render(results: list[dict[str, Any]]) -> str:
    rows: list[list[str]] = []

    def row(label: str, fn: Any) -> None:
        rows.append([label, *(str(fn(r)) for r in results)])

    row("kills / restarts", lambda r: f"{r['kills']} / {r['restarts']}")
    row(
        "orphans (tasks, max attempt)",
        lambda r: f"{r['orphans']} ({r['orphaned_tasks']}, {r['orphan_attempts_max']})",
    )
    for q in ("p50", "p95", "p100"):
        row(f"recovery {q} s", lambda r, q=q: _fmt(r["recovery_s"], q))
    row("due (attempt 1) s / late", lambda r: f"{r['due_s_attempt_1']:.1f} / {r['late']}")
    row("recovery goal", lambda r: "met" if r["recovery_goal_met"] else "MISSED")
    for name in ("lease_wait", "reaper_lag", "backoff_and_promotion", "queue_wait"):
        row(
            f"  {name} p50 / p100 s",
            lambda r, n=name: (
                f"{_fmt(r['attribution_s'][n], 'p50')} / {_fmt(r['attribution_s'][n], 'p100')}"
            ),
        )
    row(
        "backlog at stop (not admitted)",
        lambda r: f"{r['backlog_at_stop']} ({r['not_yet_admitted_at_stop']})",
    )
    row(
        "drained after stop s",
        lambda r: "-" if r["drained_after_stop_s"] is None else f"{r['drained_after_stop_s']:.2f}",
    )
    row("drain goal (<= 20 s)", lambda r: "met" if r["drain_goal_met"] else "MISSED")
    row(
        "restarts claimed / killed first",
        lambda r: f"{r['restarts_claimed']} / {r['restarts_killed_before_first_claim']}",
    )
    row(
        "start-up to heartbeat p50/p95 s",
        lambda r: (
            f"{_fmt(r['startup_to_heartbeat_s'], 'p50')} / "
            f"{_fmt(r['startup_to_heartbeat_s'], 'p95')}"
        ),
    )
    row(
        "start-up to 1st claim p50/p95 s",
        lambda r: (
            f"{_fmt(r['startup_to_first_claim_s'], 'p50')} / "
            f"{_fmt(r['startup_to_first_claim_s'], 'p95')}"
        ),
    )
    row("no worker serving s", lambda r: f"{r['no_worker_serving_s']:.2f}")
    row("violations", lambda r: len(r["violations"]))
    return render_table(["", *(r["backend"] for r in results)], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--kill-every", type=float, default=0.5)
    parser.add_argument("--kill-for", type=float, default=60.0)
    parser.add_argument("--lease", type=float, default=5.0)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--reap-interval", type=float, default=1.0)
    parser.add_argument("--retry-base", type=float, default=2.0)
    parser.add_argument("--drain-timeout", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--quick", action="store_true", help="the ~10 s development form")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    args = parser.parse_args(argv)
    storm = Storm(
        workers=args.workers,
        concurrency=args.concurrency,
        kill_every_s=args.kill_every,
        kill_for_s=args.kill_for,
        lease_s=args.lease,
        tasks=args.tasks,
        reap_interval_s=args.reap_interval,
        retry_base_s=args.retry_base,
        drain_timeout_s=args.drain_timeout,
        seed=args.seed,
    )
    if args.quick:
        storm = Storm(**{**asdict(storm), **QUICK})
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    machine = machine_description()
    results = []
    stores = Stores(args.pg_url, None, "killstorm")
    try:
        with tempfile.TemporaryDirectory(prefix="taskward-killstorm-") as tmp:
            for backend in backends:
                progress(
                    f"{backend}: {storm.workers} workers, a SIGKILL every {storm.kill_every_s:g}s "
                    f"for {storm.kill_for_s:g}s, lease {storm.lease_s:g}s, {storm.tasks} tasks "
                    f"(load average {os.getloadavg()[0]:.2f})"
                )
                results.append(storm_once(stores, backend, storm, Path(tmp)))
    finally:
        stores.close()
    print(render(results), file=sys.stderr)
    violations = [f"{r['backend']}: {v}" for r in results for v in r["violations"]]
    for line in violations:
        progress(f"VIOLATION {line}")
    load_end = round(os.getloadavg()[0], 2)
    progress(f"load average {machine['loadavg_1m_at_start']} at the start, {load_end} at the end")
    print(json.dumps({"machine": machine, "loadavg_1m_at_end": load_end, "results": results}))
    return 1 if violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
