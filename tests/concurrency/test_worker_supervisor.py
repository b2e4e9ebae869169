"""``taskward worker --processes N`` (R26) with real processes.

The first tests run the ``Supervisor`` over tiny Python children (no store) to pin its restart
and signal policy; the rest run the real command on both backends: a burst drain shared by two
children, a SIGKILLed child restarted and its tasks recovered after lease expiry, a
memory-pressure restart, a drain on the first SIGTERM and a cancellation on the second. Waits
are on a database condition or a supervisor log line, with a generous timeout; leases are short
and never waited out by a sleep.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

import taskward
from taskward.adapters import AdapterConfig, build_registry
from taskward.checker import assert_invariants
from taskward.lifecycle import TERMINAL
from taskward.store.port import StateDB
from taskward.supervisor import EXIT_CHILD_FAILED, RestartBackoff, Supervisor
from tests.worker_procs import ROOT, wait_until, worker_argv

MODULE = "tests.integration.worker_tasks"
REGISTRY = build_registry(AdapterConfig(imports=(MODULE,)))
STARTED = re.compile(r"child (\d+) started: pid (\d+), worker (\S+)")

pytestmark = pytest.mark.slow


# -- the supervisor over tiny children: its policy, without a store ------------------------------


def _fast_backoff() -> RestartBackoff:
    return RestartBackoff(initial_s=0.01, cap_s=0.05)


def _child(script: str) -> list[str]:
    """A child running ``script``; the supervisor appends ``--worker-id <id>`` (sys.argv[2])."""
    return [sys.executable, "-c", script]


async def _supervise(script: str, processes: int = 1, **kwargs: object) -> tuple[int, list[str]]:
    lines: list[str] = []
    supervisor = Supervisor(
        _child(script),
        processes,
        backoff=_fast_backoff,
        log=lines.append,
        **kwargs,  # type: ignore[arg-type]
    )
    code = await asyncio.wait_for(supervisor.run(), 60)
    return code, lines


async def test_a_crashed_child_is_restarted_and_one_that_exits_0_is_not(tmp_path: Path) -> None:
    marker = tmp_path / "crashed"
    script = (
        "import pathlib, sys; p = pathlib.Path(sys.argv[1])\n"
        "if not p.exists(): p.write_text('x'); sys.exit(3)\n"
    )
    code, lines = await _supervise(script.replace("sys.argv[1]", repr(str(marker))))
    assert code == 0
    assert any("exited 3:" in line and "restarting in 0.01s" in line for line in lines), lines
    assert any("exited 0:" in line and "not restarted" in line for line in lines), lines
    assert len([line for line in lines if STARTED.search(line)]) == 2


async def test_exit_75_restarts_at_once_and_a_signal_death_with_backoff(tmp_path: Path) -> None:
    count = tmp_path / "count"
    script = (
        f"import os, pathlib, signal, sys; p = pathlib.Path({str(count)!r})\n"
        "n = int(p.read_text()) if p.exists() else 0; p.write_text(str(n + 1))\n"
        "if n == 0: sys.exit(75)\n"
        "if n == 1: os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    code, lines = await _supervise(script)
    assert code == 0
    exits = [line for line in lines if "exited" in line]
    assert "exited 75 (memory pressure)" in exits[0] and "restarting at once" in exits[0]
    assert "exited -9 (killed by SIGKILL)" in exits[1] and "restarting in 0.01s" in exits[1]
    assert "exited 0" in exits[2] and "not restarted" in exits[2]
    ids = [m.group(3) for line in lines if (m := STARTED.search(line))]
    assert len(ids) == len(set(ids)) == 3, ids  # every start has its own worker id


async def test_the_worker_id_prefix_names_every_start(tmp_path: Path) -> None:
    script = "import sys; open(sys.argv[2] + '.seen', 'w')\n"
    supervisor = Supervisor(
        _child(script), 3, worker_id_prefix=str(tmp_path / "w"), log=lambda _: None
    )
    assert await asyncio.wait_for(supervisor.run(), 60) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w-1.seen", "w-2.seen", "w-3.seen"]


SIGNAL_COUNTER = """
import os, pathlib, signal, sys, time
out = pathlib.Path(sys.argv[2] + ".signals")
got = []
def on(sig, _):
    got.append(signal.Signals(sig).name)
    out.write_text(" ".join(got))
