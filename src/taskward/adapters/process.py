"""Run a child process for an adapter: argv list only, own process group, bounded output.

The child starts a session (so a process group) of its own and is never run through a shell.
Cancellation and timeouts send SIGTERM to the whole group, wait for the leader and its group for
a grace period, then SIGKILL whatever is left, so grandchildren do not outlive the task.
Stragglers a leader leaves behind when it exits on its own are ended the same way. A bare
executable name is resolved on the worker's own PATH, never on a PATH the task's ``env`` sets.
On Linux the child is also SIGKILLed when the worker dies (``PR_SET_PDEATHSIG``): a worker
killed outright cannot end its group, and its task runs again elsewhere once the lease lapses,
so the old child must not go on beside the new attempt.

The child does not inherit the worker's environment (secrets such as ``TASKWARD_API_TOKENS``
would reach its output, which every reader sees): it gets ``childenv.child_environment`` -- a
few basics, what the deployment passes through by name, and the task's own ``env``.

A memory limit (``memory_limit_mb``) caps the child's address space with ``RLIMIT_AS``, which
its descendants inherit. Going past it is a resource fault like a deadline (R5): a retryable
failure, so a memory bomb is retried until the attempt ceiling ends it, while a plain non-zero
exit fails at once (ADR-0071 D4).

Known limits: POSIX only. A descendant that starts a session of its own (``setsid``, a daemon)
leaves the group and is not tracked. Only the direct child gets the parent-death signal: when a
worker dies outright, grandchildren in the child's group outlive it. ``RLIMIT_AS`` raises no
signal: the kernel only refuses the allocation, so a breach is recognised by how the program
dies -- killed by SIGSEGV, SIGBUS or SIGABRT, or its output naming an allocation failure
(``MemoryError``, ``out of memory``, ``Cannot allocate memory``, ``bad_alloc``, ``memory
allocation of``). A program that swallows the failure and exits non-zero otherwise is a plain
failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import re
import resource
import shutil
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, Final

from taskward.adapters.childenv import child_environment
from taskward.errors import TaskValidationError
from taskward.registry import CancellationToken, TaskExecutionResult
from taskward.tracing import child_trace_env

OUTPUT_TAIL_BYTES: Final = 8192
KILL_GRACE_S: Final = 5.0
ERROR_DETAIL_CHARS: Final = 2000
_POLL_S: Final = 0.05
_READ_CHUNK: Final = 4096
# Variables that make the dynamic loader run code of the submitter's choosing inside an
# allowlisted executable; refused wherever an allowlist (or a fixed launcher) fences what runs.
_LOADER_ENV_PREFIXES: Final = ("LD_", "DYLD_")
# How a program under RLIMIT_AS dies when an allocation is refused (see the module docstring).
_MEMORY_SIGNALS: Final = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT})
_MEMORY_MARKERS: Final = re.compile(
    r"MemoryError|out of memory|Cannot allocate memory|bad_alloc|memory allocation of",
    re.IGNORECASE,
)
MAX_MEMORY_LIMIT_MB: Final = 1 << 30  # 1 PiB: beyond any real address space


def task_args(task: Mapping[str, Any]) -> dict[str, Any]:
    """The task's ``action_args`` as a dict (store rows arrive decoded; JSON text is accepted).

    Raises:
        TaskValidationError: the args are not a JSON object.
    """
    args = task.get("action_args")
    if args is None:
        return {}
    if isinstance(args, str | bytes):
        try:
            args = json.loads(args)
        except ValueError as exc:
            raise TaskValidationError("action_args", "invalid JSON", "a JSON object") from exc
    if not isinstance(args, dict):
        raise TaskValidationError("action_args", type(args).__name__, "a JSON object")
    return args


def validate_argv(field: str, argv: object, *, require_program: bool) -> list[str]:
    """Check an argv list (strings, no NUL); with ``require_program`` it must name a program."""
    allowed = "a non-empty list of strings" if require_program else "a list of strings"
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise TaskValidationError(field, argv, allowed)
    if require_program and (not argv or not argv[0]):
        raise TaskValidationError(f"{field}[0]" if argv else field, argv, allowed)
    for index, item in enumerate(argv):
        if "\0" in item:
            raise TaskValidationError(f"{field}[{index}]", item, "a string without NUL characters")
    return argv


def validate_process_args(
    args: Mapping[str, Any], *, prefix: str = "args", allow_loader_env: bool = False
) -> None:
    """Check ``cwd``, ``env`` and ``timeout_s``; raises TaskValidationError naming the field."""
    cwd = args.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd or "\0" in cwd):
        raise TaskValidationError(f"{prefix}.cwd", cwd, "a directory path")
    env = args.get("env")
    if env is not None:
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise TaskValidationError(f"{prefix}.env", env, "an object of string to string")
        for key, value in env.items():
            if not key or "=" in key or "\0" in key or "\0" in value:
                raise TaskValidationError(
                    f"{prefix}.env", key, "names without '=' or NUL, values without NUL"
                )
            if not allow_loader_env and key.upper().startswith(_LOADER_ENV_PREFIXES):
                raise TaskValidationError(
                    f"{prefix}.env.{key}",
                    value,
                    "no dynamic-loader variables (LD_*, DYLD_*) where what runs is fenced",
                )
    timeout = args.get("timeout_s")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
    ):
        raise TaskValidationError(f"{prefix}.timeout_s", timeout, "a positive number of seconds")


def validate_memory_limit(args: Mapping[str, Any], *, prefix: str = "args") -> float | None:
    """Check ``memory_limit_mb`` (a number of MiB > 0); returns it, or None when absent.

    Raises:
        TaskValidationError: not a positive number of MiB.
    """
    limit = args.get("memory_limit_mb")
    if limit is None:
        return None
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int | float)
        or not 0 < limit <= MAX_MEMORY_LIMIT_MB
    ):
        raise TaskValidationError(
            f"{prefix}.memory_limit_mb", limit, f"a number of MiB > 0 and <= {MAX_MEMORY_LIMIT_MB}"
        )
    return float(limit)


_PR_SET_PDEATHSIG: Final = 1


def _load_prctl() -> Any:
    """libc's ``prctl`` (Linux), looked up once, before any fork; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL: Final = _load_prctl()


