"""Issue 8 scenario 6: SIGTERM drains a busy host (ADR-0037 D3/D5).

A worker holds as many running tasks as it has slots and has more queued behind them. SIGTERM
stops its claims, lets every running task finish and acknowledge, and exits 0; the queued tasks
stay queued, never claimed, until the next worker runs them. Nothing is lost and nothing is
reported as a shutdown.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

import taskward
from taskward.settings import set_max_attempts
from taskward.store.port import StateDB
from tests.faults.support import (
    all_tasks,
    cli_argv,
    fault_worker_argv,
    process_env,
    run_to_exit_async,
    settle_and_check,
    submit,
    submit_many,
)
from tests.worker_procs import ROOT, wait_until

pytestmark = pytest.mark.slow

SLOTS = 8
QUEUED_BEHIND = 16
NAP_S = 0.8


async def test_sigterm_drains_a_busy_host_finishing_every_running_task(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    acknowledged = await submit_many(
        db, "nap", SLOTS + QUEUED_BEHIND, {"seconds": NAP_S, "timeout_s": 30}
    )
    argv = fault_worker_argv(db_url, "--concurrency", str(SLOTS), "--worker-id", "host:d7a1d7a1")
    log = (tmp_path / "worker.log").open("w+")
    host = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=process_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        await wait_until(
            lambda: _running(db, SLOTS), timeout=60, what=f"{SLOTS} tasks to be running"
        )
        running = {r["id"] for r in await all_tasks(db) if r["status"] == "running"}
        assert len(running) == SLOTS  # a full host: it claims nothing more until a slot frees
        signalled = time.monotonic()
        os.killpg(host.pid, signal.SIGTERM)
        code = host.wait(timeout=60)
        drained_in = time.monotonic() - signalled
    finally:
        if host.poll() is None:
            os.killpg(host.pid, signal.SIGKILL)
            host.wait()
        log.seek(0)
        output = log.read()
        log.close()
    assert code == 0, output
    assert drained_in < NAP_S + 10, drained_in
    assert "stopped (signal)" in output and "acknowledgements rejected 0" in output, output

    rows = {r["id"]: r for r in await all_tasks(db)}
    for task_id in running:  # every active task ran to its end: no shutdown, no retry
        facts = await taskward.list_transitions(db, task_id)
        assert [(f["status"], f["reason_code"]) for f in facts] == [
            ("running", "claimed"),
            ("completed", "completed"),
        ], task_id
    behind = [task_id for task_id in rows if task_id not in running]
    for task_id in behind:  # never claimed after the signal: still queued, no attempt spent
        assert rows[task_id]["status"] == "queued" and rows[task_id]["lease_attempts"] == 0

    # the next worker runs the rest: nothing was lost
    burst = await run_to_exit_async(
        fault_worker_argv(db_url, "--concurrency", str(SLOTS), "--burst"),
        process_env(),
        timeout=120,
    )
    assert burst.returncode == 0, burst.stderr[-3000:]
    for task_id in behind:
        assert [f["status"] for f in await taskward.list_transitions(db, task_id)] == [
            "running",
            "completed",
        ]
    await settle_and_check(db, acknowledged=acknowledged)


async def _running(db: StateDB, n: int) -> bool:
    return (await taskward.reads.count_by_status(db)).get("running", 0) >= n


async def test_a_second_sigterm_sends_the_running_tasks_back_to_the_queue(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    """The second signal cancels the running tasks cooperatively: each reports a retryable
    host shutdown (R10), never a cancelled task, and the next worker completes it."""
    markers = tmp_path / "markers"
    markers.mkdir()
    ids = [
        await submit(db, "hang_first", {"marker": str(markers / str(i)), "seconds": 60})
        for i in range(SLOTS)
    ]
    argv = fault_worker_argv(db_url, "--concurrency", str(SLOTS), "--default-timeout", "60")
    host = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=process_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        await wait_until(
            lambda: _started(markers, SLOTS), timeout=60, what="every first attempt to start"
        )
        os.killpg(host.pid, signal.SIGTERM)  # drain: the tasks would run for a minute
        # the second signal (repeated: two signals sent at once may arrive as one)
        await wait_until(lambda: _signalled_until_exit(host), timeout=30, what="the exit")
        _, err = host.communicate(timeout=30)
    finally:
        if host.poll() is None:
            os.killpg(host.pid, signal.SIGKILL)
            host.communicate()
    assert host.returncode == 0, err[-3000:]
    for task_id in ids:
        row = await taskward.get_task(db, task_id)
        facts = await taskward.list_transitions(db, task_id)
        steps = [(f["status"], f["reason_code"]) for f in facts]
        # The retry is due at once (R10), so the host's own promoter may move it back to
        # queued in the moment between the release and the exit: that fact is optional.
        assert steps[:2] == [("running", "claimed"), ("retry_wait", "host_shutdown")], task_id
        assert steps[2:] in ([], [("queued", "retry_ready")]), (task_id, steps)
        if len(steps) == 2:
            assert row["retry_at"] <= facts[1]["created_at"]  # due at once
    burst = await run_to_exit_async(
        fault_worker_argv(db_url, "--concurrency", str(SLOTS), "--burst"),
        process_env(),
        timeout=120,
    )
    assert burst.returncode == 0, burst.stderr[-3000:]
    for task_id in ids:
        assert (await taskward.get_task(db, task_id))["status"] == "completed"
    await settle_and_check(db)


async def _started(markers: Path, n: int) -> bool:
    return len(list(markers.iterdir())) >= n


async def _signalled_until_exit(proc: subprocess.Popen[str]) -> bool:
    if proc.poll() is not None:
        return True
    os.killpg(proc.pid, signal.SIGTERM)
    await asyncio.sleep(0.25)
    return proc.poll() is not None


async def test_taskward_up_exits_on_sigterm_despite_a_task_thread_blocked_past_its_deadline(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'up.db'}"
    async with taskward.open_db(url) as db:
        await set_max_attempts(db, 1)
        task_id = await submit(db, "hang_in_thread", {"seconds": 30, "timeout_s": 0.5})
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        argv = cli_argv(url, "up", "--port", str(port))
        service = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=process_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            await wait_until(
                lambda: _status_is(db, task_id, "timed_out"), timeout=60, what="the deadline"
            )
            os.killpg(service.pid, signal.SIGTERM)
            code = await asyncio.to_thread(service.wait, 8)
        finally:
            if service.poll() is None:
                os.killpg(service.pid, signal.SIGKILL)
                service.wait()
    assert code == 0


async def _status_is(db: StateDB, task_id: str, status: str) -> bool:
    return (await taskward.get_task(db, task_id))["status"] == status
