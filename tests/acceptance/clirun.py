"""Run ``taskward`` commands for tests: in-process through click's ``CliRunner`` isolation (the
default: no interpreter start, milliseconds a call) or as a real process (``taskward_process``:
only where the process boundary is the point, a console script, signals, imports at start).

In-process runs go through ``taskward.cli.main.main``, so exit codes and error rendering are the
real ones. The environment's ``TASKWARD_*`` variables are cleared as for a process; the CLI's
``asyncio.run`` needs a thread without a running loop, so an async test awaits ``arun``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from taskward.cli.main import main


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)

    @property
    def returncode(self) -> int:  # subprocess.CompletedProcess's name
        return self.code


def _env(env: Mapping[str, str] | None) -> dict[str, str | None]:
    cleared: dict[str, str | None] = {k: None for k in os.environ if k.startswith("TASKWARD_")}
    return {**cleared, **(env or {})}


def run_cli(
    db_url: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    input: str | bytes | None = None,
    cwd: Path | None = None,
) -> Run:
    """``taskward --db DB_URL ARGS`` in this process; stdout and stderr kept apart.

    Called from a running event loop (an async test), the command runs in a worker thread
    while the loop waits: the CLI's ``asyncio.run`` needs a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run_cli(db_url, args, env=env, input=input, cwd=cwd)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_run_cli, db_url, args, env=env, input=input, cwd=cwd).result()


def _run_cli(
    db_url: str,
    args: tuple[str, ...],
    *,
    env: Mapping[str, str] | None,
    input: str | bytes | None,
    cwd: Path | None,
) -> Run:
    runner = CliRunner()
    chdir = contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext()
    with chdir, runner.isolation(input=input, env=_env(env)) as (out, err, _):
        code = main(["--db", db_url, *args])
        sys.stdout.flush()
        sys.stderr.flush()
        stdout, stderr = out.getvalue(), err.getvalue()
    return Run(code, stdout.decode(), stderr.decode())


async def arun_cli(db_url: str, *args: str, **kwargs: Any) -> Run:
    """``run_cli`` from an async test: in a worker thread, where ``asyncio.run`` may run."""
    return await asyncio.to_thread(run_cli, db_url, *args, **kwargs)


def run_process(
    db_url: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    cwd: Path | None = None,
    timeout: float = 60,
) -> Run:
    """``python -m taskward.cli.main --db DB_URL ARGS`` as a real process (clean TASKWARD_*)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TASKWARD_")}
    proc = subprocess.run(
        [sys.executable, "-m", "taskward.cli.main", "--db", db_url, *args],
        capture_output=True,
        text=True,
        input=input,
        cwd=cwd,
        env={**base, **(env or {})},
        timeout=timeout,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)