signal.signal(signal.SIGTERM, on)
signal.signal(signal.SIGINT, on)
pathlib.Path(sys.argv[2] + ".ready").write_text("")
while len(got) < 2:
    time.sleep(0.01)
"""


async def test_the_first_signal_is_a_sigterm_to_each_child_and_a_second_a_sigint(
    tmp_path: Path,
) -> None:
    prefix = tmp_path / "w"
    lines: list[str] = []
    supervisor = Supervisor(
        _child(SIGNAL_COUNTER), 2, worker_id_prefix=str(prefix), log=lines.append
    )
    run = asyncio.create_task(supervisor.run())
    ready = [Path(f"{prefix}-{n}.ready") for n in (1, 2)]
    await wait_until(
        lambda: _true(all(p.exists() for p in ready)), timeout=30, what="children ready"
    )
    supervisor.request_stop(signal.SIGINT)
    # the second at once: sent as SIGINT, it cannot merge with a SIGTERM still pending
    supervisor.request_stop(signal.SIGTERM)
    assert await asyncio.wait_for(run, 30) == 0
    for n in (1, 2):
        # both arrive (pending together they are taken in signal-number order: SIGINT first)
        assert sorted(Path(f"{prefix}-{n}.signals").read_text().split()) == ["SIGINT", "SIGTERM"]
    assert sum("stopping" in line for line in lines) == 2, lines
    assert not any("restart" in line for line in lines), lines


async def test_a_child_that_crashes_while_stopping_makes_the_exit_non_zero(
    tmp_path: Path,
) -> None:
    script = (
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(4))\n"
        "pathlib.Path(sys.argv[2]).write_text('')\n"
        "time.sleep(60)\n"
    )
    supervisor = Supervisor(_child(script), 1, worker_id_prefix=str(tmp_path / "w"), log=print)
    run = asyncio.create_task(supervisor.run())
    await wait_until(
        lambda: _true((tmp_path / "w-1").exists()), timeout=30, what="the child to start"
    )
    supervisor.request_stop(signal.SIGTERM)
    assert await asyncio.wait_for(run, 30) == EXIT_CHILD_FAILED


async def test_a_child_ended_by_the_forwarded_sigterm_before_its_handlers_is_clean() -> None:
    lines: list[str] = []
    supervisor = Supervisor(_child("import time; time.sleep(60)"), 2, log=lines.append)
    run = asyncio.create_task(supervisor.run())
    await wait_until(lambda: _true(len(supervisor.live) == 2), timeout=30, what="two children")
    supervisor.request_stop(signal.SIGTERM)
    assert await asyncio.wait_for(run, 30) == 0, lines
    assert sum("exited -15 (killed by SIGTERM)" in line for line in lines) == 2, lines


async def _true(value: bool) -> bool:
    return value


# -- the real command: taskward worker --processes 2 ---------------------------------------------


@dataclass
class SupervisorProc:
    """A ``taskward worker --processes N`` process, its stderr going to a file read as it grows."""

    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        """The supervisor's lines (its children write their own lines to the same stderr)."""
        text = self.log_path.read_text(errors="replace")
        return "\n".join(line for line in text.splitlines() if " supervisor: " in line)

    def full_log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def starts(self) -> list[tuple[int, int, str]]:
        """(slot, pid, worker id) of every child start so far, in order."""
        return [(int(slot), int(pid), wid) for slot, pid, wid in STARTED.findall(self.log())]

    async def wait_log(self, pattern: str, *, count: int = 1, timeout: float = 60) -> None:
        await wait_until(
            lambda: _true(len(re.findall(pattern, self.log())) >= count),
            timeout=timeout,
            what=f"{count} supervisor log line(s) matching {pattern!r}",
        )

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"supervisor still running after {timeout}s:\n{self.full_log()}"
            ) from None


@contextmanager
def supervisor(argv: list[str], tmp_path: Path) -> Iterator[SupervisorProc]:
    """Start the supervisor in a session of its own; on exit SIGKILL it and every child it
    logged (children run in process groups of their own)."""
    log_path = tmp_path / f"supervisor-{uuid.uuid4().hex[:6]}.log"
    with log_path.open("wb") as err:
        proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
        )
    running = SupervisorProc(proc, log_path)
    try:
        yield running
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        exited = {int(pid) for pid in re.findall(r"exited .*: pid (\d+),", running.log())}
        for _, pid, _ in running.starts():
            if pid not in exited:  # a child the supervisor did not see end (it was killed)
                with suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)


