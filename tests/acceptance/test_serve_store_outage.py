"""``taskward serve``/``up`` starting while the store is away, or can never be opened, and the
banner they print (docs/http.md "Health and failures").

A PostgreSQL server that is away (refused, timed out) is waited on: the service listens anyway,
answers 503 with ``Retry-After`` (a problem document; ``/healthz`` too) and recovers by itself
when the server comes back. A refusal no waiting fixes (a database or role that does not exist,
bad credentials) ends the command at once with exit 1 and a message naming the cause. The
machine's PostgreSQL is never stopped: a server that is "away" is a free port with nothing
listening, and one that "comes back" is a small TCP proxy to the real server started on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from taskward.cli.serve_cmd import _announce
from taskward.http import HttpConfig
from taskward.runtime import WorkerConfig
from taskward.store.postgres.db import is_permanent_refusal
from tests.conftest import PG_URL, StoreFactory
from tests.worker_procs import wait_until

pytestmark = pytest.mark.slow

PROBLEM = "application/problem+json"
postgres_only = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


def _spawn(db_url: str, command: str, out: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKWARD_")}
    with out.open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "taskward.cli.main", "--db", db_url, command, "--port", "0"],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=out.parent,
            env=env,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def _base_url(proc: subprocess.Popen[str], out: Path) -> str:
    found: list[str] = []

    async def announced() -> bool:
        match = re.search(r"dashboard:\s+(http://\S+)/", out.read_text())
        if match:
            found.append(match.group(1))
            return True
        assert proc.poll() is None, out.read_text()
        return False

    await wait_until(announced, timeout=60, what="the service to listen")
    return found[0]


def _free_port() -> int:
    """A port nothing listens on (connections to it are refused) until a proxy binds it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _with(
    url: str, *, port: int | None = None, user: str | None = None, dbname: str | None = None
) -> str:
    """``url`` with another port (on 127.0.0.1), user or database name."""
    parts = urlsplit(url)
    user = user or parts.username or "postgres"
    password = f":{parts.password}" if parts.password else ""
    host = "127.0.0.1" if port is not None else (parts.hostname or "127.0.0.1")
    port = port if port is not None else (parts.port or 5432)
    path = f"/{dbname}" if dbname else parts.path
    return urlunsplit(parts._replace(netloc=f"{user}{password}@{host}:{port}", path=path))


@contextlib.asynccontextmanager
async def _proxy(port: int, target: tuple[str, int]) -> AsyncIterator[None]:
    """Forward 127.0.0.1:``port`` to ``target`` (the real PostgreSQL) until the block ends."""
    pipes: set[asyncio.Task[None]] = set()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*target)
        for task in (pipe(reader, up_writer), pipe(up_reader, writer)):
            pipes.add(asyncio.create_task(task))

    server = await asyncio.start_server(forward, "127.0.0.1", port)
    try:
        yield
    finally:
        server.close()
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)


def _pg_target() -> tuple[str, int]:
    parts = urlsplit(PG_URL)
    return parts.hostname or "127.0.0.1", parts.port or 5432


async def _exit_code(proc: subprocess.Popen[str], timeout: float) -> int:
    return await asyncio.to_thread(proc.wait, timeout)