def _child_setup(memory_limit_mb: float | None) -> Callable[[], None]:
    """What the forked child does before exec: system calls only, nothing that takes a lock.

    It dies with the worker (``PR_SET_PDEATHSIG``; if the worker is already gone, at once) and,
    with a memory limit, caps its address space (``RLIMIT_AS``).
    """
    parent = os.getpid()
    limit = None if memory_limit_mb is None else max(1, int(memory_limit_mb * 1024 * 1024))

    def apply() -> None:
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # the worker died before the signal was armed
                os._exit(1)
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def _memory_breach(code: int | None, output: str) -> bool:
    """Whether a failed child under a memory limit died of it (see the module docstring)."""
    if code is not None and code < 0 and -code in _MEMORY_SIGNALS:
        return True
    return bool(_MEMORY_MARKERS.search(output))


def resolve_executable(name: str) -> str | None:
    """A path is used as given; a bare name is looked up on the worker's PATH (not the task's)."""
    if os.sep in name or (os.altsep is not None and os.altsep in name):
        return name
    return shutil.which(name, path=os.environ.get("PATH", os.defpath))


class _Tail:
    """The last OUTPUT_TAIL_BYTES (at least) of a stream, and how much was read in all."""

    def __init__(self) -> None:
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.total = 0

    def append(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        self.size += len(chunk)
        self.total += len(chunk)
        while self.size - len(self.chunks[0]) >= OUTPUT_TAIL_BYTES:
            self.size -= len(self.chunks.popleft())

    def text(self) -> str:
        data = b"".join(self.chunks)[-OUTPUT_TAIL_BYTES:]
        if self.total > len(data):
            # Cut at a character boundary rather than showing half a UTF-8 sequence.
            start = 0
            while start < min(4, len(data)) and data[start] & 0xC0 == 0x80:
                start += 1
            data = data[start:]
        return data.decode("utf-8", "replace")


async def _pump(pipe: BinaryIO, tail: _Tail) -> None:
    """Read the child's output pipe to its end, then close it."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    try:
        while chunk := await reader.read(_READ_CHUNK):
            tail.append(chunk)
    except OSError:
        pass
    finally:
        transport.close()


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs (zombies nobody reaped do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        # After the command name: state, ppid, pgrp, ...
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


async def _end_group(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM the group, wait up to ``grace_s`` for it to go, then SIGKILL what is left."""
    pgid = proc.pid
    if proc.returncode is not None and not _group_alive(pgid):
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    _signal_group(pgid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), grace_s)
    # Members that are not our children cannot be awaited: poll, bounded by the grace period.
    while loop.time() < deadline:
        if not _group_alive(pgid):
            break
        await asyncio.sleep(_POLL_S)
    # Unconditional: a descendant ignoring SIGTERM must not outlive the task (no-op if gone).
    _signal_group(pgid, signal.SIGKILL)
    await proc.wait()


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