async def submit(db: StateDB, kind: str, args: dict[str, object]) -> str:
    app = taskward.TaskApplication(
        action_kind=kind, args=args, execution_target="host", idempotency_key=f"k-{uuid.uuid4()}"
    )
    return await taskward.submit_task(db, app, registry=REGISTRY)


async def all_rows(db: StateDB) -> list[dict[str, object]]:
    page, cursor = await taskward.list_tasks(db, limit=500)
    rows = list(page)
    while cursor:
        page, cursor = await taskward.list_tasks(db, limit=500, cursor=cursor)
        rows += page
    return rows


async def claimers_and_terminals(db: StateDB, task_ids: list[str]) -> tuple[set[str], list[int]]:
    """The worker ids that claimed the tasks (from their ``running`` facts' lease ids) and each
    task's number of terminal facts."""
    claimers: set[str] = set()
    terminals = []
    for task_id in task_ids:
        facts = await taskward.list_transitions(db, task_id)
        claimers |= {f["lease_id"].rsplit("/", 1)[0] for f in facts if f["status"] == "running"}
        terminals.append(sum(f["status"] in TERMINAL for f in facts))
    return claimers, terminals


async def count_status(db: StateDB, status: str) -> int:
    return (await taskward.reads.count_by_status(db))[status]