def _assert_503(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    assert int(r.headers["retry-after"]) > 0
    assert r.json()["type"] == "urn:taskward:problem:store-unavailable"


# -- a refusal no waiting fixes: exit at once ------------------------------------------------


@postgres_only
@pytest.mark.parametrize("command", ["serve", "up"])
@pytest.mark.parametrize(
    ("url", "cause"),
    [
        (
            _with(PG_URL, dbname="taskward_no_such_db"),
            'database "taskward_no_such_db" does not exist',
        ),
        (
            _with(PG_URL, user="taskward_no_such_role"),
            'role "taskward_no_such_role" does not exist',
        ),
    ],
    ids=["unknown-database", "unknown-role"],
)
async def test_a_permanent_refusal_ends_the_command_at_once_naming_the_cause(
    backend: str, command: str, url: str, cause: str, tmp_path: Path
) -> None:
    # open_timeout_s=30: waiting for the pool would take 30 s; the refusal is told at once
    sep = "&" if "?" in url else "?"
    out = tmp_path / "serve.log"
    began = time.monotonic()
    proc = _spawn(f"{url}{sep}open_timeout_s=30", command, out)
    try:
        code = await _exit_code(proc, 60)
    finally:
        _stop(proc)
    took = time.monotonic() - began
    output = out.read_text()
    assert code == 1, output
    assert took < 15, (took, output)
    assert cause in output and "waiting will not help" in output, output
    assert "serving on" not in output and "Traceback" not in output, output


_AT = 'connection failed: connection to server at "10.0.0.7", port 5432 failed:'


@pytest.mark.parametrize(
    ("message", "permanent"),
    [
        (f'{_AT} FATAL: password authentication failed for user "app"', True),
        (f'{_AT} FATAL: no pg_hba.conf entry for host "10.0.0.2", user "app", database "tw"', True),
        (f'{_AT} FATAL: permission denied for database "tw" DETAIL: User does not have CONNECT '
         "privilege.", True),
        (f"{_AT} fe_sendauth: no password supplied", True),
        (f'{_AT} FATAL: database "template0" is not currently accepting connections', True),
        (f"{_AT} FATAL: sorry, too many clients already", False),
        (f"{_AT} FATAL: the database system is starting up", False),
        (f"{_AT} Connection refused Is the server running on that host and accepting TCP/IP "
         "connections?", False),
        (f"{_AT} timeout expired", False),
        (f'{_AT} FATAL: la base de données « tw » n\'existe pas', False),  # localized: waited on
    ],
)  # fmt: skip
def test_only_refusals_no_waiting_fixes_are_permanent(message: str, permanent: bool) -> None:
    """The refusals the connection tests cannot provoke (the shared server trusts everyone)."""
    assert is_permanent_refusal(message) is permanent


# -- a server that is away: listen, 503, recover -----------------------------------------------


@postgres_only
async def test_serve_listens_while_postgres_is_away_and_recovers_when_it_is_back(
    stores: StoreFactory, tmp_path: Path
) -> None:
    port = _free_port()
    url = f"{_with(stores.new_url(), port=port)}&open_timeout_s=3"
    out = tmp_path / "serve.log"
    proc = _spawn(url, "serve", out)
    try:
        base = await _base_url(proc, out)
        assert "not reachable yet" in out.read_text()
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            _assert_503(await http.get("/api/tasks"))
            _assert_503(await http.get("/healthz"))
            r = await http.post(
                "/api/tasks",
                json={"action_kind": "command", "args": {"argv": ["true"]}},
            )
            _assert_503(r)
            async with _proxy(port, _pg_target()):  # the server is back

                async def answers() -> bool:
                    return (await http.get("/api/tasks")).status_code == 200

                await wait_until(answers, timeout=90, what="serve to open the store")
                health = await http.get("/healthz")
                assert health.status_code == 200 and health.json()["store"] == "postgresql"
                assert (await http.get("/api/tasks")).json()["tasks"] == []
                os.killpg(proc.pid, signal.SIGTERM)
                code = await _exit_code(proc, 60)
    finally:
        _stop(proc)
    assert code == 0, out.read_text()


@postgres_only
async def test_a_permanent_refusal_found_after_listening_ends_serve(
    backend: str, tmp_path: Path
) -> None:
    """The server comes back, but the database does not exist: serve stops then, exit 1."""
    port = _free_port()
    url = _with(PG_URL, port=port, dbname="taskward_no_such_db")
    url = f"{url}{'&' if '?' in url else '?'}open_timeout_s=3"
    out = tmp_path / "serve.log"
    proc = _spawn(url, "serve", out)
    try:
        base = await _base_url(proc, out)
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            _assert_503(await http.get("/api/tasks"))
        async with _proxy(port, _pg_target()):
            code = await _exit_code(proc, 90)
    finally:
        _stop(proc)
    output = out.read_text()
    assert code == 1, output
    assert 'database "taskward_no_such_db" does not exist' in output, output


# -- the banner --------------------------------------------------------------------------------


def test_the_printed_curl_sends_the_token_of_the_shell_and_never_prints_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    secret = "banner-token-0123456789"
    config = HttpConfig.from_env({"TASKWARD_API_TOKENS": f"alice:{secret}:*"})
    _announce(
        "serve",
        "http://127.0.0.1:8080",
        "sqlite:///taskward.db",
        config,
        example_allowed=True,
        worker=WorkerConfig(),
    )
    printed = capsys.readouterr().out
    assert secret not in printed
    [line] = [line for line in printed.splitlines() if "first task:" in line]
    command = line.split("first task:", 1)[1].strip()
    assert command.startswith("curl ")
    # The shell's own reading of the line, with TOKEN set: each argument printed on its own.
    argv = subprocess.run(
        ["bash", "-c", f"printf '%s\\n' {command.removeprefix('curl ')}"],
        env={"TOKEN": "from-the-shell", "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert "Authorization: Bearer from-the-shell" in argv, argv
    assert argv[argv.index("Authorization: Bearer from-the-shell") - 1] == "-H"
    assert "'Authorization: Bearer $TOKEN'" not in command
