"""``taskward up`` as a process: the first SIGTERM drains, only a second one cancels.

The banner, docs/http.md and ``taskward worker`` promise it: one signal stops the HTTP server
(it accepts no new connection; a request in flight is answered) and lets running tasks finish
and complete, then the process exits 0; a second signal cancels the running tasks
cooperatively and they go back to the queue (``retry_wait``, ``host_shutdown``, R10). Real
processes on both backends; every wait is on a condition (the store, the process, its log).
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
from pathlib import Path
from typing import IO

import httpx
import pytest

import taskward
from taskward.store import StateDB
from tests.worker_procs import wait_until

pytestmark = pytest.mark.slow

STOPPING = "stopping (a second signal cancels running tasks)"


def _start_up(db_url: str, log: IO[str], cwd: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKWARD_")}
    return subprocess.Popen(
        [sys.executable, "-m", "taskward.cli.main", "--db", db_url, "up", "--port", "0"],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
        env=env,
        start_new_session=True,
    )


def _read(path: Path) -> str:
    return path.read_text(errors="replace")


async def _base_url(proc: subprocess.Popen[str], log_path: Path) -> str:
    found: list[str] = []

    async def announced() -> bool:
        match = re.search(r"dashboard:\s+(http://\S+)/", _read(log_path))
        if match:
            found.append(match.group(1))
            return True
        assert proc.poll() is None, _read(log_path)
        return False

    await wait_until(announced, timeout=60, what="the banner of taskward up")
    return found[0]


async def _submit_sleep(base: str, seconds: int) -> str:
    body = {
        "action_kind": "command",
        "args": {"argv": ["sleep", str(seconds)], "timeout_s": 120},
        "idempotency_key": f"up-signals-{uuid.uuid4()}",
    }
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        r = await http.post("/api/tasks", json=body)
    assert r.status_code == 201, r.text
    task_id: str = r.json()["task_id"]
    return task_id


async def _own_session_child(argv: list[str], group: int) -> bool:
    """Whether a process runs exactly ``argv`` outside the process group ``group``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            found = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
            if (
                len(found) == len(argv)
                and Path(found[0].decode()).name == argv[0]
                and [a.decode() for a in found[1:]] == argv[1:]
                and os.getpgid(int(entry.name)) != group
            ):
                return True
        except (OSError, ProcessLookupError, UnicodeDecodeError):
            continue
    return False


async def _status(db: StateDB, task_id: str) -> str:
    status: str = (await taskward.get_task(db, task_id))["status"]
    return status


async def _exit_code(proc: subprocess.Popen[str], timeout: float) -> int:
    return await asyncio.to_thread(proc.wait, timeout)


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def _up_running(
    db: StateDB, db_url: str, tmp_path: Path, sleep_s: int
) -> tuple[subprocess.Popen[str], Path, str, str]:
    """A real ``taskward up`` with a ``sleep`` task running: its process, log, URL and task."""
    log_path = tmp_path / "up.log"
    with log_path.open("w") as log:
        proc = _start_up(db_url, log, tmp_path)
    try:
        base = await _base_url(proc, log_path)
        task_id = await _submit_sleep(base, sleep_s)
        await wait_until(
            lambda: _is(db, task_id, "running"), timeout=60, what="the task to be running"
        )
        # ...and its process spawned into a session of its own: a signal sent to `up`'s group
        # before then could reach the child while it still shared that group (a flake: the
        # task then failed, killed, instead of finishing or going back to the queue)
        await wait_until(
            lambda: _own_session_child(["sleep", str(sleep_s)], proc.pid),
            timeout=60,
            what="the task's process in a session of its own",
        )
    except BaseException:
        _kill(proc)
        raise
    return proc, log_path, base, task_id


async def test_one_sigterm_lets_the_running_task_finish_and_exits_0(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    proc, log_path, base, task_id = await _up_running(db, db_url, tmp_path, 3)
    try:
        signalled = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        code = await _exit_code(proc, 60)
        stopped_in = time.monotonic() - signalled
    finally:
        _kill(proc)
    output = _read(log_path)
    assert code == 0, output
    assert STOPPING in output, output
    facts = await taskward.list_transitions(db, task_id)
    assert [(f["status"], f["reason_code"]) for f in facts] == [
        ("running", "claimed"),
        ("completed", "completed"),
    ], output
    assert (await taskward.get_task(db, task_id))["exit_code"] == 0
    # one line as the task started and one as it ended (issue 28): time, status, kind, id
    assert re.search(rf"^\d\d:\d\d:\d\d running +command {task_id} attempt 1$", output, re.M)
    assert re.search(rf"^\d\d:\d\d:\d\d completed command {task_id} \d+\.\ds$", output, re.M)
    assert stopped_in < 60, stopped_in
    # the server stopped with the first signal: nothing listens on its port any more
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:
            await http.get("/healthz")


async def test_a_second_sigterm_sends_the_running_task_back_to_the_queue(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    proc, log_path, _, task_id = await _up_running(db, db_url, tmp_path, 60)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        await wait_until(
            lambda: _logged(log_path, STOPPING), timeout=30, what="the first signal's drain"
        )
        assert await _status(db, task_id) == "running"  # draining: the task still runs
        os.killpg(proc.pid, signal.SIGTERM)
        code = await _exit_code(proc, 60)
    finally:
        _kill(proc)
    output = _read(log_path)
    assert code == 0, output
    facts = await taskward.list_transitions(db, task_id)
    steps = [(f["status"], f["reason_code"]) for f in facts]
    # The retry is due at once (R10): the host's own promoter may requeue it before the exit.
    assert steps[:2] == [("running", "claimed"), ("retry_wait", "host_shutdown")], output
    assert steps[2:] in ([], [("queued", "retry_ready")]), steps


async def _is(db: StateDB, task_id: str, status: str) -> bool:
    return await _status(db, task_id) == status


async def _logged(path: Path, text: str) -> bool:
    return text in _read(path)
