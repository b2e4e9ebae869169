"""The contract every adapter script of ``bench/compare`` follows, and its helpers.

An adapter measures ONE system, ONE workload, in ONE fresh store per invocation (the driver
``run.py`` creates the PostgreSQL schema or picks the SQLite path, and removes it afterwards), and
prints exactly one result line, ``COMPARE-RESULT {json}``, on stdout; progress goes to stderr.
Standard library only: peer adapters run inside the peers' own virtual environments, where
taskward is not installed.

Workloads (the same for every system):

- ``enqueue``: ``--warmup`` untimed enqueues, then ``--jobs`` enqueues one per call, timed; the
  store must then hold exactly that many queued jobs.
- ``drain``: ``--jobs`` jobs enqueued untimed (in bulk where the system can), then ONE worker OS
  process is spawned and timed from just before the spawn until a poll (every 50 ms) of the
  system's durable state sees every job done. Process start-up is included, nothing subtracted.
- ``pickup``: an idle worker; ``--warmup`` jobs submitted and seen done (the worker is up), then
  ``--jobs`` submissions on a fixed ``--interval-ms`` schedule; latency = the system's own record
  of the job being taken (a timestamp) minus ``time.time()`` just before the submit call.

``--workload worker`` is internal: the adapter re-runs itself as the worker process of its system.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

RESULT_PREFIX = "COMPARE-RESULT "
WORKLOADS = ("enqueue", "drain", "pickup")
POLL_S = 0.05


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args(description: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--workload", required=True, choices=[*WORKLOADS, "worker"])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs measured")
    parser.add_argument("--warmup", type=int, default=20, help="untimed jobs first")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="pickup spacing")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default=None)
    parser.add_argument("--pg-url", default=None, help="libpq URL of the server")
    parser.add_argument("--schema", default=None, help="the fresh schema to use (PostgreSQL)")
    parser.add_argument("--sqlite-path", default=None, help="the fresh file to use (SQLite)")
    parser.add_argument("--concurrency", type=int, default=None, help="worker concurrency")
    parser.add_argument("--batch", type=int, default=None, help="worker fetch batch size")
    parser.add_argument(
        "--processes", type=int, default=1, help="(taskward) worker processes (R26 supervisor)"
    )
    parser.add_argument("--workdir", default=None, help="where logs and side files go")
    parser.add_argument(
        "--driver",
        choices=("sync", "async"),
        default="sync",
        help="(the PostgreSQL floor's enqueue) psycopg's synchronous or asynchronous connection",
    )
    parser.add_argument("--mode", choices=("burst", "idle"), default="burst", help="(worker)")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.warmup < 0:
        parser.error("--jobs must be positive and --warmup not negative")
    return args


def emit(result: dict[str, Any]) -> None:
    """Print the one result line the driver reads."""
    print(RESULT_PREFIX + json.dumps(result, sort_keys=True), flush=True)


def dist_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (None when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def base_result(system: str, args: argparse.Namespace, **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "system": system,
        "version": dist_version(system),
        "workload": args.workload,
        "jobs": args.jobs,
        "warmup": args.warmup,
        "violations": [],
        "python": sys.version.split()[0],
    }
    out.update(fields)
    return out


def pg_url_with_schema(url: str, schema: str) -> str:
    """``url`` whose sessions all have ``search_path`` = ``schema`` (libpq ``options``)."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}', safe='')}"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear interpolation between closest ranks."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_fields(latencies_ms: Sequence[float]) -> dict[str, Any]:
    return {
        "p50_ms": percentile(latencies_ms, 50),
        "p95_ms": percentile(latencies_ms, 95),
        "p99_ms": percentile(latencies_ms, 99),
        "latencies_ms": [round(v, 3) for v in latencies_ms],
    }


