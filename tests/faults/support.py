"""Plumbing of the fault scenarios: sizes (short in the suite, long on demand), admission, worker
processes under a small supervisor, crash-armed processes, and reads of the outcome.

Long forms run with ``TASKWARD_CHAOS=1`` (see docs/faults.md); the short forms are what the
suite runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import taskward
from taskward.adapters import AdapterConfig, build_registry
from taskward.checker import assert_invariants
from taskward.execution import RetryPolicy
from taskward.lifecycle import ACTIVE
from taskward.maintenance.reaper import reap_deadlines, reap_expired_leases
from taskward.runtime import WorkerConfig, WorkerRuntime
from taskward.store.port import Row, StateDB
from tests.faults.crashing import CRASH_ENV
from tests.worker_procs import ROOT, WORKER_TASKS, wait_until, worker_argv

CHAOS = os.environ.get("TASKWARD_CHAOS") == "1"
MODULES = (WORKER_TASKS, "tests.faults.fault_tasks")
PYTHON = sys.executable
# What `command` tasks of the scenarios run, here and in the workers (TASKWARD_COMMAND_ALLOWLIST).
COMMANDS = (PYTHON, "sleep", "false")
REGISTRY = build_registry(AdapterConfig(imports=MODULES, command_allowlist=frozenset(COMMANDS)))
WORKER_ENV = {"TASKWARD_COMMAND_ALLOWLIST": ",".join(COMMANDS)}

# Short leases: --lease-ttl 0.5 --lease-slack 0.2 and a 1 s default deadline give a 1.2 s lease
# (R5: the lease covers the deadline); reapers run every 0.1 s in every worker.
LEASE_TTL_S = 0.5
LEASE_SLACK_S = 0.2
DEFAULT_TIMEOUT_S = 1.0
LEASE_S = max(LEASE_TTL_S, DEFAULT_TIMEOUT_S + LEASE_SLACK_S)
REAP_INTERVAL_S = 0.1
SHORT_LEASES = (
    "--lease-ttl",
    str(LEASE_TTL_S),
    "--lease-slack",
    str(LEASE_SLACK_S),
    "--default-timeout",
    str(DEFAULT_TIMEOUT_S),
)


def fault_worker_argv(url: str, *extra: str, crash: bool = False) -> list[str]:
    """``taskward worker`` with short leases and the scenario task modules; with ``crash`` it
    runs under ``tests.faults.crashing`` (armed by ``TASKWARD_CRASH`` in its environment)."""
    argv = worker_argv(url, *SHORT_LEASES, *extra, imports=MODULES)
    if crash:
        assert argv[1:3] == ["-m", "taskward.cli.main"]
        argv[2] = "tests.faults.crashing"
    return argv


def cli_argv(url: str, *args: str, crash: bool = False) -> list[str]:
    """Any other ``taskward`` command (``task submit``, ``task cancel``), optionally crash-armed."""
    module = "tests.faults.crashing" if crash else "taskward.cli.main"
    imports = [arg for module_name in MODULES for arg in ("--import", module_name)]
    return [PYTHON, "-m", module, "--db", url, *imports, *args]


def process_env(crash: str | None = None, **extra: str) -> dict[str, str]:
    env = {**os.environ, **WORKER_ENV, **extra}
    env.pop(CRASH_ENV, None)
    if crash:
        env[CRASH_ENV] = crash
    return env


async def submit(
    db: StateDB, kind: str, args: dict[str, Any] | None = None, *, key: str | None = None
) -> str:
    app = taskward.TaskApplication(
        action_kind=kind,
        args=args or {},
        execution_target="host",
        idempotency_key=key or f"fault-{uuid.uuid4()}",
    )
    return await taskward.submit_task(db, app, registry=REGISTRY)


async def submit_many(
    db: StateDB, kind: str, count: int, args: dict[str, Any] | None = None
) -> dict[str, str]:
    """Admit ``count`` tasks in bulk; returns idempotency key -> task id (the acknowledgements)."""
    keys = [f"fault-{uuid.uuid4()}" for _ in range(count)]
    acknowledged: dict[str, str] = {}
    for start in range(0, count, 1000):
        chunk = keys[start : start + 1000]
        apps = [
            taskward.TaskApplication(
                action_kind=kind, args=args or {}, execution_target="host", idempotency_key=key
            )
            for key in chunk
        ]
        ids = await taskward.submit_tasks(db, apps, registry=REGISTRY)
        acknowledged.update(zip(chunk, ids, strict=True))
    return acknowledged


# -- worker processes under a supervisor --------------------------------------------------------


@dataclass
class Slot:
    """One supervised worker position: the process now in it and how often it was restarted."""

    index: int
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    exits: list[int] = field(default_factory=list)


class Supervisor:
    """Keeps one worker process per slot running: whatever ended (a SIGKILL, a crash) is started
    again by ``restart_dead``. Output goes to a log file per process start (a pipe could fill)."""

    def __init__(self, argvs: Sequence[list[str]], log_dir: Path, env: dict[str, str]) -> None:
        self.slots = [Slot(i, list(argv), dict(env)) for i, argv in enumerate(argvs)]
        self.log_dir = log_dir
        self.kills = 0
        self.restarts = 0
        self._rng = random.Random(0x7A5C)

    def _start(self, slot: Slot) -> None:
        slot.starts += 1
        log = (self.log_dir / f"worker-{slot.index}-{slot.starts}.log").open("wb")
        with log:
            slot.proc = subprocess.Popen(
                slot.argv,
                cwd=ROOT,
                env=slot.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(self) -> None:
        for slot in self.slots:
            self._start(slot)

    def live(self) -> list[Slot]:
        return [s for s in self.slots if s.proc is not None and s.proc.poll() is None]

    async def serving(self, db: StateDB) -> list[Slot]:
        """Live workers that registered a heartbeat: started up and claiming."""
        pids = {row["pid"] for row in await db.fetchall("worker_list", {"limit": 1000})}
        return [s for s in self.live() if s.proc is not None and s.proc.pid in pids]

    def kill_random(self, candidates: Sequence[Slot] | None = None) -> Slot:
        """SIGKILL the process group of a random live worker (it is restarted later)."""
        slot = self._rng.choice(list(candidates) if candidates is not None else self.live())
        assert slot.proc is not None
        with _gone_ok():
            os.killpg(slot.proc.pid, signal.SIGKILL)
        slot.proc.wait()
        self.kills += 1
        return slot

    def restart_dead(self) -> int:
        """Start every slot whose process ended; returns how many were started."""
        started = 0
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is not None:
                slot.exits.append(slot.proc.returncode)
                self._start(slot)
                started += 1
        self.restarts += started
        return started

    async def stop_when_serving(self, db: StateDB, timeout: float = 60.0) -> list[int]:
        """``stop`` once every live worker is serving: one still starting up has no signal
        handler yet, and SIGTERM would end it at once (-15) rather than drain it."""
        await wait_until(
            lambda: self._all_serving(db), timeout=timeout, what="every worker to serve"
        )
        return await asyncio.to_thread(self.stop, timeout)

    async def _all_serving(self, db: StateDB) -> bool:
        return len(await self.serving(db)) == len(self.live())

    def stop(self, timeout: float = 60.0) -> list[int]:
        """SIGTERM every worker (a drain) and wait; returns their exit codes."""
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                with _gone_ok():
                    os.killpg(slot.proc.pid, signal.SIGTERM)
        codes = []
        for slot in self.slots:
            if slot.proc is not None:
                codes.append(slot.proc.wait(timeout=timeout))
        return codes

    def kill_all(self) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                with _gone_ok():
                    os.killpg(slot.proc.pid, signal.SIGKILL)
                slot.proc.wait()

    def logs(self, tail: int = 3000) -> str:
        parts = []
        for path in sorted(self.log_dir.glob("worker-*.log")):
            text = path.read_text(errors="replace")
            if text.strip():
                parts.append(f"--- {path.name}\n{text[-tail:]}")
        return "\n".join(parts[-8:])


def _gone_ok() -> contextlib.suppress:
    return contextlib.suppress(ProcessLookupError)


@contextmanager
def supervised(
    argvs: Sequence[list[str]], log_dir: Path, env: dict[str, str] | None = None
) -> Iterator[Supervisor]:
    log_dir.mkdir(parents=True, exist_ok=True)
    supervisor = Supervisor(argvs, log_dir, env or process_env())
    supervisor.start()
    try:
        yield supervisor
    finally:
        supervisor.kill_all()


def run_to_exit(
    argv: list[str], env: dict[str, str], *, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run one process to its end (it is killed, group and all, after ``timeout``)."""
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"{argv[2:6]} still running after {timeout}s:\n{err[-3000:]}"
        ) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


