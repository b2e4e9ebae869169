"""Issue 8 scenario 3: a crash at every commit boundary -- admission, claim, adapter run, summary,
complete, outbox send, reaper, cancel -- then a clean worker, and everything converges.

Each case runs a real process under ``tests.faults.crashing`` (a test-only wrapper of the store's
commits, nothing in ``src/``), armed to ``os._exit(137)`` right before or right after the first
commit of its boundary; then a clean worker (the ``taskward worker`` runtime, in this process)
recovers, and the case checks the exact history it expects and the invariant checker. A same-key
retry after a crash between an admission's (or a cancel's) commit and its reply returns the
original answer. Cases run side by side, each on a store of its own.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import taskward
from taskward import Actor
from taskward.outbox import CommandTarget, OutboxConfig, OutboxDeliverer, list_notifications
from tests.conftest import StoreFactory
from tests.faults.crashing import CRASH_EXIT
from tests.faults.support import (
    CHAOS,
    PYTHON,
    all_terminal,
    cli_argv,
    fault_worker_argv,
    process_env,
    run_clean_worker,
    run_to_exit_async,
    settle_and_check,
    statuses,
    submit,
)

pytestmark = pytest.mark.slow

ONE_RUN = ["running", "completed"]
# the first lease was lost with its worker: reaped, queued again, run by the clean worker
TWO_RUNS = ["running", "retry_wait", "queued", "running", "completed"]
CRASH_TIMEOUT_S = 30.0
RECOVERY_TIMEOUT_S = 60.0
PARALLEL = 4


@dataclass(frozen=True)
class WorkerCase:
    """A worker process crashing at ``when``:``boundary``; then a clean worker recovers."""

    boundary: str
    when: str
    facts: list[str]
    executions: int  # how often the task's adapter ran in all (execution is at least once)
    deliveries: int = 0  # outbox cases: how often the notification reached its target
    first_summary: bool | None = None  # summary cases: whether attempt 1's summary exists
    prepare: str | None = None  # a crash that first orphans the task's lease (reaper cases)

    @property
    def name(self) -> str:
        return f"{self.when}:{self.boundary}"


WORKER_CASES = [
    WorkerCase("claim", "before", ONE_RUN, 1),
    WorkerCase("claim", "after", TWO_RUNS, 1),
    WorkerCase("run", "before", TWO_RUNS, 1),
    WorkerCase("run", "after", TWO_RUNS, 2),
    WorkerCase("summary", "before", TWO_RUNS, 2, first_summary=False),
    # The worker commits a task's summary with its completion (and the next lease for the slot)
    # in one transaction (LocalTaskSource.complete_with_summary): right after the summary's
    # commit the task is already completed. Never completed without its summary (D4).
    WorkerCase("summary", "after", ONE_RUN, 1, first_summary=True),
    WorkerCase("complete", "before", TWO_RUNS, 2),
    WorkerCase("complete", "after", ONE_RUN, 1),
    WorkerCase("outbox_claim", "before", ONE_RUN, 1, deliveries=1),
    WorkerCase("outbox_claim", "after", ONE_RUN, 1, deliveries=1),
    WorkerCase("outbox_ack", "before", ONE_RUN, 1, deliveries=2),  # sent, unrecorded: resent
    WorkerCase("outbox_ack", "after", ONE_RUN, 1, deliveries=1),
    WorkerCase("reap", "before", TWO_RUNS, 1, prepare="after:claim:1"),
    WorkerCase("reap", "after", TWO_RUNS, 1, prepare="after:claim:1"),
    WorkerCase("promote", "after", TWO_RUNS, 1, prepare="after:claim:1"),
]


def _notify_argv(log: Path) -> list[str]:
    """An outbox command target that records every notification it receives."""
    code = (
        "import os, sys; sys.stdin.read(); "
        f"open({str(log)!r}, 'a').write(os.environ['TASKWARD_NOTIFICATION_ID'] + '\\n')"
    )
    return [PYTHON, "-c", code]


async def _crash(argv: list[str], spec: str, **env: str) -> subprocess.CompletedProcess[str]:
    proc = await run_to_exit_async(argv, process_env(spec, **env), timeout=CRASH_TIMEOUT_S)
    assert proc.returncode == CRASH_EXIT, (spec, proc.returncode, proc.stderr[-2000:])
    when, boundary, _ = spec.split(":")
    assert f"taskward-crash: {when} {boundary}" in proc.stderr
    return proc


async def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


async def _worker_case(case: WorkerCase, url: str, work: Path) -> int:
    """Returns the number of crashes injected."""
    work.mkdir(parents=True)
    ran, delivered = work / "ran", work / "delivered"
    notify = _notify_argv(delivered)
    env = {"TASKWARD_NOTIFY_COMMAND": json.dumps(notify), "TASKWARD_NOTIFY_COMMAND_TIMEOUT_S": "5"}
    crashes = 0
    async with taskward.open_db(url) as db:
        task_id = await submit(db, "append_line", {"path": str(ran)})
        if case.prepare:
            await _crash(fault_worker_argv(url, crash=True), case.prepare, **env)
            crashes += 1
        await _crash(fault_worker_argv(url, crash=True), f"{case.name}:1", **env)
        crashes += 1
        await run_clean_worker(
            db, lambda: all_terminal(db), timeout=RECOVERY_TIMEOUT_S, what=f"{case.name} recovery"
        )
        assert await statuses(db, task_id) == case.facts
        assert await _lines(ran) == case.executions
        if case.first_summary is not None:
            first = await db.fetchone("summary_get", {"session_key": f"{task_id}:1"})
            assert (first is not None and first["state"] == "complete") == case.first_summary
        if case.deliveries:
            # the clean deliverer, at a time past every delivery lease the crash left behind
            deliverer = OutboxDeliverer(db, OutboxConfig(targets=(CommandTarget(tuple(notify)),)))
            await deliverer.run_once(now=await db.now() + 3600)
            [row], _ = await list_notifications(db)
            assert row["status"] == "delivered"
            assert (await asyncio.to_thread(delivered.read_text)).split() == [
                row["id"]
            ] * case.deliveries
        await settle_and_check(db)
    return crashes


async def _admission_case(when: str, url: str, work: Path) -> int:
    work.mkdir(parents=True)
    key = f"crash-admission-{when}"
    args = {"path": str(work / "ran")}
    submit_argv = cli_argv(
        url, "task", "submit", "append_line", "--args", json.dumps(args), "--key", key, crash=True
    )
    async with taskward.open_db(url) as db:
        proc = await _crash(submit_argv, f"{when}:admission:1")
        assert proc.stdout == ""  # no reply reached the caller
        before = await db.fetchone("run_get_by_key", {"idempotency_key": key})
        assert (before is not None) == (when == "after")
        # the caller retries with the same key: the original row's id, and still one row
        task_id = await submit(db, "append_line", args, key=key)
        if before is not None:
            assert task_id == before["id"]
        await run_clean_worker(db, lambda: all_terminal(db), timeout=60, what="admitted task")
        assert await statuses(db, task_id) == ONE_RUN
        await settle_and_check(db, acknowledged={key: task_id})
    return 1


async def _cancel_case(when: str, running: bool, url: str, work: Path) -> int:
    work.mkdir(parents=True)
    key = f"crash-cancel-{when}"
    actor = Actor(type="operator", id="fault-test")
    async with taskward.open_db(url) as db:
        if running:
            started = {"marker": str(work / "started"), "timeout_s": 60}
            task_id = await submit(db, "wait_for_cancel", started)
            holder = asyncio.create_task(
                run_clean_worker(db, lambda: all_terminal(db), timeout=60, what="the cancel")
            )
            while not (work / "started").exists():
                await asyncio.sleep(0.05)
        else:
            task_id = await submit(db, "noop")
        argv = cli_argv(url, "task", "cancel", task_id, "--key", key, crash=True)
        await _crash(argv, f"{when}:cancel:1")
        # the operator retries with the same key: the original answer, or the first one applied
        result = await taskward.request_task_cancel(db, task_id, actor=actor, idempotency_key=key)
        if running:
            assert result.state == "cancellation_requested"
            await holder
            assert await statuses(db, task_id) == ["running", "cancelled"]
        else:
            assert result.state == "cancelled"
            assert await statuses(db, task_id) == ["cancelled"]
        assert len(await taskward.list_transitions(db, task_id)) == len(await statuses(db, task_id))
        await settle_and_check(db)
    return 1


async def test_a_crash_at_every_commit_boundary_converges_after_a_clean_restart(
    stores: StoreFactory, tmp_path: Path
) -> None:
    cases: dict[str, Callable[[str, Path], Awaitable[int]]] = {}
    for case in WORKER_CASES:
        cases[case.name] = lambda url, work, case=case: _worker_case(case, url, work)
    for when in ("before", "after"):
        cases[f"{when}:admission"] = lambda url, work, when=when: _admission_case(when, url, work)
        cases[f"{when}:cancel(queued)"] = lambda url, work, when=when: _cancel_case(
            when, False, url, work
        )
    cases["after:cancel(running)"] = lambda url, work: _cancel_case("after", True, url, work)
    gate = asyncio.Semaphore(PARALLEL)
    failures: dict[str, str] = {}
    crashes: list[int] = []

    async def one(name: str, run: Callable[[str, Path], Awaitable[int]]) -> None:
        async with gate:
            try:
                crashes.append(await run(stores.new_url(), tmp_path / name.replace(":", "-")))
            except Exception as exc:
                failures[name] = f"{type(exc).__name__}: {exc}"[:3000]

    await asyncio.gather(*(one(name, run) for name, run in cases.items()))
    assert failures == {}, "\n".join(f"{name}: {why}" for name, why in failures.items())
    print(f"\n{stores.backend}: {len(cases)} crash cases, {sum(crashes)} crashes injected")


@pytest.mark.chaos
@pytest.mark.parametrize("nth", [2, 3])
async def test_a_later_crash_at_every_boundary_converges_too(
    stores: StoreFactory, tmp_path: Path, nth: int
) -> None:
    """Long form: the n-th commit of each boundary, five tasks at once; only convergence and the
    checker are asserted (which task was caught mid-way varies)."""
    assert CHAOS
    failures: dict[str, str] = {}
    gate = asyncio.Semaphore(PARALLEL)

    async def one(boundary: str, when: str) -> None:
        url = stores.new_url()
        async with gate, taskward.open_db(url) as db:
            try:
                ids = [
                    await submit(db, "append_line", {"path": str(tmp_path / f"{boundary}-{when}")})
                    for _ in range(5)
                ]
                argv = fault_worker_argv(url, "--concurrency", "2", crash=True)
                spec = f"{when}:{boundary}:{nth}"
                proc = await run_to_exit_async(argv, process_env(spec), timeout=CRASH_TIMEOUT_S)
                assert proc.returncode == CRASH_EXIT, proc.stderr[-2000:]
                await run_clean_worker(db, lambda: all_terminal(db), timeout=120, what=spec)
                for task_id in ids:
                    assert (await statuses(db, task_id))[-1] == "completed"
                await settle_and_check(db)
            except Exception as exc:
                failures[f"{when}:{boundary}:{nth}"] = f"{type(exc).__name__}: {exc}"[:3000]

    await asyncio.gather(
        *(
            one(boundary, when)
            for boundary in ("claim", "run", "summary", "complete")
            for when in ("before", "after")
        )
    )
    assert failures == {}, "\n".join(f"{name}: {why}" for name, why in failures.items())