async def run_process(
    argv: list[str],
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    cancellation: CancellationToken,
    kill_grace_s: float = KILL_GRACE_S,
    memory_limit_mb: float | None = None,
    env_passthrough: Iterable[str] = (),
) -> TaskExecutionResult:
    """Run ``argv``: exit 0 is completed, non-zero failed, timeout timed_out, cancel cancelled.

    The child's environment is ``child_environment(env, env_passthrough)``: the task's ``env``
    over a few basics, never the worker's whole environment, and, while a traced run is current
    (``taskward[otel]``), its ``TRACEPARENT``/``TRACESTATE`` under the task's ``env``. The
    evidence holds the exit code, timing and the last OUTPUT_TAIL_BYTES of stdout and stderr
    (interleaved). A program that cannot start is a failed result, never an exception. With
    ``memory_limit_mb`` the child runs under ``RLIMIT_AS``; dying of it is a retryable failure.
    """
    if cancellation.is_cancelled:
        return TaskExecutionResult(
            status="cancelled", error_detail=f"{cancellation.reason} (before the process started)"
        )
    program = resolve_executable(argv[0])
    if program is None:
        return TaskExecutionResult(
            status="failed",
            error_detail=f"cannot start {argv[0]!r}: not found on the worker's PATH",
        )
    started_at = time.time()
    started = time.monotonic()
    # Our own pipe rather than PIPE: on Python 3.11 ``Process.wait()`` also waits for the
    # transport's pipes to close, which a straggler holding stdout would delay indefinitely.
    read_fd, write_fd = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            executable=program,
            cwd=cwd,
            # Always a full mapping: None would hand the child the worker's whole environment.
            # The run's trace context (taskward[otel]) sits under the task's own env, which wins.
            env=child_environment({**child_trace_env(), **(env or {})}, env_passthrough),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            start_new_session=True,
            preexec_fn=_child_setup(memory_limit_mb),
        )
    except (OSError, ValueError) as exc:
        os.close(read_fd)
        return TaskExecutionResult(status="failed", error_detail=f"cannot start {argv[0]!r}: {exc}")
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)

    tail = _Tail()
    pump_task = asyncio.create_task(_pump(os.fdopen(read_fd, "rb", buffering=0), tail))
    wait_task = asyncio.create_task(proc.wait())
    cancel_task = asyncio.create_task(cancellation.wait())
    outcome = "exited"
    try:
        done, _ = await asyncio.wait(
            {wait_task, cancel_task}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        if wait_task not in done:
            outcome = "cancelled" if cancel_task in done else "timed_out"
        await _end_group(proc, kill_grace_s)
    except asyncio.CancelledError:
        await _end_group(proc, kill_grace_s)
        raise
    finally:
        for waiter in (cancel_task, wait_task):
            waiter.cancel()
        await asyncio.gather(cancel_task, wait_task, return_exceptions=True)
        # The pipe closes once every holder is gone; do not hang on one that escaped the group.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pump_task, 1.0)

    ended_at = time.time()
    code = proc.returncode
    output = tail.text()
    evidence: list[dict[str, Any]] = [
        {
            "kind": "process",
            "argv0": argv[0],
            "pid": proc.pid,
            "exit_code": code,
            "started_at": started_at,
            "ended_at": ended_at,
            "duration_s": round(time.monotonic() - started, 3),
            "output_bytes": tail.total,
            "output_truncated": tail.total > OUTPUT_TAIL_BYTES,
            "output_tail": output,
            "memory_limit_mb": memory_limit_mb,
        }
    ]
    if outcome == "cancelled":
        return TaskExecutionResult(
            status="cancelled",
            exit_code=code,
            error_detail=cancellation.reason,
            evidence_refs=evidence,
        )
    if outcome == "timed_out":
        return TaskExecutionResult(
            status="timed_out",
            exit_code=code,
            error_detail=f"timed out after {timeout_s}s; process group terminated",
            evidence_refs=evidence,
            retryable=True,  # a deadline is retryable (R5)
        )
    if code == 0:
        return TaskExecutionResult(status="completed", exit_code=0, evidence_refs=evidence)
    detail = _exit_text(code)
    if output.strip():
        detail += "\n" + output[-ERROR_DETAIL_CHARS:]
    if memory_limit_mb is not None and _memory_breach(code, output):
        # A resource fault, like a deadline (R5): retried until the attempt ceiling.
        return TaskExecutionResult(
            status="failed",
            exit_code=code,
            error_detail=f"memory limit of {memory_limit_mb:g} MiB exceeded ({detail})",
            evidence_refs=evidence,
            retryable=True,
        )
    return TaskExecutionResult(
        status="failed", exit_code=code, error_detail=detail, evidence_refs=evidence
    )