class Worker:
    """One worker OS process of the system under test; stderr goes to a log file."""

    def __init__(
        self, argv: Sequence[str], log_dir: str | None, *, env: dict[str, str] | None = None
    ):
        self.argv = list(argv)
        self.env = env
        base = Path(log_dir) if log_dir else Path("/tmp")
        self.log_path = base / f"worker-{os.getpid()}-{time.monotonic_ns()}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.spawned_mono = 0.0
        self.spawned_wall = 0.0

    def start(self) -> Worker:
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child keeps its own descriptor
        self.spawned_wall = time.time()
        self.spawned_mono = time.monotonic()
        self.process = subprocess.Popen(
            self.argv, stdout=subprocess.DEVNULL, stderr=log, env=self.env
        )
        log.close()
        return self

    def poll(self) -> int | None:
        assert self.process is not None
        return self.process.poll()

    def wait(self, timeout_s: float) -> int | None:
        assert self.process is not None
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int | None:
        """``sig`` (a graceful stop), then SIGKILL if the process has not exited in time."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            if self.wait(timeout_s) is None:
                self.process.kill()
                self.wait(10.0)
        return self.process.returncode

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def remove_log(self) -> None:
        self.log_path.unlink(missing_ok=True)


def self_argv(args: argparse.Namespace, *, mode: str) -> list[str]:
    """The command line that runs this adapter script as its system's worker process."""
    argv = [sys.executable, os.path.abspath(sys.argv[0]), "--workload", "worker", "--mode", mode]
    for name in ("backend", "pg_url", "schema", "sqlite_path", "concurrency", "batch", "workdir"):
        value = getattr(args, name)
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def wait_until(
    done: Callable[[], bool],
    *,
    what: str,
    timeout_s: float,
    worker: Worker | None = None,
    poll_s: float = POLL_S,
) -> float:
    """Poll ``done()`` every ``poll_s``; return ``time.monotonic()`` when it first held.

    Raises:
        RuntimeError: the worker exited first, or ``timeout_s`` passed.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if done():
            return time.monotonic()
        if worker is not None and worker.poll() is not None and not done():
            raise RuntimeError(
                f"worker exited with {worker.poll()} before {what}:\n{worker.log_tail()}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(poll_s)


class Paced:
    """A fixed schedule, ``interval_s`` apart from the first call: never faster, late slots go
    at once. ``sleep(i)`` / ``await asleep(i)`` wait for slot ``i``."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.first: float | None = None

    def _delay(self, i: int) -> float:
        if self.first is None:
            self.first = time.monotonic() - i * self.interval_s
        return self.first + i * self.interval_s - time.monotonic()

    def sleep(self, i: int) -> None:
        delay = self._delay(i)
        if delay > 0:
            time.sleep(delay)

    async def asleep(self, i: int) -> None:
        import asyncio

        delay = self._delay(i)
        if delay > 0:
            await asyncio.sleep(delay)


def drain_fields(count: int, completed: int, wall_s: float, span_s: float | None) -> dict[str, Any]:
    """Rates of a drain: ``per_s`` from the spawn; ``steady_per_s`` over the system's own
    first-take to last-completion span where it records one."""
    return {
        "completed": completed,
        "seconds": wall_s,
        "per_s": completed / wall_s if wall_s > 0 else 0.0,
        "span_s": span_s,
        "steady_per_s": (completed / span_s) if span_s else None,
    }


def check(violations: list[str], failed: bool | int, text: str) -> None:
    if failed:
        violations.append(text)


def _clip(text: str, head: int = 200, tail: int = 600) -> str:
    """The start and the end of a long message (a traceback's cause is at its end)."""
    return text if len(text) <= head + tail else f"{text[:head]} [...] {text[-tail:]}"


def run_main(main: Callable[[argparse.Namespace], dict[str, Any] | None], description: str) -> int:
    """Parse, run, and turn an exception into a result with a violation (the driver goes on)."""
    args = parse_args(description)
    if args.workload == "worker":
        main(args)
        return 0
    try:
        result = main(args)
    except Exception as exc:  # reported, never hidden
        import traceback

        traceback.print_exc()
        result = {
            "workload": args.workload,
            "error": f"{type(exc).__name__}: {exc}",
            "violations": [f"adapter failed: {type(exc).__name__}: {_clip(str(exc))}"],
        }
    assert result is not None
    emit(result)
    return 0 if not result.get("violations") else 1