async def run_to_exit_async(
    argv: list[str], env: dict[str, str], *, timeout: float
) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run_to_exit, argv, env, timeout=timeout)


# -- the outcome ----------------------------------------------------------------------------------


async def all_tasks(db: StateDB) -> list[Row]:
    rows, cursor = await taskward.list_tasks(db, limit=500)
    while cursor:
        page, cursor = await taskward.list_tasks(db, limit=500, cursor=cursor)
        rows += page
    return rows


async def statuses(db: StateDB, task_id: str) -> list[str]:
    return [f["status"] for f in await taskward.list_transitions(db, task_id)]


async def count(db: StateDB, status: str) -> int:
    return (await taskward.reads.count_by_status(db)).get(status, 0)


async def settle_and_check(
    db: StateDB,
    *,
    acknowledged: dict[str, str] | None = None,
    outbox_purged: bool = False,
) -> None:
    """After quiescence: reapers with ``now`` past every lease, deadline and retry, then the
    invariant checker (issue 8)."""
    rows = await all_tasks(db)
    horizon = max(
        [await db.now()]
        + [float(r[c]) for r in rows for c in ("lease_expires_at", "retry_at") if r.get(c)]
    )
    now = horizon + 3600.0
    policy = RetryPolicy(base_s=0.0, jitter=0.0)
    for _ in range(3):  # expire, promote, and end a retry promoted at its own ceiling
        await reap_expired_leases(db, now=now, retry_policy=policy)
        await reap_deadlines(db, now=now)
    await assert_invariants(db, acknowledged=acknowledged, now=now, outbox_purged=outbox_purged)


