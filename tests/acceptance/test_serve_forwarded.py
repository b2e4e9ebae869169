"""``taskward serve`` counts failed authentications by the peer address: a forwarded header
chooses nothing unless ``TASKWARD_TRUSTED_PROXIES`` names the proxy it came through (uvicorn
alone would trust one from loopback)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(tmp_path: Path, port: int, **extra: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKWARD_")}
    env.update(TASKWARD_API_TOKENS="ops:s3cret-token-0123456789:read", **extra)
    url = f"sqlite:///{tmp_path / 'fwd.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "taskward.cli.main", "--db", url, "serve", "--port", str(port)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            assert proc.poll() is None, "taskward serve exited"
            assert time.monotonic() < deadline, "taskward serve did not listen"
            time.sleep(0.1)


def guesses(port: int, count: int) -> list[int]:
    codes = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
        for n in range(count):
            answer = client.get(
                "/api/tasks",
                headers={"Authorization": f"Bearer wrong-{n}", "X-Forwarded-For": f"203.0.113.{n}"},
            )
            codes.append(answer.status_code)
    return codes


def test_a_forwarded_header_does_not_escape_the_limit(tmp_path: Path) -> None:
    port = free_port()
    proc = serve(tmp_path, port)
    try:
        codes = guesses(port, 12)
        assert codes[:10] == [401] * 10 and codes[10:] == [429, 429], codes
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_named_proxy_forwards_the_client_address(tmp_path: Path) -> None:
    port = free_port()
    proc = serve(tmp_path, port, TASKWARD_TRUSTED_PROXIES="127.0.0.1")
    try:
        assert guesses(port, 12) == [401] * 12  # twelve clients, one failure each
    finally:
        proc.terminate()
        proc.wait(timeout=30)
