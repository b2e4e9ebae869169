"""``taskward worker --processes N``: one supervisor over N worker processes (DESIGN.md R26).

The supervisor runs no task and opens no store. It starts N children, each a whole
``taskward worker`` (its own ``ResidentEngineHost``, worker id and connections), restarts them
by ``RestartBackoff`` and forwards stop signals. It is hooked from the CLI only.

Restarts: exit 75 (``EXIT_MEMORY_PRESSURE``, ADR-0037 D5) at once; any other non-zero exit or a
signal after ``RestartBackoff``'s delay (0.5 s doubling to 30 s, back to 0.5 s once a child ran
10 s); exit 0 (``--burst`` found no work) never: the supervisor ends when every child has ended.
Signals: the first SIGTERM/SIGINT sends SIGTERM to every child (each drains, as one worker does)
and stops restarts; a second is forwarded, as SIGINT (each child cancels its active tasks).

Known limits: children run in process groups of their own, so a terminal's Ctrl-C reaches the
supervisor alone (it would otherwise reach every child too and count as their first signal while
the forwarded one counted as their second); a supervisor killed with SIGKILL therefore leaves its
children running as ordinary workers, each still stopped by its own SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from taskward.claims import new_worker_id
from taskward.runtime import EXIT_MEMORY_PRESSURE, EXIT_OK

MAX_PROCESSES: Final = 64
EXIT_CHILD_FAILED: Final = 1  # a child's last exit was a crash (not a drain)
RESTART_INITIAL_S: Final = 0.5
RESTART_CAP_S: Final = 30.0
HEALTHY_AFTER_S: Final = 10.0
STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
EXIT_INTERRUPTED: Final = 130  # the CLI's exit on KeyboardInterrupt (cli.errors)


def resolve_processes(value: str) -> int:
    """``--processes``: an int 1..``MAX_PROCESSES``, or ``auto`` (the CPU count, capped).

    Raises:
        ValueError: anything else, naming the value and what is allowed.
    """
    if value.strip().lower() == "auto":
        return max(1, min(os.cpu_count() or 1, MAX_PROCESSES))
    try:
        count = int(value)
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_PROCESSES:
        raise ValueError(f"{value!r} is not 1..{MAX_PROCESSES} or auto")
    return count


@dataclass
class RestartBackoff:
    """When a child that exited is started again (one per child slot; pure, the caller gives the
    run time)."""

    initial_s: float = RESTART_INITIAL_S
    cap_s: float = RESTART_CAP_S
    healthy_after_s: float = HEALTHY_AFTER_S
    _next_s: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self._next_s = self.initial_s

    def delay_after(self, returncode: int, ran_s: float) -> float | None:
        """Seconds to wait before the restart of a child that ran ``ran_s`` and exited with
        ``returncode`` (negative: killed by that signal); None: do not restart it.

        A run of ``healthy_after_s`` or more forgets earlier crashes. Exit 75 restarts at once
        and does not count as a crash; exit 0 is a child that finished (``--burst``)."""
        if ran_s >= self.healthy_after_s:
            self._next_s = self.initial_s
        if returncode == EXIT_OK:
            return None
        if returncode == EXIT_MEMORY_PRESSURE:
            return 0.0
        delay = self._next_s
        self._next_s = min(self._next_s * 2, self.cap_s)
        return delay


class WorkerIds:
    """Distinct worker ids for the children: ``<prefix>-<n>`` (n counts every start, restarts
    included) when an id was given, else a fresh ``host:<8 hex>`` never used before by this
    supervisor. A restarted child never takes the id of the child it replaces or of a live one."""

    def __init__(self, prefix: str | None = None, *, make: Callable[[], str] = new_worker_id):
        self.prefix = prefix
        self._make = make
        self._count = 0
        self._used: set[str] = set()

    def next(self) -> str:
        self._count += 1
        if self.prefix is not None:
            worker_id = f"{self.prefix}-{self._count}"
        else:
            worker_id = self._make()
            while worker_id in self._used:
                worker_id = self._make()
        self._used.add(worker_id)
        return worker_id


def child_argv(
    base_argv: Sequence[str], worker_id: str, *, metrics_port: int | None = None
) -> list[str]:
    """A child's argv: ``base_argv`` (the ``worker`` command line without ``--processes``,
    ``--worker-id`` and ``--metrics-port``) with its own ``--worker-id`` and, when metrics are
    served, its own ``--metrics-port``; never run through a shell."""
    argv = [*base_argv, "--worker-id", worker_id]
    if metrics_port is not None:
        argv += ["--metrics-port", str(metrics_port)]
    return argv


def metrics_port_of(first_port: int | None, slot: int) -> int | None:
    """The metrics port of child ``slot`` (1..N): ``first_port + slot - 1``, the same across
    its restarts. Each child serves its own process's metrics (prometheus-client's
    multiprocess mode, which shares files between processes, is not used): scrape every port
    and sum, as for workers on several machines."""
    return None if first_port is None else first_port + slot - 1


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"{returncode} (killed by {signal.Signals(-returncode).name})"
        except ValueError:
            return f"{returncode} (killed by signal {-returncode})"
    if returncode == EXIT_MEMORY_PRESSURE:
        return f"{returncode} (memory pressure)"
    return str(returncode)


def _stderr_line(text: str) -> None:
    stamp = datetime.now(UTC).strftime("%H:%M:%S.%f")[:-3]
    print(f"{stamp} supervisor: {text}", file=sys.stderr, flush=True)


@dataclass
class _Child:
    slot: int
    worker_id: str
    process: asyncio.subprocess.Process
    started_at: float
    signals_sent: list[signal.Signals] = field(default_factory=list)


class Supervisor:
    """Keeps ``processes`` children of ``base_argv`` running (see the module docstring).

    ``env`` is the children's environment, by default this process's own: a child is the same
    program run by the same user, and a worker needs what the single-process one gets (the store
    URL and its password, ``TASKWARD_*`` settings, outbox secrets, ``PYTHONPATH``); the worker
    itself gives its task processes only a filtered environment (``adapters.childenv``)."""

    def __init__(
        self,
        base_argv: Sequence[str],
        processes: int,
        *,
        worker_id_prefix: str | None = None,
        metrics_port: int | None = None,
        env: Mapping[str, str] | None = None,
        backoff: Callable[[], RestartBackoff] = RestartBackoff,
        log: Callable[[str], None] = _stderr_line,
    ) -> None:
        if not 1 <= processes <= MAX_PROCESSES:
            raise ValueError(f"processes {processes} is not 1..{MAX_PROCESSES}")
        self.base_argv = list(base_argv)
        self.processes = processes
        self.env = dict(os.environ if env is None else env)
        self.ids = WorkerIds(worker_id_prefix)
        self.metrics_port = metrics_port
        self._backoff = backoff
        self.log = log
        self.signals: list[signal.Signals] = []
        self.live: dict[int, _Child] = {}
        self.last_exit: dict[int, int] = {}
        self._stopping = asyncio.Event()

    @property
    def stopping(self) -> bool:
        return bool(self.signals)

    def request_stop(self, sig: signal.Signals) -> None:
        """A stop signal: the first drains every child (SIGTERM), a later one is forwarded (as
        SIGINT: the child cancels its active tasks). No child is started or restarted after it."""
        self.signals.append(sig)
        action = "draining" if len(self.signals) == 1 else "cancelling"
        self.log(f"{sig.name}: {action} {len(self.live)} worker process(es)")
        self._stopping.set()
        for child in list(self.live.values()):
            self._forward(child)

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self.request_stop, sig)

    def _forward(self, child: _Child) -> None:
        """Send ``child`` every stop signal received that it has not been sent yet (a child
        started while a signal arrived catches up here).

        The first is sent as SIGTERM (a drain), every later one as SIGINT: a worker counts both
        alike, and the kernel keeps one pending signal per number, so a second SIGTERM sent
        before the child ran to take the first would merge with it and never cancel."""
        while len(child.signals_sent) < len(self.signals):
            sig = signal.SIGTERM if not child.signals_sent else signal.SIGINT
            child.signals_sent.append(sig)
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(sig)

    def _is_clean(self, child: _Child, returncode: int) -> bool:
        """A drained end: exit 0; or, once stopping, exit 75 (it drained) or death by a signal
        the supervisor sent before the child could install its handlers."""
        if returncode == EXIT_OK:
            return True
        if not child.signals_sent:
            return False
        if returncode == EXIT_INTERRUPTED and signal.SIGINT in child.signals_sent:
            return True  # its KeyboardInterrupt: a SIGINT that came before its handlers
        return returncode == EXIT_MEMORY_PRESSURE or -returncode in child.signals_sent

    async def _start(self, slot: int) -> _Child | None:
        worker_id = self.ids.next()
        argv = child_argv(
            self.base_argv, worker_id, metrics_port=metrics_port_of(self.metrics_port, slot)
        )
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, env=self.env, stdin=asyncio.subprocess.DEVNULL, process_group=0
            )
        except OSError as exc:
            self.log(f"child {slot} worker {worker_id} failed to start: {exc}")
            return None
        child = _Child(slot, worker_id, process, time.monotonic())
        self.live[slot] = child
        self.log(f"child {slot} started: pid {process.pid}, worker {worker_id}")
        self._forward(child)
        return child

    async def _keep(self, slot: int) -> bool:
        """Run one child slot until it ends for good; True when its last exit was clean."""
        backoff = self._backoff()
        while True:
            if self.stopping and slot not in self.last_exit:
                return True  # stopped before this slot's first start: nothing to drain
            child = await self._start(slot)
            if child is None:
                returncode, ran_s, clean = 127, 0.0, False
            else:
                returncode = await child.process.wait()
                ran_s = time.monotonic() - child.started_at
                del self.live[slot]
                clean = self._is_clean(child, returncode)
            self.last_exit[slot] = returncode
            where = "" if child is None else f"pid {child.process.pid}, worker {child.worker_id}, "
            ended = f"child {slot} exited {describe_exit(returncode)}: {where}ran {ran_s:.1f}s"
            delay = backoff.delay_after(returncode, ran_s)
            if self.stopping:
                self.log(f"{ended}; stopping")
                return clean
            if delay is None:
                self.log(f"{ended}; not restarted")
                return clean
            if delay == 0:
                self.log(f"{ended}; restarting at once")
                continue
            self.log(f"{ended}; restarting in {delay:g}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            if self.stopping:
                self.log(f"child {slot} not restarted: stopping")
                return False

    async def run(self) -> int:
        """Start every child and keep them until all have ended.

        Returns:
            0 when every child's last exit was clean (0, or a drain on a stop signal); else
            ``EXIT_CHILD_FAILED``.
        """
        self.log(f"pid {os.getpid()}: starting {self.processes} worker processes")
        slots = [asyncio.create_task(self._keep(slot)) for slot in range(1, self.processes + 1)]
        try:
            results = await asyncio.gather(*slots)
        finally:
            for task in slots:
                task.cancel()
            for child in list(self.live.values()):  # only when run() itself was cancelled
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)
                await child.process.wait()
        code = EXIT_OK if all(results) else EXIT_CHILD_FAILED
        exits = ", ".join(f"{slot}: {self.last_exit[slot]}" for slot in sorted(self.last_exit))
        self.log(f"stopped: exit {code} (last exits {exits})")
        return code


def run_supervisor(
    base_argv: Sequence[str],
    processes: int,
    *,
    worker_id_prefix: str | None = None,
    metrics_port: int | None = None,
) -> int:
    """The sync edge: run a ``Supervisor`` with its signal handlers; returns the exit code."""

    async def main() -> int:
        supervisor = Supervisor(
            base_argv, processes, worker_id_prefix=worker_id_prefix, metrics_port=metrics_port
        )
        supervisor.install_signal_handlers()
        return await supervisor.run()

    return asyncio.run(main())