async def test_two_processes_in_burst_mode_drain_every_task_exactly_once(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    total = 40
    ids = [await submit(db, "nap", {"seconds": 0.2}) for _ in range(total)]
    argv = worker_argv(db_url, "--processes", "2", "--concurrency", "2", "--burst")
    with supervisor(argv, tmp_path) as running:
        assert running.wait(timeout=120) == 0, running.log()
        log = running.log()
    assert await count_status(db, "completed") == total, log
    claimers, terminals = await claimers_and_terminals(db, ids)
    assert terminals == [1] * total
    assert len(claimers) >= 2, (claimers, log)  # the work really was shared
    assert claimers <= {worker_id for _, _, worker_id in running.starts()}
    assert len(re.findall(r"exited 0: .*not restarted", log)) == 2, log
    await assert_invariants(db)


async def test_a_sigkilled_child_is_restarted_and_its_tasks_recovered_after_lease_expiry(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    total = 24
    ids = [await submit(db, "nap", {"seconds": 0.3, "timeout_s": 1.0}) for _ in range(total)]
    short = ["--lease-ttl", "0.5", "--lease-slack", "0.3"]
    argv = worker_argv(db_url, "--processes", "2", "--concurrency", "2", *short)
    with supervisor(argv, tmp_path) as running:
        await running.wait_log(r"child \d+ started", count=2)
        [(slot, victim_pid, victim_id), *_] = running.starts()
        await wait_until(
            lambda: _holds_a_lease(db, victim_id),
            timeout=60,
            what=f"{victim_id} to hold a task",
        )
        os.kill(victim_pid, signal.SIGKILL)
        await running.wait_log(rf"child {slot} exited -9 \(killed by SIGKILL\).*restarting in")
        await running.wait_log(rf"child {slot} started", count=2)
        await wait_until(lambda: _completed(db, total), timeout=90, what=f"{total} completions")
        os.kill(running.proc.pid, signal.SIGTERM)
        assert running.wait(timeout=60) == 0, running.log()
    restarted = [(pid, wid) for s, pid, wid in running.starts() if s == slot]
    assert len(restarted) == 2
    assert restarted[1][0] != victim_pid and restarted[1][1] != victim_id
    claimers, terminals = await claimers_and_terminals(db, ids)
    assert terminals == [1] * total  # nothing lost, nothing finished twice
    assert victim_id in claimers
    recovered = [
        f
        for task_id in ids
        for f in await taskward.list_transitions(db, task_id)
        if f["reason_code"] == "lease_expired"
    ]
    assert recovered, "the killed child's task came back through lease expiry"
    await assert_invariants(db)


async def _holds_a_lease(db: StateDB, worker_id: str) -> bool:
    rows = await all_rows(db)
    return any(r["status"] == "running" and r["leased_by"] == worker_id for r in rows)


async def _completed(db: StateDB, total: int) -> bool:
    return await count_status(db, "completed") == total


async def test_a_child_over_its_memory_limit_exits_75_and_is_restarted_at_once(
    db_url: str, tmp_path: Path
) -> None:
    argv = worker_argv(db_url, "--processes", "2", "--memory-limit-mb", "1")
    with supervisor(argv, tmp_path) as running:
        await running.wait_log(r"exited 75 \(memory pressure\).*restarting at once")
        await running.wait_log(r"child \d+ started", count=3)
        os.kill(running.proc.pid, signal.SIGTERM)
        # a drain: whatever each child was doing (exiting 75, starting) counts as clean
        assert running.wait(timeout=60) == 0, running.log()
        log = running.log()
    assert "SIGTERM: draining" in log
    assert "restarting in" not in log, log  # 75 is never a crash


async def test_the_first_sigterm_drains_every_child_and_the_supervisor_exits_0(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    ids = [await submit(db, "nap", {"seconds": 1.0, "timeout_s": 30}) for _ in range(12)]
    argv = worker_argv(db_url, "--processes", "2", "--concurrency", "2")
    with supervisor(argv, tmp_path) as running:
        await running.wait_log(r"child \d+ started", count=2)
        child_ids = {worker_id for _, _, worker_id in running.starts()}
        await wait_until(
            lambda: _both_hold_leases(db, child_ids), timeout=60, what="both children to claim"
        )
        # each child leads a process group of its own: a terminal's Ctrl-C reaches only the
        # supervisor, and a child sees only the signals it forwards
        for _, pid, _ in running.starts():
            assert os.getpgid(pid) == pid != os.getpgid(running.proc.pid)
        os.kill(running.proc.pid, signal.SIGTERM)
        began = time.monotonic()
        assert running.wait(timeout=60) == 0, running.log()
        log = running.log()
    assert time.monotonic() - began < 30
    assert "SIGTERM: draining 2 worker process(es)" in log
    assert len(re.findall(r"exited 0: .*stopping", log)) == 2, log
    assert "restart" not in log
    rows = {r["id"]: r for r in await all_rows(db)}
    ran = [task_id for task_id in ids if rows[task_id]["status"] != "queued"]
    assert len(ran) >= 2
    for task_id in ids:
        facts = [f["status"] for f in await taskward.list_transitions(db, task_id)]
        # a task that had started finished (a drain, not a cancel); the rest were left queued
        assert facts in (["running", "completed"], []), (task_id, facts)
    await assert_invariants(db)


async def _both_hold_leases(db: StateDB, worker_ids: set[str]) -> bool:
    rows = await all_rows(db)
    return {r["leased_by"] for r in rows if r["status"] == "running"} >= worker_ids


async def test_a_second_sigterm_cancels_the_running_tasks_of_every_child(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    ids = [await submit(db, "nap", {"seconds": 60.0, "timeout_s": 120}) for _ in range(4)]
    argv = worker_argv(db_url, "--processes", "2", "--concurrency", "2")
    with supervisor(argv, tmp_path) as running:
        await running.wait_log(r"child \d+ started", count=2)
        child_ids = {worker_id for _, _, worker_id in running.starts()}
        await wait_until(
            lambda: _both_hold_leases(db, child_ids), timeout=60, what="both children to claim"
        )
        os.kill(running.proc.pid, signal.SIGTERM)
        await running.wait_log(r"SIGTERM: draining")
        os.kill(running.proc.pid, signal.SIGTERM)
        assert running.wait(timeout=60) == 0, running.full_log()
        log = running.log()
    assert "SIGTERM: cancelling" in log
    assert len(re.findall(r"exited 0: .*stopping", log)) == 2, log
    cancelled = 0
    for task_id in ids:
        facts = await taskward.list_transitions(db, task_id)
        if facts:  # a claimed task went back to the queue, retryable; none finished
            statuses = [f["status"] for f in facts]
            assert statuses[:2] == ["running", "retry_wait"], statuses
            assert statuses[2:] in ([], ["queued"]), statuses  # due now: a reaper may requeue it
            assert facts[1]["reason_code"] == "host_shutdown"
            cancelled += 1
    assert cancelled >= 2
    await assert_invariants(db)