def monotonic() -> float:
    return time.monotonic()


async def run_clean_worker(
    db: StateDB,
    until: Callable[[], Awaitable[bool]],
    *,
    timeout: float,
    what: str,
    concurrency: int = 4,
) -> None:
    """A clean worker (the ``taskward worker`` runtime, no crash point, short leases) in this
    process, on ``db``, until ``until()`` holds; then it drains and stops."""
    config = WorkerConfig(
        concurrency=concurrency,
        lease_ttl=LEASE_TTL_S,
        lease_slack_s=LEASE_SLACK_S,
        default_timeout_s=DEFAULT_TIMEOUT_S,
        heartbeat_interval_s=0.2,
        reap_interval_s=REAP_INTERVAL_S,
        idle_wait_s=0.1,
        cancel_poll_s=0.2,
        retry_policy=RetryPolicy(base_s=0.01),
        run_scheduler=False,
        deliver_outbox=False,
    )
    runtime = WorkerRuntime(db, REGISTRY, config)
    serving = asyncio.create_task(runtime.run())
    try:
        await wait_until(until, timeout=timeout, what=what)
    finally:
        runtime.request_stop()
        code = await asyncio.wait_for(serving, timeout=30)
    assert code == 0


async def all_terminal(db: StateDB) -> bool:
    counts = await taskward.reads.count_by_status(db)
    return not any(counts.get(s.value, 0) for s in ACTIVE)
