"""Run a child process for an adapter: argv list only, own process group, bounded output.

Cancellation and timeouts terminate the whole process group (SIGTERM, then SIGKILL after a grace
period) so grandchildren do not outlive the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import deque
from typing import Any, Final

from taskward.errors import TaskValidationError
from taskward.registry import CancellationToken, TaskExecutionResult

OUTPUT_TAIL_BYTES: Final = 8192
KILL_GRACE_S: Final = 5.0


def validate_process_args(args: dict[str, Any]) -> None:
    cwd = args.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd):
        raise TaskValidationError("args.cwd", cwd, "a directory path")
    env = args.get("env")
    if env is not None and (
        not isinstance(env, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise TaskValidationError("args.env", env, "an object of string to string")
    timeout = args.get("timeout_s")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise TaskValidationError("args.timeout_s", timeout, "a positive number of seconds")


def _kill_group(proc: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


async def _terminate(proc: asyncio.subprocess.Process) -> None:
    _kill_group(proc, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), KILL_GRACE_S)
    except TimeoutError:
        _kill_group(proc, signal.SIGKILL)
        await proc.wait()


async def run_process(
    argv: list[str],
    *,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
    cancellation: CancellationToken,
) -> TaskExecutionResult:
    """Run ``argv``; exit 0 is completed, non-zero failed, timeout timed_out, cancel cancelled."""
    started = time.monotonic()
    tail: deque[bytes] = deque()
    tail_size = 0
    child_env = {**os.environ, **env} if env else None
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=child_env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        return TaskExecutionResult(status="failed", error_detail=f"cannot start {argv[0]!r}: {exc}")

    async def pump() -> None:
        nonlocal tail_size
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(4096):
            tail.append(chunk)
            tail_size += len(chunk)
            while tail_size - len(tail[0]) >= OUTPUT_TAIL_BYTES:
                tail_size -= len(tail.popleft())

    pump_task = asyncio.create_task(pump())
    wait_task = asyncio.create_task(proc.wait())
    cancel_task = asyncio.create_task(cancellation.wait())
    outcome = "exited"
    try:
        done, _ = await asyncio.wait(
            {wait_task, cancel_task}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        if wait_task not in done:
            outcome = "cancelled" if cancel_task in done else "timed_out"
            await _terminate(proc)
    except asyncio.CancelledError:
        await _terminate(proc)
        raise
    finally:
        cancel_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await cancel_task
        with contextlib.suppress(Exception):
            await asyncio.wait_for(pump_task, 1.0)
    output = b"".join(tail)[-OUTPUT_TAIL_BYTES:].decode("utf-8", "replace")
    elapsed_ms = round((time.monotonic() - started) * 1000, 3)
    evidence = [{"kind": "process", "argv0": argv[0], "pid": proc.pid,
                 "elapsed_ms": elapsed_ms, "output_tail": output}]
    code = proc.returncode
    if outcome == "cancelled":
        return TaskExecutionResult(status="cancelled", exit_code=code,
                                   error_detail=cancellation.reason, evidence_refs=evidence)
    if outcome == "timed_out":
        return TaskExecutionResult(status="timed_out", exit_code=code,
                                   error_detail=f"timed out after {timeout_s}s",
                                   evidence_refs=evidence)
    if code == 0:
        return TaskExecutionResult(status="completed", exit_code=0, evidence_refs=evidence)
    return TaskExecutionResult(status="failed", exit_code=code,
                               error_detail=output[-2000:] or f"exit code {code}",
                               evidence_refs=evidence)
